"""Cells on one machine: N embedded engines behind one proxy, N torch trainers, one board.

``LocalCells`` builds what the elastic driver runs on when there is no Ray: every cell
an engine (a replica of the proxy's router) and a trainer object of the same model in
this process; cell 0 is the core (its trainer owns the optimizer). Roles start as the
policy asks (``initial_roles(n)`` when it has one, else all ROLLOUT).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre_env.scheduler.cell import Cell, SwitchConfig
from gyre_env.scheduler.policy import Role, SwitchCosts
from gyre_env.scheduler.versions import WeightBoard


@dataclass(kw_only=True)
class LocalCellsConfig:
    """The cells' engines and trainers."""

    cells: int = 2
    max_batch_size: int = 16
    """Concurrent requests one cell serves (its ``capacity`` for the policy)."""
    context_length: int | None = None
    switch_prior_s: float = 0.1
    """Prior of each switch direction until measured (the published 8.52 s / 3.46 s are
    GPU-cluster figures; the tiny model on a CPU switches in tens of milliseconds)."""
    switch: SwitchConfig | None = None


class LocalCells:
    """Build with :meth:`open`, use ``cells`` / ``proxy``, then :meth:`close`."""

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer,
        config: LocalCellsConfig,
        *,
        sink=None,
        trainer_factory=None,
        proxy_config=None,
        service_factory=None,
        engine_factory=None,
        transport=None,
    ):
        """``trainer_factory(model_dir)``: a trainer per cell (default ``TorchTrainer``);
        ``service_factory(engines)``: a started service with ``.proxy`` and ``stop()``
        (e.g. the agents' ``ModelService``) instead of a bare proxy server;
        ``engine_factory(configs)``: the cells' engines from their ``EmbeddedEngineConfig``
        fields (default: embedded engines in this process); ``transport``: the cells' KV
        transport (default: an in-process copy)."""
        self.model_dir, self.tokenizer, self.config = Path(model_dir), tokenizer, config
        self.sink, self.trainer_factory, self.proxy_config = sink, trainer_factory, proxy_config
        self.service_factory, self.service = service_factory, None
        self.engine_factory, self.transport = engine_factory, transport
        self.cells: list[Cell] = []
        self.proxy = None
        self.costs = SwitchCosts(
            to_training_s=config.switch_prior_s, to_rollout_s=config.switch_prior_s
        )
        self.board = WeightBoard()
        self.core = None
        """The core step the driver uses: None, the driver builds one over the cells'
        trainers in this process (``RayCells`` sets a Ray one)."""
        self.remote = False
        """Whether the cells' trainers live outside this process (Ray ranks): the newest
        weights are then the board's, not a local trainer's."""

    def open(self, initial_roles: list[Role] | None = None) -> LocalCells:
        from gyre_env.engines.embedded import EmbeddedEngine, EmbeddedEngineConfig
        from gyre_env.proxy.server import ProxyConfig, ProxyServer

        cfg = self.config
        if cfg.cells < 1:
            raise ValueError(f"cells must be >= 1, got {cfg.cells}")
        make_trainer = self.trainer_factory or _torch_trainer
        configs = [
            {
                "model_path": str(self.model_dir),
                "name": f"cell{i}",
                "max_batch_size": cfg.max_batch_size,
                "context_length": cfg.context_length,
            }  # fmt: skip
            for i in range(cfg.cells)
        ]
        if self.engine_factory is not None:
            engines = list(self.engine_factory(configs))
        else:
            engines = [EmbeddedEngine(EmbeddedEngineConfig(**c)) for c in configs]
        if self.service_factory is not None:
            self.service = self.service_factory(engines)
            self.proxy = self.service.proxy
        else:
            self.proxy = ProxyServer(
                self.proxy_config or ProxyConfig(probe_interval_s=0.02, ping_interval_s=1.0),
                engines=engines, tokenizer=self.tokenizer, sink=self.sink,
            ).start()  # fmt: skip
        roles = initial_roles or [Role.ROLLOUT] * cfg.cells
        lock = self.proxy.call(_new_lock())  # bound to the proxy's loop, shared by the cells
        for i, engine in enumerate(engines):
            cell = Cell(
                i, engine, make_trainer(self.model_dir), board=self.board,
                router=self.proxy.core.router, costs=self.costs, config=cfg.switch, role=roles[i],
                migration_lock=lock, transport=self.transport,
            )  # fmt: skip
            self.cells.append(cell)
            self.proxy.call(cell.prepare())
        return self

    def load_core(self, trainer_state: dict, version: int) -> None:
        """Continue from a checkpoint (after :meth:`open`): the core trainer takes
        ``trainer_state`` (model, optimizer, version), its weights are published at
        ``version`` and every serving engine loads them; satellites pull them at their
        next step, a training cell's engine when it goes back to rollout."""
        core = self.cells[0]
        core.trainer.load_state_dict(trainer_state)
        self.serve_version(version, dict(core.trainer.named_parameters()), cells=[core])

    def serve_version(self, version: int, tensors: dict, cells=None) -> None:
        """Publish ``tensors`` as ``version`` on the board; the trainers of ``cells``
        (default: all) hold it already; every serving engine loads it."""
        from gyre_env.scheduler.policy import Role

        self.board.publish(version, tensors)
        for cell in self.cells if cells is None else cells:
            cell.trainer_version = version
        for cell in self.cells:
            if cell.role is Role.ROLLOUT:
                self.proxy.call(cell.sync_engine(), timeout=600)

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
        elif self.proxy is not None:
            self.proxy.stop()
        self.service = self.proxy = None
        for cell in self.cells:
            cell.engine.close()

    def __enter__(self) -> LocalCells:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _torch_trainer(model_dir: Path):
    from gyre_env.trainers.torch_backend import TorchTrainer

    return TorchTrainer(model_dir)


async def _new_lock():
    import asyncio

    return asyncio.Lock()
