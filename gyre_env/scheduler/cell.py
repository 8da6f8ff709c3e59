"""A cell: one engine object and one trainer object, one of them active at a time.

A cell serves model calls in ROLLOUT (its engine is a replica of the proxy's router) and
computes gradients in TRAINING (its trainer; the core cell also owns the optimizer, see
``core``). A role switch runs timed phases, each logged and kept:

ROLLOUT -> TRAINING: ``stop_admitting`` (the router stops routing to it) -> ``migrate``
(its in-flight requests move to the cells still serving, with their KV, or re-prefilled
there; with no cell left they finish here first; an SGLang engine exports no KV: its
requests are aborted on the server and the router re-prefills each elsewhere from its
token ids) -> ``release`` (engine weights and KV
freed) -> ``onload`` (trainer memory back).

TRAINING -> ROLLOUT: ``offload`` (trainer memory freed) -> ``resume`` (engine weights
back) -> ``load_weights`` (the newest published version) -> ``admit`` (routed to again).

The training step and the publish between them belong to the core (``core.Core``). Each
finished switch feeds the policy's :class:`~gyre_env.scheduler.policy.SwitchCosts`
(rolling means per direction) and this cell's per-phase rolling means.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gyre_env.scheduler.migration import KVTransport, MigrationReport, migrate
from gyre_env.scheduler.policy import Role, SwitchCosts
from gyre_env.scheduler.versions import WeightBoard

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class SwitchConfig:
    """How a cell switches roles."""

    migration_window_s: float = 8.0
    """A KV migration not finished within this re-prefills the rest (RDMA_TRANSFER_FAILED)."""
    migrate_kv: bool = True
    """False: moved requests are always re-prefilled from their token ids."""
    history: int = 32
    """Switch records (and per-phase samples) kept per cell."""


@dataclass
class SwitchRecord:
    """One finished switch: per-phase seconds in the order they ran."""

    cell: int
    to: Role
    started: float
    """``time.monotonic()`` when the switch began."""
    phases: dict[str, float] = field(default_factory=dict)
    phase_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes a phase moved between device and host, where its part reports them (the
    trainer's ``offload`` / ``onload``: ``last_move_bytes``); with ``phases``' seconds,
    its copy rate, to hold against the machine's copy floor."""
    migration: MigrationReport | None = None
    weight_version: int = 0
    """The version the cell holds after the switch."""
    profile: dict | None = None
    """Its profiler trace and memory snapshot files (``elastic_profile``), when profiled."""

    @property
    def total_s(self) -> float:
        return sum(self.phases.values())

    def summary(self) -> str:
        parts = " ".join(
            f"{k}={v * 1000:.1f}ms"
            + (f"/{self.phase_bytes[k] / 1e9:.2f}GB" if self.phase_bytes.get(k) else "")
            for k, v in self.phases.items()
        )
        return f"cell {self.cell} -> {self.to.name}: {self.total_s * 1000:.1f}ms ({parts})"


class PhaseStats:
    """Rolling mean seconds of each phase, per direction."""

    def __init__(self, window: int = 32):
        self._seen: dict[tuple[Role, str], collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=window)
        )

    def observe(self, record: SwitchRecord) -> None:
        for phase, seconds in record.phases.items():
            self._seen[(record.to, phase)].append(seconds)

    def mean(self, to: Role, phase: str) -> float | None:
        seen = self._seen.get((to, phase))
        return sum(seen) / len(seen) if seen else None

    def means(self, to: Role) -> dict[str, float]:
        return {p: sum(s) / len(s) for (r, p), s in self._seen.items() if r is to and s}


class _Phases:
    """Times the phases of one switch into its record, logging each."""

    def __init__(self, record: SwitchRecord):
        self.record = record

    async def run(self, name: str, fn: Callable, *, blocking: bool = False):
        t0 = time.perf_counter()
        if blocking:
            result = await asyncio.to_thread(_in_range, name, fn)
        else:
            with _profiler_range(name):
                result = await fn()
        seconds = time.perf_counter() - t0
        self.record.phases[name] = seconds
        log.info(
            "cell %d -> %s: %s %.1f ms", self.record.cell, self.record.to.name, name, seconds * 1e3
        )
        return result


def _profiler_range(phase: str):
    """A ``switch.<phase>`` range in a running torch profiler's trace (a few microseconds
    when none runs; nothing when torch is not loaded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"switch.{phase}")


def _in_range(phase: str, fn: Callable):
    with _profiler_range(phase):
        return fn()


class Cell:
    """One engine and one trainer; see the module docstring. Async methods run on the
    event loop of the proxy whose router routes to ``engine``."""

    def __init__(
        self,
        cell_id: int,
        engine,
        trainer,
        *,
        board: WeightBoard,
        router=None,
        costs: SwitchCosts | None = None,
        config: SwitchConfig | None = None,
        role: Role = Role.ROLLOUT,
        transport: KVTransport | None = None,
        on_migration_failed: Callable[[MigrationReport], None] | None = None,
        migration_lock: asyncio.Lock | None = None,
    ):
        """``migration_lock``: shared by the cells of one pool, so that two cells leaving
        at once do not move requests into each other."""
        self.id = cell_id
        self.engine, self.trainer, self.board, self.router = engine, trainer, board, router
        self.costs = costs
        self.config = config or SwitchConfig()
        self.role = role
        self.switching = False
        self.last_switch = float("-inf")
        """``time.monotonic()`` when the last switch finished."""
        self.switch_started = float("-inf")
        """``time.monotonic()`` when the last (or running) switch began."""
        self.transport = transport
        self.on_migration_failed = on_migration_failed
        self.migration_lock = migration_lock or asyncio.Lock()
        self.history: collections.deque[SwitchRecord] = collections.deque(
            maxlen=self.config.history
        )
        self.stats = PhaseStats(self.config.history)
        self.trainer_version = board.version
        """The weight version the trainer object holds (synced from the board)."""

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def serves(self) -> bool:
        """In ROLLOUT and not switching: a cell requests can move to."""
        return self.role is Role.ROLLOUT and not self.switching

    @property
    def weight_version(self) -> int:
        """The version this cell serves (ROLLOUT) or trains from (TRAINING)."""
        return self.engine.weight_version if self.role is Role.ROLLOUT else self.trainer_version

    async def prepare(self) -> None:
        """Bring a cell built in TRAINING to its role: the engine's memory is released."""
        if self.role is Role.TRAINING:
            await self.stop_admitting()
            await self.engine.release_memory()

    async def to_training(self, serving: Sequence[Cell] = ()) -> SwitchRecord:
        """ROLLOUT -> TRAINING; ``serving``: cells that stay in ROLLOUT (migration targets)."""
        self._begin(Role.TRAINING)
        record = SwitchRecord(self.id, Role.TRAINING, self.switch_started)
        phases = _Phases(record)
        try:
            async with self.migration_lock:  # the serving set holds still while requests move
                await phases.run("stop_admitting", self.stop_admitting)
                targets = [c.engine for c in serving if c is not self and c.serves]
                if targets:
                    record.migration = await phases.run("migrate", lambda: self._migrate(targets))
            await phases.run("release", self.engine.release_memory)
            await phases.run("onload", self._onload, blocking=True)
            self._moved(record, "onload")
            self.role = Role.TRAINING  # before switching clears: other threads read both
        finally:
            self.switching = False
        record.weight_version = self.trainer_version
        return self._finish(record)

    async def to_rollout(self) -> SwitchRecord:
        """TRAINING -> ROLLOUT, serving the newest published weights."""
        self._begin(Role.ROLLOUT)
        record = SwitchRecord(self.id, Role.ROLLOUT, self.switch_started)
        phases = _Phases(record)
        try:
            await phases.run("offload", self.trainer.offload, blocking=True)
            self._moved(record, "offload")
            await phases.run("resume", self.engine.resume_memory)
            await phases.run("load_weights", self.sync_engine)
            await phases.run("admit", self.admit)
            self.role = Role.ROLLOUT
        finally:
            self.switching = False
        record.weight_version = self.engine.weight_version
        return self._finish(record)

    async def sync_engine(self) -> int:
        """Load the board's newest weights into the engine if it is behind; its version."""
        version, tensors = self.board.latest()
        if tensors and version > self.engine.weight_version:
            await self.engine.update_weights(tensors, version)
        return self.engine.weight_version

    def sync_trainer(self) -> int:
        """Load the board's newest weights into the trainer's model if it is behind."""
        version, tensors = self.board.latest()
        if tensors and version > self.trainer_version:
            self.trainer.load_named_parameters(tensors)  # any backend: HF names in
            self.trainer_version = version
        return self.trainer_version

    # ---- phases -----------------------------------------------------------------
    def _begin(self, to: Role) -> None:
        if self.switching:
            raise RuntimeError(f"cell {self.id} is already switching")
        if self.role is to:
            raise RuntimeError(f"cell {self.id} is already in {to.name}")
        self.switch_started = time.monotonic()
        self.switching = True

    async def stop_admitting(self) -> None:
        if self.router is not None:
            await self.router.pause(self.name)
        else:
            await self.engine.pause()

    async def _migrate(self, targets: list) -> MigrationReport:
        if not hasattr(self.engine, "export_inflight"):
            # An engine that cannot export KV (SGLang): its running requests are aborted
            # on the server and the router continues each on ``targets`` from its token ids.
            t0 = time.monotonic()
            moved = await self.engine.abort_inflight()
            return MigrationReport(
                requests=moved, reprefilled=moved, export_s=time.monotonic() - t0,
                transport="re-prefill from token ids (no KV export)",
            )  # fmt: skip
        report = await migrate(
            self.engine,
            targets,
            window_s=self.config.migration_window_s,
            transport=self.transport,
            keep_kv=self.config.migrate_kv,
        )
        if report.failed and self.on_migration_failed is not None:
            self.on_migration_failed(report)
        return report

    def _moved(self, record: SwitchRecord, phase: str) -> None:
        moved = getattr(self.trainer, "last_move_bytes", 0)
        if moved:
            record.phase_bytes[phase] = int(moved)

    def _onload(self) -> None:
        self.trainer.onload()
        self.sync_trainer()

    async def admit(self) -> None:
        if self.router is not None:
            await self.router.resume(self.name)
        else:
            await self.engine.resume()

    def _finish(self, record: SwitchRecord) -> SwitchRecord:
        self.last_switch = time.monotonic()
        self.history.append(record)
        self.stats.observe(record)
        if self.costs is not None:
            self.costs.observe(record.to, record.total_s)
        log.info("%s", record.summary())
        return record
