"""The core cell and its training satellites: one optimizer, gradients reduced to it.

The core holds the master weights and the only optimizer state. Every training cell
(the core included) computes gradients of the step's loss on its share of the batch,
normalized by the token count of the *whole* batch, so that the sum of the shares'
gradients is exactly the gradient of one step over everything; the shares are summed at
the core, which clips, steps and publishes the next version. Satellites never step (their
trainer's optimizer is dropped), and pull the published weights before their next share.

Two ways to reduce: :class:`CoreStep` sums the gradients of trainers in this process (the
elastic driver's cells), :class:`TrainingGroup` runs one rank of a ``torch.distributed``
group (gloo here, NCCL on GPUs: rank 0 is the core) with ``reduce`` to the core and a
``broadcast`` of the new weights. Its heartbeat gathers every rank's weight version; a rank
lagging past the staleness bound is reported (``STALE_WEIGHTS_DETECTED``) and synced.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gyre_env.scheduler.versions import Heartbeat, HeartbeatConfig


def _torch():
    from gyre_env._optional import require

    return require("torch", "the elastic scheduler")


def share_tensors(trainer, units: Sequence) -> list[dict]:
    """The units' packed tensors on ``trainer``'s device, built once per step: both the
    share's normalizer and its ``accumulate_grads`` read them."""
    return [u.tensors(trainer.device) for u in units]


def share_normalizer(trainer, tensors: list[dict], kind: str, version: int) -> float:
    """This share's part of the step normalizer (sums over shares to the whole batch's);
    ``tensors``: its units' (``share_tensors``)."""
    from gyre_env.trainers.losses import step_normalizer

    rl = kind == "rl"
    agg = trainer.loss.aggregation if rl else "token"
    if not tensors:
        return 0.0
    limit = trainer.loss.max_staleness if rl else None
    return float(step_normalizer(tensors, agg, current_version=version, max_staleness=limit))


def with_reference(trainer):
    """``trainer``, its KL reference set now when its loss has ``kl_coef > 0``: a cell's
    trainer is built from the warm-start weights, so every rank freezes the same reference
    (set at its first step instead, a cell that served first would freeze newer weights)."""
    if trainer.loss.kl_coef > 0 and trainer.reference is None:
        trainer.set_reference()
    return trainer


def split_units(units: Sequence, shares: int) -> list[list]:
    """``units`` dealt into ``shares`` lists of about equal token counts (largest first)."""
    out: list[list] = [[] for _ in range(shares)]
    load = [0] * shares
    for u in sorted(units, key=len, reverse=True):
        i = load.index(min(load))
        out[i].append(u)
        load[i] += len(u)
    return out


class CoreStep:
    """One optimizer step over the core trainer and in-process satellite trainers, each
    computing its share through ``accumulate_grads`` into its gradients (the torch
    backend's ``.grad``, Megatron's DDP buffers), summed into the core's through
    ``grad_buffers`` and applied by its ``apply_grads`` (the ``Trainer`` protocol)."""

    def __init__(self, core_trainer, *, version: int = 0):
        self.core = core_trainer
        self.version = version
        """The version of the core's weights (optimizer steps taken)."""

    def step(
        self, units: Sequence, satellites: Sequence = (), kind: str = "rl", *, core_share=True
    ) -> dict:
        """Split ``units`` over the core and ``satellites`` (trainers holding the core's
        current weights), sum their gradients at the core, step; returns metrics.
        ``core_share=False``: the core cell is serving, so only satellites compute (the
        core still owns and applies the optimizer)."""
        torch = _torch()
        t0 = time.perf_counter()
        if not core_share and not satellites:
            raise ValueError("a step needs the core's share or at least one satellite")
        trainers = [self.core, *satellites] if core_share else list(satellites)
        shares = split_units(units, len(trainers))
        tensors = [share_tensors(t, s) for t, s in zip(trainers, shares, strict=True)]
        norm = sum(
            share_normalizer(t, ts, kind, self.version)
            for t, ts in zip(trainers, tensors, strict=True)
        )
        norm = max(norm, 1.0)
        for t in {id(t): t for t in (self.core, *trainers)}.values():
            t.zero_grads()
        sums = {"loss": 0.0, "tokens": 0.0, "stale_tokens": 0.0}
        for i, (trainer, share) in enumerate(zip(trainers, shares, strict=True)):
            part = trainer.accumulate_grads(share, kind, norm, self.version, tensors=tensors[i])
            tensors[i] = None  # this share's inputs are done with
            # stale_tokens: loss tokens past the loss's max_staleness, weighted 0
            sums = {k: sums[k] + part.get(k, 0.0) for k in sums}
        with torch.no_grad():
            for sat, share in zip(trainers, shares, strict=True):
                if sat is self.core or not share:  # no share: no gradients to add
                    continue
                for mine, theirs in zip(self.core.grad_buffers(), sat.grad_buffers(), strict=True):
                    mine += theirs
                sat.zero_grads()
        metrics = self.core.apply_grads()
        self.version += 1
        seconds = time.perf_counter() - t0
        return {
            **sums, **metrics, "step_s": seconds, "shares": len(trainers),
            "tokens_per_s": sums["tokens"] / seconds if seconds > 0 else 0.0,
        }  # fmt: skip


@dataclass(kw_only=True)
class GroupConfig:
    """One rank's place in a core + satellites ``torch.distributed`` group."""

    rank: int
    world_size: int
    init_method: str
    """``tcp://host:port`` of the rendezvous."""
    backend: str = "gloo"
    """``gloo`` (CPU) or ``nccl`` (GPUs: the gradients and weights go over NCCL, the
    group's few CPU scalars, the normaliser and the heartbeat's versions, over gloo)."""
    timeout_s: float = 120.0
    heartbeat: HeartbeatConfig | None = None


def join_group(config: GroupConfig) -> None:
    """This process's ``torch.distributed`` group for ``config`` (the default group),
    unless it already runs as that rank of that world: a Megatron trainer is built after
    joining, so that megatron's parallel state spans the group."""
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        have = (dist.get_rank(), dist.get_world_size())
        if have != (config.rank, config.world_size):
            raise RuntimeError(
                f"torch.distributed already runs as rank {have[0]} of {have[1]}, not "
                f"rank {config.rank} of {config.world_size}"
            )
        return
    backend = "cpu:gloo,cuda:nccl" if config.backend == "nccl" else config.backend
    timeout = datetime.timedelta(seconds=config.timeout_s)
    where = _tcp_address(config.init_method)
    if where is None:  # env://, file://: torch's own rendezvous
        dist.init_process_group(
            backend, init_method=config.init_method, rank=config.rank,
            world_size=config.world_size, timeout=timeout,
        )  # fmt: skip
        return
    # tcp://: rank 0 serves the store itself, on that address only (torch's own listens on
    # every interface, unauthenticated)
    from gyre_env.weightsync.base import tcp_store

    store = tcp_store(
        *where, serve=config.rank == 0, timeout_s=config.timeout_s, world_size=config.world_size
    )
    dist.init_process_group(
        backend, store=store, rank=config.rank, world_size=config.world_size, timeout=timeout
    )


def _tcp_address(init_method: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``tcp://host:port`` init method, else None."""
    from urllib.parse import urlsplit

    url = urlsplit(init_method)
    if url.scheme != "tcp":
        return None
    if not url.hostname or url.port is None:
        raise ValueError(f"init_method {init_method!r} must be tcp://host:port")
    return url.hostname, url.port


class TrainingGroup:
    """One rank of the core (rank 0) + satellites group; every method is a collective."""

    def __init__(self, trainer, config: GroupConfig):
        import torch.distributed as dist

        self.trainer, self.config, self.dist = trainer, config, dist
        join_group(config)
        self.is_core = config.rank == 0
        if not self.is_core:
            trainer.optimizer = trainer.scheduler = None  # the only optimizer state is the core's
        self.version = 0
        """The version this rank's weights hold."""
        self.core_version = 0
        """The core's version (every rank counts the steps it took part in)."""
        self.heartbeat = Heartbeat(config.heartbeat or HeartbeatConfig())
        self._last_beat = float("-inf")

    def step(self, share: Sequence, kind: str = "rl", *, pull: bool = True) -> dict:
        """Gradients of this rank's ``share``, reduced to the core, which steps and
        broadcasts the new weights; ``pull=False`` leaves this rank's weights as they are
        (a rank away serving). Returns the core's metrics (satellites: their own sums)."""
        torch, dist, trainer = _torch(), self.dist, self.trainer
        tensors = share_tensors(trainer, share)
        norm = share_normalizer(trainer, tensors, kind, self.core_version)
        norm = torch.tensor([norm], dtype=torch.float64)
        dist.all_reduce(norm)
        trainer.zero_grads()
        sums = trainer.accumulate_grads(
            share, kind, max(float(norm), 1.0), self.core_version, tensors=tensors
        )
        del tensors
        grads = trainer.grad_buffers()  # zeros where this share gave none
        flat = _flat(grads)
        dist.reduce(flat, dst=0)
        metrics = dict(sums)
        if self.is_core:  # the sum into the grads, stepped without another DP sync
            _load_flat(grads, flat)
            metrics.update(trainer.apply_grads(sync=False))
        self._broadcast_weights(apply=self.is_core or pull)
        return metrics

    def _broadcast_weights(self, *, apply: bool) -> None:
        """The core's new weights to every rank; those that ``apply`` hold the new version."""
        flat = _flat(self.trainer.model.parameters())
        self.dist.broadcast(flat, src=0)
        self.core_version += 1
        if apply:
            _load_flat(self.trainer.model.parameters(), flat)
            self.version = self.core_version

    def beat(self, *, force: bool = False) -> list[int]:
        """Gather every rank's version (when the adaptive interval is due, or ``force``);
        ranks past the staleness bound are logged and synced. Returns them."""
        torch, dist = _torch(), self.dist
        now = time.monotonic()
        due = torch.tensor([int(force or now - self._last_beat >= self.heartbeat.interval_s)])
        dist.all_reduce(due, op=dist.ReduceOp.MAX)  # every rank takes the same branch
        if not int(due):
            return []
        self._last_beat = now
        mine = torch.tensor([self.version])
        versions = [torch.zeros(1, dtype=mine.dtype) for _ in range(self.config.world_size)]
        dist.all_gather(versions, mine)
        stale = self.heartbeat.beat(self.core_version, {r: int(v) for r, v in enumerate(versions)})
        if stale:
            flat = _flat(self.trainer.model.parameters())
            dist.broadcast(flat, src=0)
            if self.config.rank in stale:
                _load_flat(self.trainer.model.parameters(), flat)
                self.version = self.core_version
        return stale

    def close(self) -> None:
        self.dist.destroy_process_group()


def _flat(tensors):
    torch = _torch()
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _load_flat(params, flat) -> None:
    torch = _torch()
    with torch.no_grad():
        offset = 0
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
