"""The elastic driver: cells change roles at runtime as a policy object decides.

Every ``decision_interval_s`` (and after each event: a group finished, a step ended, a
switch finished) the driver builds an :class:`~gyre_env.scheduler.policy.Observation` of
the real cells, exactly as the simulator does for its modelled ones, and applies the
policy's :class:`~gyre_env.scheduler.policy.Decision`:

- ``admit_groups``: GRPO groups start on the agents' slots (``Workload.run_group`` in a
  thread each: episodes calling the model through the proxy);
- ``switches``: a cell's timed switch (``Cell.to_training`` / ``to_rollout``) runs on the
  proxy's event loop; a cell already switching or in the running step is left alone;
- ``train_groups``: one optimizer step (``CoreStep``) over that many ready groups on the
  TRAINING cells (cell 0 is the core and owns the optimizer); the new version is published
  and every serving cell pulls it; a serving cell past the staleness bound is taken out of
  routing until synced (``STALE_WEIGHTS_DETECTED``).

The observation counts a cell's calls up to its capacity as served and the rest (the
router does not cap a replica) as the queue, with the calls waiting in the router. The
run ends with its last step: its wall time and the cells' accounting stop there, groups
finishing later are dropped, and a workload with ``stop()`` is told to end them early.

The same policy objects drive ``gyre simulate`` (one implementation, two drivers). What
the driver keeps: per-cell seconds by state (busy or idle, and why), the role timeline,
the switch records, per-sample version lags and the step metrics. Given a ``metrics`` sink
(``gyre_env.train.metrics.MetricsLogger``) it also records them as they happen: one
``cell_state`` record per closed timeline segment, one ``switch`` per finished switch,
``rl`` and ``iteration`` per optimizer step, and at the end one ``cell`` record per cell
(busy fraction by role, switching, idle fraction by reason) and the ``phase`` wall time;
the HTML report draws the role Gantt and the busy/idle table from them.

Idle reasons (the simulator's names): a ROLLOUT cell with nothing in flight is idle
``agents_in_tools`` while groups run (their agents wait on tools), ``no_episodes`` when no
group runs, ``out_of_routing`` while paused or excluded by the router (a stale cell being
synced); a TRAINING cell outside the running step is idle ``step_elsewhere`` while a step
runs without it (it arrived after the step began) and ``no_batch`` otherwise.

Resume: ``on_step(driver)`` is called after every step (a checkpoint takes
:meth:`ElasticDriver.state` and the core trainer's state there), and a driver built with
``start=DriverState`` continues that run: its steps so far, its group counts, the groups
that had finished but were not yet trained on (queued for the next steps), and new groups
numbered from ``next_index`` (a stored run's group tags never repeat). The groups running
at the stop are not recovered: the policy admits new ones in their place.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gyre_env.scheduler.cell import Cell
from gyre_env.scheduler.core_cell import CoreStep
from gyre_env.scheduler.policy import (
    Decision,
    Observation,
    Policy,
    Role,
    SwitchCosts,
    running_lags_of,
)
from gyre_env.scheduler.versions import Heartbeat, HeartbeatConfig

log = logging.getLogger(__name__)


class Workload(Protocol):
    """The agent work: what a group is, how it runs and what it trains on."""

    def run_group(self, index: int):
        """Run group ``index``'s episodes to the end (blocking; model calls go through the
        proxy) and return the finished group."""
        ...

    def units(self, groups: list) -> list:
        """Packed units (``PackedTree``) of finished groups for one optimizer step."""
        ...

    def tokens(self, group) -> int:
        """Training tokens of a finished group."""
        ...

    # optional: ``has_signal(group) -> bool``; a group without (all rewards equal, say) is
    # not trained on and counts as discarded (``Observation.groups_discarded``)
    # optional: ``stop()``: the run has taken its steps; groups still running may end
    # early (the driver drops them) instead of running to the end for nothing


@dataclass(kw_only=True)
class ElasticConfig:
    """How the driver runs."""

    steps: int = 4
    """Optimizer steps to take, then stop."""
    groups_per_step: int = 2
    """The configured training batch, in groups."""
    steps_per_iteration: int = 1
    """Steps per rollout batch for the batch-synchronous policies (colocated, static)."""
    agent_slots: int = 4
    """Groups running at once."""
    staleness_bound: int = 2
    """Most versions a sample (and a serving cell) may lag the core."""
    decision_interval_s: float = 0.05
    train_tokens_per_s_prior: float = 2000.0
    """One cell's training throughput until the first step measures it (the waterlevel
    policy weighs training work in seconds against the switch cost)."""
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    timeout_s: float = 1800.0
    """Give up (RuntimeError) when the steps are not done by then."""
    profile_dir: str | None = None
    """Write a PyTorch profiler trace (and, with CUDA, a memory snapshot) of every switch
    here (``elastic_profile``); None: off."""


@dataclass(kw_only=True)
class DriverState:
    """Where an elastic run stands between two steps (what a checkpoint keeps)."""

    steps: list[dict] = field(default_factory=list)
    """The step metrics so far (the run continues until ``ElasticConfig.steps``)."""
    groups_trained: int = 0
    """Groups trained on or discarded (the policies' counts)."""
    groups_discarded: int = 0
    ready: list = field(default_factory=list)
    """Finished groups not yet trained on."""
    next_index: int = 0
    """The index the next admitted group gets (``Workload.run_group(index)``)."""


class CallClock:
    """A record sink measuring model calls (the policy's ``call_s``)."""

    def __init__(self, window: int = 64):
        self._seconds: collections.deque = collections.deque(maxlen=window)

    def write(self, record) -> None:
        t = record.timings or {}
        self._seconds.append(float(t.get("prefill", 0.0)) + float(t.get("decode", 0.0)))

    def close(self) -> None:
        """Nothing to release."""

    @property
    def mean_s(self) -> float:
        return sum(self._seconds) / len(self._seconds) if self._seconds else 1.0


@dataclass
class ElasticResult:
    """What a run did."""

    steps: list[dict] = field(default_factory=list)
    switches: list = field(default_factory=list)
    timeline: list[tuple[int, str, float, float]] = field(default_factory=list)
    """(cell, state, start, end) seconds since the start; state ``rollout`` | ``training``
    (in a step) | ``training idle`` | ``switching``."""
    seconds: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per cell: seconds by ``rollout_busy``, ``rollout_idle``, ``training_busy``,
    ``training_idle``, ``switching``."""
    idle_reasons: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per cell: idle seconds by ``rollout/idle:<reason>`` / ``training/idle:<reason>``
    (the module docstring lists the reasons)."""
    staleness: dict[int, int] = field(default_factory=dict)
    """Sample version lag at training time -> loss tokens."""
    wall_s: float = 0.0
    t0: float = 0.0
    """``time.monotonic()`` when the run began (the timeline's zero)."""
    groups_run: int = 0
    migration_failures: int = 0
    """Migrations past their window (re-prefilled instead)."""
    evals: list[dict] = field(default_factory=list)
    """Held-out evaluations (``gyre train --elastic``: initial, SFT and final model)."""

    def busy_fraction(self, cell: int) -> float:
        s = self.seconds.get(cell, {})
        total = sum(s.values())
        return (s.get("rollout_busy", 0.0) + s.get("training_busy", 0.0)) / total if total else 0.0

    def cell_fractions(self, cell: int) -> dict[str, float]:
        """One cell's share of its time: ``rollout_busy``, ``training_busy``,
        ``switching``, ``busy`` (both roles) and ``idle`` (all reasons), then each
        ``.../idle:<reason>``."""
        s = self.seconds.get(cell, {})
        total = sum(s.values())
        if not total:
            return {}
        out = {k: s.get(k, 0.0) / total for k in ("rollout_busy", "training_busy", "switching")}
        out["busy"] = out["rollout_busy"] + out["training_busy"]
        out["idle"] = (s.get("rollout_idle", 0.0) + s.get("training_idle", 0.0)) / total
        reasons = self.idle_reasons.get(cell, {})
        return out | {k: v / total for k, v in sorted(reasons.items())}

    def idle_fraction(self) -> float:
        total = sum(sum(s.values()) for s in self.seconds.values())
        idle = sum(
            s.get("rollout_idle", 0.0) + s.get("training_idle", 0.0) for s in self.seconds.values()
        )
        return idle / total if total else 0.0


class ElasticDriver:
    """Runs a workload on cells under a policy (see the module docstring)."""

    def __init__(
        self,
        cells: Sequence[Cell],
        policy: Policy,
        workload: Workload,
        *,
        call: Callable,
        router,
        config: ElasticConfig | None = None,
        clock: CallClock | None = None,
        costs: SwitchCosts | None = None,
        metrics=None,
        core=None,
        start: DriverState | None = None,
        on_step: Callable[[ElasticDriver], None] | None = None,
    ):
        """``call(coro, timeout=...)`` runs a coroutine on the proxy's loop and waits
        (``ProxyServer.call``); ``router``: the proxy's router; ``metrics``: a sink with
        ``log(kind, values)`` for the records listed in the module docstring; ``core``: the
        optimizer step (default ``CoreStep`` over the cells' trainers in this process;
        ``ray_cells.RayCoreStep`` for trainers that are Ray actors); ``start``: the state
        of the run to continue (see the module docstring); ``on_step(driver)``: called in
        the driver's thread after each step, before the next decision."""
        self.cells, self.policy, self.workload = list(cells), policy, workload
        self.call, self.router = call, router
        self.config = config or ElasticConfig()
        self.clock = clock or CallClock()
        self.costs = costs or cells[0].costs or SwitchCosts()
        self.core = core or CoreStep(cells[0].trainer, version=cells[0].board.version)
        bound = self.config.staleness_bound
        self.heartbeat = Heartbeat(
            dataclasses.replace(self.config.heartbeat, staleness_bound=bound)
        )
        self.result = ElasticResult()
        self.metrics = metrics
        self.profiler = None
        if self.config.profile_dir is not None:
            from gyre_env.scheduler.profile import SwitchProfiler

            self.profiler = SwitchProfiler(self.config.profile_dir)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pending: collections.deque[int] = collections.deque()
        self._running = 0
        self._running_v0: dict[int, int] = {}  # running group -> trainer version at its start
        self._ready: list = []
        self._ready_v0: dict[int, int] = {}  # id(ready group) -> trainer version at its start
        self._started = self._trained = self._discarded = 0
        self._index_base = 0
        """Workload index of the session's first group (``DriverState.next_index``)."""
        self.on_step = on_step
        if start is not None:
            self.result.steps = list(start.steps)
            self._ready = list(start.ready)
            self._trained, self._discarded = start.groups_trained, start.groups_discarded
            # the policies count groups started; only those trained or ready still exist
            self._started = self._trained + len(self._ready)
            self._index_base = start.next_index - self._started
            resumed = getattr(policy, "resumed", None)
            if resumed is not None:
                resumed(self.result.steps, self.config.groups_per_step)
        self._ended = False
        self._step: concurrent.futures.Future | None = None
        self._step_cells: set[int] = set()
        self._step_ended: float | None = None
        """When the running step's training was done (seconds since the start)."""
        self._switches: dict[int, concurrent.futures.Future] = {}
        self._train_tokens_per_s = self.config.train_tokens_per_s_prior
        self._t0 = time.monotonic()
        self._since = {c.id: (self._state(c), 0.0) for c in self.cells}
        for c in self.cells:
            if c.on_migration_failed is None:
                c.on_migration_failed = self._migration_failed

    def _migration_failed(self, report) -> None:
        """RDMA_TRANSFER_FAILED (already logged): counted, and handed to the policy when it
        takes it (``on_migration_failed(report)``; the shared Policy protocol has no such
        hook yet, so the waterlevel policy does not shrink its context per batch)."""
        self.result.migration_failures += 1
        hook = getattr(self.policy, "on_migration_failed", None)
        if hook is not None:
            hook(report)

    # ---- the loop ---------------------------------------------------------------------
    def run(self) -> ElasticResult:
        """Decide and act until ``config.steps`` steps are done; returns the result."""
        cfg = self.config
        self._t0 = self.result.t0 = time.monotonic()
        deadline = self._t0 + cfg.timeout_s
        self._last = 0.0
        with concurrent.futures.ThreadPoolExecutor(cfg.agent_slots, "gyre-agents") as agents:
            self._agents = agents
            try:
                while len(self.result.steps) < cfg.steps:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"elastic run: {len(self.result.steps)} of {cfg.steps} steps after {cfg.timeout_s:g}s"
                        )
                    self._reap()
                    self._last = self._account(self._last)
                    self._apply(self.policy.decide(self.observe()))
                    self._beat()
                    self._wake.wait(cfg.decision_interval_s)
                    self._wake.clear()
            finally:  # the last step, Ctrl-C or an error: start nothing more, end what runs
                with self._lock:
                    self._pending.clear()  # admitted but not started: not run
                    self._ended = True  # groups finishing from now on are dropped
                stop = getattr(self.workload, "stop", None)
                if stop is not None:
                    stop()
            # the run ends with its last step: the groups still running (the next batch)
            # are not waited for in its wall time or its cells' accounting
            self._finish()
        return self.result

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def state(self) -> DriverState:
        """The run as a checkpoint keeps it (call between steps: ``on_step``)."""
        with self._lock:
            return DriverState(
                steps=list(self.result.steps), groups_trained=self._trained,
                groups_discarded=self._discarded, ready=list(self._ready),
                next_index=self._started + self._index_base,
            )  # fmt: skip

    def observe(self) -> Observation:
        """The cells as the policy sees them now."""
        replicas = {r.name: r for r in self.router.replicas}
        roles = tuple(c.role for c in self.cells)
        switching = tuple(c.switching for c in self.cells)
        capacity = tuple(c.engine.config.max_batch_size for c in self.cells)
        # the router does not cap a replica at its capacity: the calls a cell holds beyond
        # its batch wait there for a slot, and count as the queue (as the router's waiting
        # ones do), not as served
        routed = tuple(
            replicas[c.name].inflight if c.role is Role.ROLLOUT else 0 for c in self.cells
        )
        in_flight = tuple(min(n, cap) for n, cap in zip(routed, capacity, strict=True))
        queue = self.router.waiting + sum(routed) - sum(in_flight)
        version = self.core.version
        rollout_cap = sum(
            cap
            for c, cap in zip(self.cells, capacity, strict=True)
            if c.role is Role.ROLLOUT and not c.switching
        )
        with self._lock:
            pending, running, ready = len(self._pending), self._running, list(self._ready)
            started = collections.Counter(self._running_v0.values())
        step_cells = set(self._step_cells) if self._step is not None else set()
        cfg = self.config
        return Observation(
            time=self._now(), roles=roles, switching=switching, in_flight=in_flight,
            capacity=capacity,
            last_switch=tuple(c.last_switch - self._t0 for c in self.cells),
            version_lag=tuple(version - c.weight_version for c in self.cells),
            trainer_version=version, step_running=self._step is not None,
            waterlevel=sum(in_flight) + queue, queue=queue,
            rollout_capacity=rollout_cap, groups_started=self._started,
            groups_pending=pending, groups_running=running, groups_ready=len(ready),
            running_lags=running_lags_of(started, version, cfg.staleness_bound),
            groups_trained=self._trained, groups_discarded=self._discarded,
            ready_tokens=sum(self.workload.tokens(g) for g in ready),
            groups_per_step=cfg.groups_per_step,
            groups_per_iteration=cfg.groups_per_step * cfg.steps_per_iteration,
            steps_per_iteration=cfg.steps_per_iteration, staleness_bound=cfg.staleness_bound,
            switch_costs=self.costs, call_s=self.clock.mean_s,
            train_tokens_per_s=self._train_tokens_per_s,
            in_step=tuple(c.id in step_cells for c in self.cells) if step_cells else (),
        )  # fmt: skip

    def _apply(self, d: Decision) -> None:
        for _ in range(d.admit_groups):
            self._admit()
        for s in d.switches:
            cell = self.cells[s.cell]
            if (
                cell.switching
                or cell.role is s.to
                or s.cell in self._switches
                or s.cell in self._step_cells
            ):
                continue
            self._switch(cell, s.to)
        if d.train_groups and self._step is None and len(self.result.steps) < self.config.steps:
            training = [c for c in self.cells if c.role is Role.TRAINING and not c.switching]
            with self._lock:
                take = self._take(d.train_groups)
            if training and take:
                self._step_cells = {c.id for c in training}
                self._step = self._start_step(training, take)
                self._last = self._account(self._last)  # the step's cells train from now

    def _take(self, n: int) -> list:
        """Up to ``n`` ready groups for a step, the stalest first (the earliest trainer
        version at their start; a resumed run's carried-over groups count as oldest): a
        group left for the next step goes stale first if it started earliest, while
        fresher ones can wait. Taking them in the order they finished lost the long
        groups that short ones overtook (simulated 24 h curriculum, async k = 56: 472
        samples past the bound against 144). Called with the lock held."""
        self._ready.sort(key=lambda g: self._ready_v0.get(id(g), -1))  # stable: ties by finish
        take, self._ready = self._ready[:n], self._ready[n:]
        for g in take:
            self._ready_v0.pop(id(g), None)
        return take

    # ---- agents -----------------------------------------------------------------------
    def _admit(self) -> None:
        with self._lock:
            index = self._started
            self._started += 1
            self._pending.append(index)
        self._agents.submit(self._group, index)

    def _group(self, index: int) -> None:
        with self._lock:
            if index not in self._pending:
                return  # the run ended before it started
            self._pending.remove(index)
            self._running += 1
            self._running_v0[index] = self.core.version
        try:
            group = self.workload.run_group(index + self._index_base)
        finally:
            with self._lock:
                self._running -= 1
                v0 = self._running_v0.pop(index)
        signal = getattr(self.workload, "has_signal", None)
        with self._lock:
            if self._ended:
                return  # after the last step: not trained on, not counted
            if signal is None or signal(group):
                self._ready.append(group)
                self._ready_v0[id(group)] = v0
            else:  # no learning signal: taken off at once, not trained on
                self._trained += 1
                self._discarded += 1
            self.result.groups_run += 1
        self._wake.set()

    # ---- switches and steps -------------------------------------------------------------
    def _switch(self, cell: Cell, to: Role) -> None:
        if to is Role.TRAINING:
            coro = cell.to_training(serving=self.cells)
        else:
            coro = cell.to_rollout()
        if self.profiler is not None:
            coro = self.profiler.wrap(cell.id, to, coro)
        future = asyncio.run_coroutine_threadsafe(coro, self._loop())
        self._switches[cell.id] = future
        future.add_done_callback(lambda _: self._wake.set())

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = getattr(self, "_proxy_loop", None)
        if loop is None:
            loop = self._proxy_loop = self.call(_running_loop())
        return loop

    def _start_step(self, training: list[Cell], groups: list) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                metrics = self._train(training, groups)
                self._step_ended = self._now()
                future.set_result(metrics)
            except BaseException as e:  # noqa: BLE001 - re-raised by _reap
                future.set_exception(e)
            self._wake.set()

        threading.Thread(target=run, name="gyre-core-step", daemon=True).start()
        return future

    def _train(self, training: list[Cell], groups: list) -> dict:
        started = self._now()
        units = self.workload.units(groups)
        core = self.cells[0]
        sats = [c for c in training if c is not core]
        for c in sats:
            c.sync_trainer()
        lags = self._count_lag(units)
        metrics = self.core.step(units, [c.trainer for c in sats], core_share=core in training)
        version = self.core.version
        core.board.publish(version, dict(core.trainer.named_parameters()))
        core.trainer_version = version
        self._train_tokens_per_s = metrics["tokens_per_s"] / max(len(training), 1)
        rewards = [r for g in groups for r in getattr(g, "rewards", ())]
        if rewards:
            metrics["reward_mean"] = sum(rewards) / len(rewards)
        return {
            **metrics,
            "step": version,
            "groups": len(groups),
            "group_index": [getattr(g, "index", None) for g in groups],
            "cells": sorted(c.id for c in training),
            "staleness": lags,
            # the whole step as its cells spend it (packing, satellite sync, the optimizer
            # step, publishing), seconds since the run's start
            "started_s": started,
            "ended_s": self._now(),
        }

    def _count_lag(self, units: list) -> dict[int, int]:
        """Loss tokens by version lag of this step's units (also added to the run's)."""
        from gyre_env.trajectory.packing import loss_token_lags

        lags = loss_token_lags(units, self.core.version)
        for value, count in lags.items():
            self.result.staleness[value] = self.result.staleness.get(value, 0) + count
        return lags

    def _reap(self) -> None:
        """Collect finished switches and steps (errors are raised here)."""
        for cell_id, future in list(self._switches.items()):
            if future.done():
                del self._switches[cell_id]
                record = future.result()
                self.result.switches.append(record)
                self._log("switch", switch_values(record, self._t0))
        if self._step is not None and self._step.done():
            step, self._step = self._step, None
            # the step's edge on its own clock: a step begun and done between two ticks
            # still counts as training (the cells' time up to its end), idle after it
            ended, self._step_ended = self._step_ended, None
            if ended is not None:
                self._last = self._account(self._last, until=ended)
            self._step_cells = set()
            if ended is not None:
                self._last = self._account(self._last, until=ended)
            metrics = step.result()
            self._trained += metrics["groups"]
            self.result.steps.append(metrics)
            self._log_step(metrics)
            if self.on_step is not None:
                self.on_step(self)
            log.info(
                "step %d on cells %s: loss %.4f", metrics["step"], metrics["cells"], metrics["loss"]
            )
            for c in self.cells:
                if c.role is Role.ROLLOUT and not c.switching:
                    asyncio.run_coroutine_threadsafe(c.sync_engine(), self._loop())

    def _beat(self) -> None:
        serving = {
            c.id: c.weight_version for c in self.cells if c.role is Role.ROLLOUT and not c.switching
        }
        for cell_id in self.heartbeat.beat(self.core.version, serving):
            cell = self.cells[cell_id]
            self.call(_resync(cell), timeout=self.config.heartbeat.max_interval_s * 10)

    # ---- accounting -----------------------------------------------------------------------
    def _state(self, cell: Cell) -> str:
        if cell.switching:
            return "switching"
        if cell.role is Role.ROLLOUT:
            return "rollout"
        return "training" if cell.id in self._step_cells else "training idle"

    def _idle_reason(self, cell: Cell, state: str, replica) -> str:
        if state == "rollout":
            if replica.paused_until == float("inf") or replica.excluded is not None:
                return "rollout/idle:out_of_routing"
            return "rollout/idle:agents_in_tools" if self._running else "rollout/idle:no_episodes"
        return (
            "training/idle:step_elsewhere" if self._step is not None else "training/idle:no_batch"
        )

    def _account(self, last: float, until: float | None = None) -> float:
        """Attribute the time since the last tick (``last``) up to now (or ``until``) to
        each cell's states. A switch's edges are the cell's own clock (a tick can come
        late: an engine's ``gc.collect`` holds the GIL), so a switch begun and finished
        between two ticks still shows, at its true times; a step's end comes the same way
        (``_reap``)."""
        now = self._now() if until is None else max(until, last)
        replicas = {r.name: r for r in self.router.replicas}
        for c in self.cells:
            state = self._state(c)
            prev, since = self._since[c.id]
            began = min(max(c.switch_started - self._t0, last), now)
            ended = min(max(c.last_switch - self._t0, last), now)
            if state == prev:
                changes = []
            elif state == "switching":
                changes = [(state, began)]
            elif prev == "switching":
                changes = [(state, ended)]
            elif c.last_switch - self._t0 > last:  # a whole switch since the last tick
                changes = [("switching", began), (state, ended)]
            else:
                changes = [(state, now)]
            at, current = last, prev
            for new, t in changes:
                self._add(c, current, t - at, replicas[c.name])
                self._segment(c.id, current, since, t)
                at, current, since = t, new, t
            self._add(c, current, now - at, replicas[c.name])
            self._since[c.id] = (current, since)
        return now

    def _add(self, c: Cell, state: str, dt: float, replica) -> None:
        if dt <= 0:
            return
        secs = self.result.seconds.setdefault(c.id, collections.defaultdict(float))
        if state == "switching":
            secs["switching"] += dt
        elif state == "rollout" and replica.inflight > 0:
            secs["rollout_busy"] += dt
        elif state == "training":
            secs["training_busy"] += dt
        else:
            secs["rollout_idle" if state == "rollout" else "training_idle"] += dt
            reasons = self.result.idle_reasons.setdefault(c.id, collections.defaultdict(float))
            reasons[self._idle_reason(c, state, replica)] += dt

    def _segment(self, cell: int, state: str, start: float, end: float) -> None:
        self.result.timeline.append((cell, state, start, end))
        self._log("cell_state", {"cell": cell, "state": state, "start": start, "end": end})

    def _finish(self) -> None:
        now = self._account(self._last)
        for c in self.cells:
            prev, since = self._since[c.id]
            self._segment(c.id, prev, since, now)
        r = self.result
        r.seconds = {k: dict(v) for k, v in r.seconds.items()}
        r.idle_reasons = {k: dict(v) for k, v in r.idle_reasons.items()}
        r.wall_s = now
        for c in self.cells:
            self._log(
                "cell", {"cell": c.id, **r.cell_fractions(c.id), "seconds": r.seconds.get(c.id, {})}
            )
        self._log("phase", {"phase": "elastic", "seconds": now})

    # ---- metrics ---------------------------------------------------------------------------
    def _log(self, kind: str, values: dict) -> None:
        if self.metrics is not None:
            self.metrics.log(kind, values)

    def _log_step(self, m: dict) -> None:
        rl = {k: v for k, v in m.items() if k not in ("staleness", "reward_mean")}
        self._log("rl", rl)
        row = {"iteration": m["step"], "groups": m["groups"], "staleness": m["staleness"]}
        for key, name in (("reward_mean", "reward_mean"), ("step_s", "time_train"),
                          ("tokens_per_s", "train_tokens_per_s")):  # fmt: skip
            if key in m:
                row[name] = m[key]
        self._log("iteration", row)


def switch_values(record, t0: float) -> dict:
    """A switch record as plain values (``start``: seconds since ``t0``, the run's start)."""
    values = {
        "cell": record.cell, "to": record.to.name, "start": record.started - t0,
        "total_s": record.total_s, "phases": dict(record.phases),
        "weight_version": record.weight_version,
    }  # fmt: skip
    if record.phase_bytes:
        values["phase_bytes"] = dict(record.phase_bytes)
    if record.profile is not None:
        values["profile"] = record.profile
    if record.migration is not None:
        values["migration"] = {k: v for k, v in vars(record.migration).items() if k != "produced"}
    return values


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


async def _resync(cell: Cell) -> None:
    """Out of routing, load the newest version, back in (STALE_WEIGHTS_DETECTED)."""
    if not cell.serves:  # it switched meanwhile: resuming will load the newest version
        return
    await cell.stop_admitting()
    await cell.sync_engine()
    await cell.admit()
