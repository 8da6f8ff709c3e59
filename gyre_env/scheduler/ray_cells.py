"""Training ranks as Ray actors: the core and its satellites placed by a placement group.

``RayTrainingGroup`` starts one actor per rank (rank 0 the core, which owns the only
optimizer state), each in its own bundle of a placement group (``PACK`` on one machine,
``SPREAD`` across nodes), and joins them into one ``torch.distributed`` group
(:class:`~gyre_env.scheduler.core_cell.TrainingGroup`: gloo here, NCCL on GPUs). ``step``
hands each rank its share of the batch; gradients reduce to the core, which steps and
broadcasts the new weights; ``beat`` runs the heartbeat (``STALE_WEIGHTS_DETECTED``).

``RayCells`` is the elastic pool on Ray (``gyre train --elastic --cells N --ray auto``):
one placement group for the whole pool, a bundle per cell, each cell's trainer the rank
actor in its bundle (``RankTrainer`` is the handle the cell holds; ``RayCoreStep`` is the
driver's step: the training cells' ranks get shares, the serving ones an empty share and
no pull, the core steps). Each cell's engine is an actor too (``RayEngine``, in the same
bundle as its rank: ``engines="actors"``, the default), served to the agents by the
driver's proxy; KV migration between them moves the bytes through Ray's object store.
``engines="driver"`` keeps the engines in the driver's process. The agents and their
sandboxes stay with the driver (the sandboxes go to the Docker daemon it names).

With Ray absent this module fails at use with the pip extra to install; in CI Ray runs
locally (``ray.init(num_cpus=...)``, ``RAY_AUTH_MODE=disabled``).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gyre_env._optional import require
from gyre_env.scheduler.local_cells import LocalCells


@dataclass(kw_only=True)
class RayGroupConfig:
    """Where the training ranks go."""

    ranks: int = 2
    cpus_per_rank: float = 1.0
    gpus_per_rank: float = 0.0
    strategy: str = "PACK"
    """Placement-group strategy: ``PACK`` (one node when it fits), ``SPREAD``,
    ``STRICT_SPREAD`` (one rank per node)."""
    backend: str = "auto"
    """The ranks' ``torch.distributed`` backend: ``nccl`` or ``gloo``; ``auto``: NCCL
    where the rank's actor sees CUDA (a GPU bundle on a GPU node), else gloo."""
    timeout_s: float = 300.0
    staleness_bound: int = 4
    trainer: str = "torch"
    """Every rank's training backend: ``torch`` (``TorchTrainer``) or ``megatron``
    (``MegatronTrainer``: the rank joins the group first, so megatron's parallel state
    spans it; its grad buffers reduce to the core, whose optimizer alone steps)."""
    trainer_configs: tuple = field(default_factory=tuple)
    """Positional configs after the model folder for every rank's trainer
    (``(optim_config, loss_config)``; empty: its defaults)."""
    engines: str = "actors"
    """``actors``: every cell's engine is a Ray actor in its cell's bundle (``RayEngine``);
    ``driver``: the engines run in the driver's process."""

    def __post_init__(self):
        if self.trainer not in RANK_TRAINERS:
            raise ValueError(f"trainer must be one of {RANK_TRAINERS}, got {self.trainer!r}")
        if self.backend not in RANK_BACKENDS:
            raise ValueError(f"backend must be one of {RANK_BACKENDS}, got {self.backend!r}")
        if self.engines not in ENGINE_PLACEMENTS:
            raise ValueError(f"engines must be one of {ENGINE_PLACEMENTS}, got {self.engines!r}")
        if self.engines == "actors" and self.gpus_per_rank > 1:
            raise ValueError(
                f"engines='actors' shares one device between a cell's rank and its engine "
                f"(half of it each); gpus_per_rank={self.gpus_per_rank:g} needs "
                "engines='driver' or SGLang engines"
            )

    @property
    def gpu_share(self) -> float:
        """GPUs the rank actor (and the engine actor) of a cell each request: with engine
        actors, half the bundle's device each, so that Ray gives both the same one."""
        return self.gpus_per_rank / 2 if self.engines == "actors" else self.gpus_per_rank


ENGINE_PLACEMENTS = ("actors", "driver")
RANK_TRAINERS = ("torch", "megatron")
RANK_BACKENDS = ("auto", "gloo", "nccl")


class _Rank:
    """One rank's actor body: a trainer and its place in the group."""

    def __init__(self, model_dir: str, rank: int, world: int, init_method: str, cfg: dict):
        import torch

        from gyre_env.scheduler.core_cell import GroupConfig, TrainingGroup, join_group
        from gyre_env.scheduler.versions import HeartbeatConfig

        torch.set_num_threads(1)
        backend = cfg["backend"]
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        config = GroupConfig(
            rank=rank, world_size=world, init_method=init_method, backend=backend,
            timeout_s=cfg["timeout_s"],
            heartbeat=HeartbeatConfig(staleness_bound=cfg["staleness_bound"]),
        )  # fmt: skip
        self.backend = cfg.get("trainer", "torch")
        if self.backend == "megatron":  # first: megatron's parallel state spans the ranks
            join_group(config)  # (a torch trainer built in a running group shards with FSDP2)
        trainer = _rank_trainer(self.backend, model_dir, tuple(cfg.get("trainer_configs", ())))
        self.group = TrainingGroup(trainer, config)
        if self.group.trainer.optimizer is None:  # a satellite: offload/onload find no state
            self.group.trainer.optimizer = _NoOptimizer()
            if self.backend == "megatron":
                trainer.megatron_optimizer = False  # nothing of megatron's to offload

    def step(self, share, pull: bool = True) -> dict:
        return self.group.step(share, pull=pull)

    def beat(self) -> list[int]:
        return self.group.beat(force=True)

    def version(self) -> int:
        return self.group.version

    def placement(self) -> dict:
        """Where this rank trains: its Ray node and GPUs, its trainer's device and the
        group's backend."""
        from gyre_env.engines.ray_engine import actor_placement

        return {
            **actor_placement(),
            "device": str(self.group.trainer.device),
            "backend": self.group.config.backend,
        }

    def weights(self) -> dict:
        return {k: v.clone() for k, v in self.group.trainer.named_parameters()}

    def load_named_parameters(self, tensors: dict) -> None:
        """Weights from the board (a cell that served meanwhile): this rank is current."""
        self.group.trainer.load_named_parameters(tensors)
        self.group.version = self.group.core_version

    def onload(self) -> None:
        self.group.trainer.onload()

    def offload(self) -> None:
        self.group.trainer.offload()

    def save_pretrained(self, folder: str) -> str:
        # this rank writes (a megatron trainer's default writer is global rank 0 only)
        return str(self.group.trainer.save_pretrained(folder, write=True))

    def state_dict(self) -> dict:
        """The trainer's state (the core's holds the only optimizer state)."""
        return self.group.trainer.state_dict()

    def resume(self, state: dict | None, weights: dict | None, version: int) -> None:
        """Continue from a checkpoint: the core loads ``state`` (model, optimizer), a
        satellite the core's ``weights``; every rank counts ``version`` steps taken."""
        if state is not None:
            self.group.trainer.load_state_dict(state)
        else:
            self.group.trainer.load_named_parameters(weights)
        self.group.version = self.group.core_version = version

    def has_optimizer_state(self) -> bool:
        opt = self.group.trainer.optimizer
        return opt is not None and bool(opt.state)

    def close(self) -> None:
        self.group.close()


def _rank_trainer(backend: str, model_dir: str, configs: tuple):
    """A rank's trainer, its KL reference frozen now (``with_reference``). A Megatron
    rank's optimizer is never sharded over the ranks: the core holds all of it."""
    from gyre_env.scheduler.core_cell import with_reference

    if backend == "megatron":
        import dataclasses

        from gyre_env.trainers.megatron import MegatronTrainer as trainer_class
        from gyre_env.trainers.megatron import MegatronTrainerConfig

        first = configs[0] if configs else MegatronTrainerConfig()
        configs = (dataclasses.replace(first, distributed_optimizer=False), *configs[1:])
    else:
        from gyre_env.trainers.torch_backend import TorchTrainer as trainer_class
    return with_reference(trainer_class(model_dir, *configs))


class _NoOptimizer:
    """A satellite's optimizer: no state (the core's is the only one)."""

    state: dict = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: ``TrainingGroup.step`` clears the gradients itself."""


class RayTrainingGroup:
    """The core + satellites as Ray actors (see the module docstring)."""

    def __init__(self, model_dir: str, config: RayGroupConfig | None = None):
        ray = require("ray", "Ray placement")
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.config = cfg = config or RayGroupConfig()
        bundle = {
            "CPU": cfg.cpus_per_rank,
            **({"GPU": cfg.gpus_per_rank} if cfg.gpus_per_rank else {}),
        }
        self.pg = placement_group([dict(bundle) for _ in range(cfg.ranks)], strategy=cfg.strategy)
        ray.get(self.pg.ready(), timeout=cfg.timeout_s)
        actor = ray.remote(_Rank)
        on_core = PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=0
        )
        where = ray.remote(_rendezvous).options(num_cpus=0, scheduling_strategy=on_core)
        init = ray.get(where.remote(), timeout=cfg.timeout_s)  # on the core's node
        knobs = {
            "trainer": cfg.trainer,
            "backend": cfg.backend,
            "timeout_s": cfg.timeout_s,
            "staleness_bound": cfg.staleness_bound,
            "trainer_configs": tuple(cfg.trainer_configs),
        }
        self.ranks = [
            actor.options(
                num_cpus=cfg.cpus_per_rank,
                num_gpus=cfg.gpu_share,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=r
                ),
            ).remote(str(model_dir), r, cfg.ranks, init, knobs)  # fmt: skip
            for r in range(cfg.ranks)
        ]
        self._ray = ray
        # built now (the trainer, megatron's parallel state): neither a first switch's
        # timing nor a first step pays for the actors' start, and a failing one fails here
        ray.get([a.version.remote() for a in self.ranks], timeout=cfg.timeout_s)

    def step(self, shares: Sequence[list], pull: Sequence[bool] | None = None) -> list[dict]:
        """One optimizer step: ``shares[r]`` to rank ``r`` (gradients reduce to the core)."""
        pull = pull or [True] * len(self.ranks)
        calls = [a.step.remote(s, p) for a, s, p in zip(self.ranks, shares, pull, strict=True)]
        return self._ray.get(calls, timeout=self.config.timeout_s)

    def beat(self) -> list[int]:
        """The heartbeat on every rank; the stale ranks (synced now)."""
        return self._ray.get([a.beat.remote() for a in self.ranks])[0]

    def call(self, method: str) -> list:
        """``method`` on every rank (``version``, ``weights``, ``has_optimizer_state``)."""
        return self._ray.get([getattr(a, method).remote() for a in self.ranks])

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        try:
            self._ray.get([a.close.remote() for a in self.ranks], timeout=60)
        finally:
            for a in self.ranks:
                self._ray.kill(a)
            remove_placement_group(self.pg)


class RankTrainer:
    """What a cell calls on its trainer, on rank ``rank``'s actor."""

    def __init__(self, group: RayTrainingGroup, rank: int):
        self.group, self.rank = group, rank
        self.actor = group.ranks[rank]

    def _call(self, method: str, *args):
        ray = self.group._ray
        return ray.get(
            getattr(self.actor, method).remote(*args), timeout=self.group.config.timeout_s
        )

    def onload(self) -> None:
        self._call("onload")

    def offload(self) -> None:
        self._call("offload")

    def load_named_parameters(self, tensors: dict) -> None:
        self._call("load_named_parameters", tensors)

    def named_parameters(self):
        return iter(self._call("weights").items())

    def save_pretrained(self, folder) -> str:
        """Written on the rank's node (the same machine in local mode)."""
        return self._call("save_pretrained", str(folder))

    def state_dict(self) -> dict:
        return self._call("state_dict")


class RayCoreStep:
    """The elastic driver's optimizer step on the rank actors (``CoreStep``'s interface):
    every rank takes part, the training cells' ranks with a share and a pull."""

    def __init__(self, group: RayTrainingGroup, *, version: int = 0):
        self.group, self.version = group, version

    def step(
        self, units: Sequence, satellites: Sequence = (), kind: str = "rl", *, core_share=True
    ) -> dict:
        from gyre_env.scheduler.core_cell import split_units

        if kind != "rl":
            raise ValueError("the Ray ranks take RL steps only")
        t0 = time.perf_counter()
        ranks = ([0] if core_share else []) + [s.rank for s in satellites]
        if not ranks:
            raise ValueError("a step needs the core's share or at least one satellite")
        shares: list[list] = [[] for _ in self.group.ranks]
        for rank, share in zip(ranks, split_units(units, len(ranks)), strict=True):
            shares[rank] = share
        pull = [r == 0 or r in ranks for r in range(len(shares))]
        parts = self.group.step(shares, pull)
        self.version += 1
        seconds = time.perf_counter() - t0
        tokens = sum(p["tokens"] for p in parts)
        return {
            "loss": sum(p["loss"] for p in parts), "tokens": tokens,
            # loss tokens past the loss's max_staleness, weighted 0 (as ``CoreStep`` sums)
            "stale_tokens": sum(p.get("stale_tokens", 0.0) for p in parts),
            "grad_norm": parts[0]["grad_norm"], "lr": parts[0]["lr"], "step_s": seconds,
            "shares": len(ranks), "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        }  # fmt: skip


class RayCells(LocalCells):
    """``LocalCells`` whose trainers are the ranks of one ``RayTrainingGroup``: a
    placement group for the whole pool, a bundle per cell (``ray.init`` first, e.g.
    :func:`connect`). Hand ``core`` to the ``ElasticDriver``."""

    def __init__(self, model_dir, tokenizer, config, *, ray: RayGroupConfig | None = None, **kw):
        super().__init__(model_dir, tokenizer, config, **kw)
        self.ray_config = ray or RayGroupConfig()
        self.group: RayTrainingGroup | None = None
        self.core: RayCoreStep | None = None
        self.remote = True

    def open(self, initial_roles=None) -> RayCells:
        import dataclasses

        cfg = dataclasses.replace(self.ray_config, ranks=self.config.cells)
        self.group = RayTrainingGroup(str(self.model_dir), cfg)
        handles = iter(RankTrainer(self.group, r) for r in range(cfg.ranks))
        self.trainer_factory = lambda _model_dir: next(handles)
        if cfg.engines == "actors":
            from gyre_env.scheduler.migration import CopyTransport

            self.engine_factory = self._engine_actors
            self.transport = CopyTransport(name="ray object store (via the driver)")
        self.core = RayCoreStep(self.group, version=self.board.version)
        super().open(initial_roles)
        return self

    def _engine_actors(self, configs: list[dict]) -> list:
        """Cell ``i``'s engine as an actor in bundle ``i`` (its trainer rank's), sharing
        the bundle's CPUs (and GPUs) with the rank."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from gyre_env.engines.ray_engine import RayEngine, RayEngineOptions

        cfg = self.group.config
        return RayEngine.launch(
            (
                config,
                RayEngineOptions(
                    num_gpus=cfg.gpu_share,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self.group.pg, placement_group_bundle_index=i
                    ),
                    timeout_s=cfg.timeout_s,
                ),
            )
            for i, config in enumerate(configs)
        )

    def load_core(self, trainer_state: dict, version: int) -> None:
        """``LocalCells.load_core`` on the rank actors: the core rank takes
        ``trainer_state``, every satellite rank its weights; all count ``version``."""
        ray, ranks = self.group._ray, self.group.ranks
        timeout = self.group.config.timeout_s
        ray.get(ranks[0].resume.remote(trainer_state, None, version), timeout=timeout)
        weights = ray.get(ranks[0].weights.remote(), timeout=timeout)
        ray.get([a.resume.remote(None, weights, version) for a in ranks[1:]], timeout=timeout)
        self.core.version = version
        self.serve_version(version, weights)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.group is not None:
                self.group.close()
                self.group = None


def cell_devices(cells: int) -> dict:
    """``RayGroupConfig`` fields for ``cells`` cells on the connected cluster: a GPU per
    cell where it has at least one per cell (its rank and engine share it; NCCL between
    the ranks), CPU ranks over gloo where it has none. Fewer GPUs than cells is an error
    (a cell on a CPU beside GPU cells would hold back every step), and so is fewer CPUs
    than the ranks reserve (the placement group would wait forever)."""
    import ray

    from gyre_env.config import ConfigError

    have = ray.cluster_resources()
    cpus, gpus = have.get("CPU", 0.0), have.get("GPU", 0.0)
    if cpus < cells * RayGroupConfig.cpus_per_rank:  # the placement group would never be ready
        raise ConfigError(
            f"--cells {cells}: the Ray cluster has {cpus:g} CPUs, each cell's rank needs "
            f"{RayGroupConfig.cpus_per_rank:g}; use --cells {int(cpus)}, add nodes, or start "
            f"Ray with more (ray start --head --num-cpus={cells})"
        )
    if gpus == 0:
        return {"gpus_per_rank": 0.0, "backend": "gloo"}
    if gpus < cells:
        raise ConfigError(
            f"--cells {cells}: the Ray cluster has {gpus:g} GPUs, one per cell is needed; "
            f"use --cells {int(gpus)} or add GPU nodes (ray start --address=HEAD)"
        )
    return {"gpus_per_rank": 1.0, "backend": "auto"}


def connect(address: str = "auto", **init_kwargs):
    """``ray.init`` for ``--ray ADDRESS``: ``auto`` joins the running cluster (``ray
    start`` on this node, or ``RAY_ADDRESS``) and starts a local one when there is none;
    ``local`` always starts a local one; else a cluster address (``host:6379``)."""
    ray = require("ray", "--ray (cells as Ray actors)")
    if ray.is_initialized():
        return ray
    if address == "local":
        ray.init(**init_kwargs)
    elif address == "auto":
        try:
            ray.init(address="auto", **init_kwargs)
        except ConnectionError:
            ray.init(**init_kwargs)
    else:
        _check_reachable(address)
        try:
            ray.init(address=address, **init_kwargs)
        except (ConnectionError, RuntimeError) as e:  # something answers, not Ray's GCS
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise _not_a_head(address, why) from None
    return ray


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A clear error for a cluster address nothing answers at (``ray.init`` would retry
    for minutes, printing GCS timeouts)."""
    from gyre_env.config import ConfigError

    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(
            f"--ray {address!r}: expected auto, local or HOST:PORT (e.g. 10.0.0.1:6379)"
        )
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError as e:
        raise ConfigError(
            f"--ray {address}: no Ray cluster answers there ({e}); start its head with "
            f"`ray start --head --port={port}` on {host}, or use --ray local"
        ) from None
    # Ray's head is a gRPC server: it opens HTTP/2 with a SETTINGS frame. A reset or a
    # timeout leaves what came so far as the answer.
    head = b""
    with conn, contextlib.suppress(OSError):
        conn.sendall(_H2_PREFACE)
        while len(head) < 9 and (chunk := conn.recv(9 - len(head))):
            head += chunk
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        raise _not_a_head(address, f"no gRPC: it answered {head[:16]!r}")


def _not_a_head(address: str, why: str):
    """The error for an address where something answers that is not a Ray head."""
    from gyre_env.config import ConfigError

    return ConfigError(
        f"--ray {address}: something answers there, but not a Ray cluster's head ({why}); "
        "give the address `ray start --head` printed (its GCS port, 6379 by default), or "
        "use --ray local"
    )


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""An HTTP/2 client's connection preface and an empty SETTINGS frame."""
_H2_SETTINGS = 0x04
"""The frame type every HTTP/2 server's connection preface starts with."""


def _rendezvous() -> str:
    """``tcp://ip:port`` of a free port on the node this runs on (the core's)."""
    import ray

    ip = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
        sock.bind((ip, 0))  # the address rank 0's store will listen on, and nothing else
        port = sock.getsockname()[1]
    host = f"[{ip}]" if ":" in ip else ip
    return f"tcp://{host}:{port}"
