"""Training ranks as Ray actors: the core and its satellites placed by a placement group.

``RayTrainingGroup`` starts one actor per rank (rank 0 the core, which owns the only
optimizer state), each in its own bundle of a placement group (``PACK`` on one machine,
``SPREAD`` across nodes), and joins them into one ``torch.distributed`` group
(:class:`~gyre_env.scheduler.core.TrainingGroup`: gloo here, NCCL on GPUs). ``step``
hands each rank its share of the batch; gradients reduce to the core, which steps and
broadcasts the new weights; ``beat`` runs the heartbeat (``STALE_WEIGHTS_DETECTED``).

With Ray absent this module fails at use with the pip extra to install; in CI Ray runs
locally (``ray.init(num_cpus=...)``, ``RAY_AUTH_MODE=disabled``). The serving side (the
engines behind the proxy) stays in the driver's process here.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

from gyre_env._optional import require


@dataclass(kw_only=True)
class RayGroupConfig:
    """Where the training ranks go."""

    ranks: int = 2
    cpus_per_rank: float = 1.0
    gpus_per_rank: float = 0.0
    strategy: str = "PACK"
    """Placement-group strategy: ``PACK`` (one node when it fits), ``SPREAD``,
    ``STRICT_SPREAD`` (one rank per node)."""
    backend: str = "gloo"
    timeout_s: float = 300.0
    staleness_bound: int = 4


class _Rank:
    """One rank's actor body: a trainer and its place in the group."""

    def __init__(self, model_dir: str, rank: int, world: int, init_method: str, cfg: dict):
        import torch

        from gyre_env.scheduler.core import GroupConfig, TrainingGroup
        from gyre_env.scheduler.versions import HeartbeatConfig
        from gyre_env.trainers.torch_backend import TorchTrainer

        torch.set_num_threads(1)
        self.group = TrainingGroup(
            TorchTrainer(model_dir),
            GroupConfig(
                rank=rank, world_size=world, init_method=init_method, backend=cfg["backend"],
                timeout_s=cfg["timeout_s"],
                heartbeat=HeartbeatConfig(staleness_bound=cfg["staleness_bound"]),
            ),
        )  # fmt: skip

    def step(self, share, pull: bool = True) -> dict:
        return self.group.step(share, pull=pull)

    def beat(self) -> list[int]:
        return self.group.beat(force=True)

    def version(self) -> int:
        return self.group.version

    def weights(self) -> dict:
        return {k: v.clone() for k, v in self.group.trainer.named_parameters()}

    def has_optimizer_state(self) -> bool:
        opt = self.group.trainer.optimizer
        return opt is not None and bool(opt.state)

    def close(self) -> None:
        self.group.close()


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
            "backend": cfg.backend,
            "timeout_s": cfg.timeout_s,
            "staleness_bound": cfg.staleness_bound,
        }
        self.ranks = [
            actor.options(
                num_cpus=cfg.cpus_per_rank,
                num_gpus=cfg.gpus_per_rank,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=r
                ),
            ).remote(str(model_dir), r, cfg.ranks, init, knobs)  # fmt: skip
            for r in range(cfg.ranks)
        ]
        self._ray = ray

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


def _rendezvous() -> str:
    """``tcp://ip:port`` of a free port on the node this runs on (the core's)."""
    import ray

    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return f"tcp://{ray.util.get_node_ip_address()}:{port}"
