"""The scheduling policy interface, and Gyre's own waterlevel policy.

A policy is plain Python with no I/O and no clock of its own: it reads an
:class:`Observation` of the cluster and returns a :class:`Decision`. The real elastic
scheduler and the discrete-event simulator (:mod:`gyre_env.sim.simulator`) build the same
observation and drive the same objects, so a simulated result is a result of the shipped
policy code.

What a driver promises a policy:

- ``decide`` is called after every phase event (a group of episodes finished, a training
  step ended, a cell finished switching) and at least every ``decision_interval_s``;
- a switch asked for a cell that is already switching, or a training cell in the middle of
  a step, is ignored (the policy sees the same cell again at the next decision);
- ``admit_groups`` adds that many GRPO groups to the agents' start queue (they start as
  agent slots free up); ``train_groups`` > 0 starts one optimizer step over that many of
  the ready groups on every TRAINING cell, if no step is running and there are cells to
  run it.

Waterlevel: ``w(t)`` = agent executions (model calls) dispatched minus finished, i.e.
calls being served plus calls queued for a rollout slot. ``C_R(t)`` = the concurrent
request capacity of the cells serving rollouts.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Protocol


class Role(enum.IntEnum):
    """What a cell does now."""

    ROLLOUT = 0
    TRAINING = 1


@dataclass(frozen=True)
class Switch:
    """Move ``cell`` to ``to``."""

    cell: int
    to: Role


@dataclass(frozen=True)
class Decision:
    """What a policy wants done now (all fields default to "nothing")."""

    switches: tuple[Switch, ...] = ()
    admit_groups: int = 0
    """GRPO groups to add to the agents' start queue."""
    train_groups: int = 0
    """Start one optimizer step over this many ready groups (0: no step)."""


@dataclass(kw_only=True)
class SwitchCosts:
    """Rolling mean of measured switch times per direction, starting from a prior.

    ``observe`` is called by the driver each time a switch finishes; the prior counts as
    ``prior_weight`` measurements so that a single outlier does not swing the estimate.
    """

    to_training_s: float = 8.52
    """Prior for ROLLOUT -> TRAINING (the published elastic design's measurement)."""
    to_rollout_s: float = 3.46
    """Prior for TRAINING -> ROLLOUT."""
    prior_weight: float = 2.0
    window: int = 32
    """Measurements kept per direction."""
    _seen: dict[Role, list[float]] = field(
        default_factory=lambda: {Role.ROLLOUT: [], Role.TRAINING: []}
    )

    def observe(self, to: Role, seconds: float) -> None:
        seen = self._seen[to]
        seen.append(float(seconds))
        del seen[: -self.window]

    def mean(self, to: Role) -> float:
        prior = self.to_training_s if to is Role.TRAINING else self.to_rollout_s
        seen = self._seen[to]
        return (prior * self.prior_weight + sum(seen)) / (self.prior_weight + len(seen))

    def with_prior(self, to_training_s: float, to_rollout_s: float) -> SwitchCosts:
        """The same measurements under another prior."""
        return SwitchCosts(
            to_training_s=to_training_s,
            to_rollout_s=to_rollout_s,
            prior_weight=self.prior_weight,
            window=self.window,
            _seen=self._seen,
        )

    @property
    def round_trip_s(self) -> float:
        return self.mean(Role.TRAINING) + self.mean(Role.ROLLOUT)


@dataclass(frozen=True)
class Observation:
    """The cluster as the policy sees it at ``time``. Per-cell tuples are indexed by cell id."""

    time: float
    roles: tuple[Role, ...]
    """Each cell's current role (while switching: the role it is leaving)."""
    switching: tuple[bool, ...]
    """Cells in the middle of a switch."""
    in_flight: tuple[int, ...]
    """Requests each cell is serving."""
    capacity: tuple[int, ...]
    """Concurrent requests each cell serves when in ROLLOUT."""
    last_switch: tuple[float, ...]
    """When each cell last finished a switch (-inf: never)."""
    version_lag: tuple[int, ...]
    """Trainer version minus the weight version each cell serves or holds."""
    trainer_version: int
    step_running: bool
    waterlevel: int
    """Model calls dispatched minus finished (served + queued)."""
    queue: int
    """Model calls waiting for a rollout slot."""
    rollout_capacity: int
    """C_R: summed capacity of ROLLOUT cells that are not switching."""
    groups_started: int
    """Groups admitted since the start (each counted once)."""
    groups_pending: int
    """Admitted groups whose episodes have not all started."""
    groups_running: int
    """Groups with at least one episode started and not all finished."""
    groups_ready: int
    """Finished groups waiting to be trained on."""
    groups_trained: int
    """Groups taken off the ready buffer so far (trained, filtered or dropped as stale)."""
    ready_tokens: int
    groups_per_step: int
    """The configured training batch, in groups."""
    groups_per_iteration: int
    """The rollout batch of the batch-synchronous policies."""
    steps_per_iteration: int
    staleness_bound: int
    switch_costs: SwitchCosts
    call_s: float
    """Rolling mean duration of a model call."""
    train_tokens_per_s: float
    """Measured training throughput of one cell (tokens/s)."""

    groups_discarded: int = 0
    """Groups finished with no learning signal (filtered: never trained on). Included in
    ``groups_trained``. (Stale output does not count here: refilling the bound with it
    would admit more work the more of it goes stale.)"""
    running_lags: tuple[int, ...] = ()
    """Running groups (an episode started, not all finished) by how many versions the
    trainer is ahead of the version their first episode started on: entry ``k`` counts
    those ``k`` behind, the last (``staleness_bound + 1``) those further (empty: not
    reported). The loss weighs nothing of the output sampled more than ``staleness_bound``
    versions behind the trainer, so the groups at exactly the bound lose their oldest
    output if a step ends before they are taken."""
    in_step: tuple[bool, ...] = ()
    """Cells computing the running step (empty: not reported; then every settled training
    cell counts as in it while ``step_running``)."""
    _memo: dict = field(default_factory=dict, compare=False, repr=False)
    """Answers of the helpers below, which read ``roles`` and ``switching`` only: a driver
    may hand the same dict to successive observations while those two stay the same."""

    @property
    def n_cells(self) -> int:
        return len(self.roles)

    def cells(self, role: Role, *, settled: bool = True) -> list[int]:
        """Cell ids in ``role``; ``settled``: only those not switching (a fresh list)."""
        key = ("cells", role, settled)
        if key not in self._memo:
            self._memo[key] = [
                i
                for i, (r, s) in enumerate(zip(self.roles, self.switching, strict=True))
                if r is role and not (settled and s)
            ]
        return list(self._memo[key])

    def switching_to(self, role: Role) -> int:
        """Cells switching towards ``role``."""
        key = ("to", role)
        if key not in self._memo:
            self._memo[key] = sum(
                s and r is not role for r, s in zip(self.roles, self.switching, strict=True)
            )
        return self._memo[key]


class Policy(Protocol):
    """Reads an observation, returns a decision; keeps only its own bookkeeping."""

    name: str

    def decide(self, obs: Observation) -> Decision: ...

    # optional: ``initial_roles(n) -> list[Role]``: the cells' roles at the start;
    # ``resumed(steps, groups_per_step)``: a run continues after ``steps`` (the step
    # metrics of the driver's ``DriverState``), so that bookkeeping the policy keeps about
    # earlier steps is restored


def running_lags_of(started: dict[int, int], version: int, bound: int) -> tuple[int, ...]:
    """``Observation.running_lags`` from ``started`` (running groups per trainer version
    their first episode started on) at trainer ``version``."""
    lags = [0] * (bound + 2)
    for v0, n in started.items():
        lags[min(version - v0, bound + 1)] += n
    return tuple(lags)


def staleness_admits(obs: Observation, eta: int, extra: int = 0) -> int:
    """Groups the AReaL-style bound admits now: the groups started, less those filtered out
    as carrying no learning signal (``groups_discarded``), may not exceed ``(trainer_version + eta + 1)
    * groups_per_step`` (rollouts more than ``eta`` versions ahead of the trainer are held
    back). Counting the discarded ones would shrink the work in flight by them at every
    step until no batch can fill. ``extra``: groups admitted beyond that count (the
    waterlevel policy's grown steps)."""
    limit = (obs.trainer_version + eta + 1) * obs.groups_per_step + obs.groups_discarded
    return max(0, limit + extra - obs.groups_started)


@dataclass(kw_only=True)
class WaterlevelPolicy:
    """Gyre's elastic policy: cells follow the waterlevel of agent work, and training takes
    cells only when there is a step for them to run.

    *Training work* is a step that can start before a cell moved now would finish its
    switch: a full batch (``groups_per_step`` groups) ready or due by then (the policy
    measures the rate at which groups finish), and no step running that ends later (the
    policy times its own steps: a cell's tokens/s in a step, overheads included). Then:

    - ROLLOUT -> TRAINING one cell at a time while ``w(t) <= C_R(t) - C_e`` (the requests
      in flight would still fit without one cell); an empty system (no calls at all) sends
      every cell but ``min_rollout_cells``;
    - when a step can start, the training side is brought to the cells the step wants
      (``training_cells_wanted``: all spare cells when admissions wait on the trainer,
      else those that finish the batch by the time the next one is due);
    - a step waits for the cells on their way to training (those the same decision sends
      included), then starts on all of them;
    - TRAINING -> ROLLOUT for training cells left without a step when ``w(t) > C_R(t)``
      (requests queue for a slot), as many as the queue fills, while the next step is
      more than a switch round trip away; at low water (no queue) those beyond the cells
      a step is worth (``_worth``) go back while the next step is more than
      ``1 + gain_margin`` round trips away (all of them while it is more than
      ``hold_round_trips`` away): idle in training they serve nothing, in rollout they
      spread the calls;
    - every switch must gain more than the measured switch cost times ``gain_margin``, and
      a cell stays ``min_dwell_factor`` x its switch cost in a role;
    - rollouts are admitted within the staleness bound (``obs.staleness_bound``), counted
      in batches (``admits``);
    - under low load (no queue) a step takes up to ``max_batch_growth`` x the configured
      batch of what is ready instead of leaving it waiting, unless admissions wait on the
      trainer; the groups it takes beyond one batch are admitted back once it runs (a
      version-counted bound would otherwise shrink the work in flight for good);
    - idle training cells stay there for the next step only while it is due within
      ``hold_round_trips`` switch round trips; further off (a load whose batches come
      slowly: a slow sandbox pool, long episodes) every one of them serves until then.

    Source: the elastic RL design for long-horizon agents (2026) this project follows; the
    switch-cost gate, the batch-sized training side and batch growth are Gyre's.
    """

    name: str = "waterlevel"
    min_rollout_cells: int = 1
    gain_margin: float = 1.0
    """Switch only when expected gain > margin x switch cost."""
    min_dwell_factor: float = 1.0
    max_batch_growth: float = 2.0
    hold_round_trips: float = 30.0
    """Idle training cells a step is worth stay in training only while the next step is
    due within this many switch round trips; further off, every idle one serves."""
    spare_stale_steps: float = 1.0
    """A step that would leave running groups past the staleness bound (they started
    ``staleness_bound`` versions ago: their oldest output stops counting if a step ends
    first) waits for them up to this many times the step's own length (0: never waits)."""
    spare_stale_share: float = 0.5
    """... when they are at least this share of a batch."""
    admit_ahead_batches: int = 0
    """Batches admitted beyond the staleness window (``admits``) while the cluster has
    room for the work: no call queues, the calls in flight fill at most
    ``admit_ahead_room`` of every cell's slots, and at most ``admit_ahead_stale_share``
    of a batch of running groups sit at or past the bound. 0 (the default): the window
    alone. In the simulator one batch trained 9-10% (slow sandbox pool) and 2-3% (growing
    episodes) more tokens over seeds 0-2 and moved the other loads by -1% to +4%, with
    single runs of other seeds from -5% to +17% (README, Simulating the scheduler): off
    until it is shown on the real driver."""
    admit_ahead_room: float = 0.75
    admit_ahead_stale_share: float = 0.25
    _waiting: float | None = field(default=None, repr=False)
    """When the step now waiting for groups at the staleness bound could have started."""
    _finished: list = field(default_factory=list, repr=False)
    """(time, groups finished so far) each time that count changed, the last 64."""
    _step: tuple | None = field(default=None, repr=False)
    """The step this policy asked for and has not seen end: (time, cells, tokens, seen
    running)."""
    _cell_rate: float | None = field(default=None, repr=False)
    """Measured tokens/s of one training cell in a step (running mean over steps)."""
    _grown: int = field(default=0, repr=False)
    """Groups the grown steps took beyond one batch each, so far."""
    _step_groups: int = field(default=0, repr=False)
    _group_tokens: float = field(default=0.0, repr=False)
    """Tokens per ready group, as last seen."""

    def decide(self, obs: Observation) -> Decision:
        self._observe(obs)
        admit = self.admits(obs)
        switches = self._switches(obs)
        coming = obs.switching_to(Role.TRAINING) + sum(s.to is Role.TRAINING for s in switches)
        train = self._train_now(obs, coming)
        if train:
            per_group = obs.ready_tokens / obs.groups_ready
            self._step = (obs.time, len(obs.cells(Role.TRAINING)), per_group * train, False)
            self._step_groups = train
        return Decision(switches=switches, admit_groups=admit, train_groups=train)

    # ---- what the policy measures ---------------------------------------------------------
    def _observe(self, obs: Observation) -> None:
        done = obs.groups_ready + obs.groups_trained
        if not self._finished or done != self._finished[-1][1]:
            self._finished.append((obs.time, done))
            del self._finished[:-64]
        if self._step is None:
            return
        t0, cells, tokens, seen = self._step
        if obs.step_running:
            if not seen:  # it runs: the groups it takes beyond one batch count as a batch's
                self._grown += max(0, self._step_groups - obs.groups_per_step)
            self._step = (t0, cells, tokens, True)
            return
        if seen and obs.time > t0 and cells:  # the step asked for has ended: its rate
            rate = tokens / (cells * (obs.time - t0))
            old = self._cell_rate
            self._cell_rate = rate if old is None else 0.5 * (old + rate)
        self._step = None  # (or the driver did not start it)

    def resumed(self, steps: list[dict], groups_per_step: int) -> None:
        """A resumed run: the groups its steps took beyond one batch each count again."""
        self._grown = sum(max(0, int(s.get("groups", 0)) - groups_per_step) for s in steps)

    @property
    def grown_groups(self) -> int:
        """Groups the grown steps so far took beyond one batch each (admitted back)."""
        return self._grown

    def admits(self, obs: Observation) -> int:
        """Groups to admit: :func:`staleness_admits`, plus the groups grown steps took
        beyond one batch. The bound counts ``groups_per_step`` groups per version; a grown
        step advances one version for more, and without them back every grown step would
        shrink the work in flight for good (a new group still has fewer than
        ``bound + 1`` batches ahead of it: each step takes at least one)."""
        admit = staleness_admits(obs, obs.staleness_bound, extra=self._grown)
        if admit or not self.admit_ahead_batches or not self._has_room(obs):
            return admit
        ahead = obs.staleness_bound + self.admit_ahead_batches
        return staleness_admits(obs, ahead, extra=self._grown)

    def _has_room(self, obs: Observation) -> bool:
        """Whether work admitted beyond the window would be served at once: no call
        queues, the calls in flight fill at most ``admit_ahead_room`` of all slots, and
        the running groups at or past the bound are under ``admit_ahead_stale_share`` of a
        batch (with no report of them: none counted)."""
        if obs.queue or obs.waterlevel > self.admit_ahead_room * sum(obs.capacity):
            return False
        stale = sum(obs.running_lags[obs.staleness_bound :]) if obs.running_lags else 0
        return stale <= self.admit_ahead_stale_share * obs.groups_per_step

    def cell_rate(self, obs: Observation) -> float:
        """Tokens per second one training cell gets through a step, overheads included, as
        measured on the steps so far (before the first: ``obs.train_tokens_per_s``)."""
        return self._cell_rate or max(obs.train_tokens_per_s, 1e-9)

    def step_left_s(self, obs: Observation) -> float:
        """Seconds until the running step ends (0: none runs; inf: one runs that this policy
        did not start, so it has no estimate)."""
        if not obs.step_running:
            return 0.0
        if self._step is None:
            return math.inf
        t0, cells, tokens, _ = self._step
        return max(0.0, t0 + tokens / (max(cells, 1) * self.cell_rate(obs)) - obs.time)

    def next_step_s(self, obs: Observation) -> float:
        """Seconds until the next step can start: a full batch ready and no step running."""
        return max(self.batch_due_s(obs), self.step_left_s(obs))

    def group_rate(self, obs: Observation) -> float:
        """Groups finished per second over the recent window (0: not known yet)."""
        if len(self._finished) < 2:
            return 0.0
        (t0, n0), (_, n1) = self._finished[0], self._finished[-1]
        return (n1 - n0) / (obs.time - t0) if obs.time > t0 else 0.0

    def batch_due_s(self, obs: Observation) -> float:
        """Seconds until a full batch is ready (0: it is; inf: no estimate)."""
        missing = obs.groups_per_step - obs.groups_ready
        if missing <= 0:
            return 0.0
        rate = self.group_rate(obs)
        return missing / rate if rate > 0 else math.inf

    def training_cells_wanted(self, obs: Observation) -> int:
        """Cells for the next step: the cells whose rollout slots are idle now, and more
        while they are worth their switch (``_worth``), up to

        - all spare cells when admissions wait on the trainer (the staleness bound is
          reached: the step is on the rollouts' critical path) or the batch rate is not
          known yet;
        - else the cells that finish the batch by the time the next one is due."""
        worth = self._worth(obs)
        work = self._batch_work(obs)
        spare = max(1, obs.n_cells - self.min_rollout_cells)
        rate = self.group_rate(obs)
        c_e = max(obs.capacity, default=1) or 1
        idle_now = max(0, (obs.rollout_capacity - obs.waterlevel) // c_e)
        if self.admits(obs) == 0 or rate <= 0:
            wanted = spare
        else:
            wanted = math.ceil(work * rate / obs.groups_per_step)
        return max(1, min(spare, max(min(worth, wanted), idle_now)))

    def _batch_work(self, obs: Observation) -> float:
        """Cell-seconds of a one-batch step (the last ready groups' size when none is
        ready)."""
        if obs.groups_ready:
            self._group_tokens = obs.ready_tokens / obs.groups_ready
        return self._group_tokens * obs.groups_per_step / self.cell_rate(obs)

    def _worth(self, obs: Observation) -> int:
        """The most cells a step of one batch is worth switching for: the n-th saves
        ``W / (n (n - 1))`` seconds of a step of ``W`` cell-seconds, which must beat
        ``gain_margin`` x the switch round trip (the last ready groups' size when none is
        ready)."""
        x = self._batch_work(obs) / max(self.gain_margin * obs.switch_costs.round_trip_s, 1e-9)
        return int((1.0 + math.sqrt(1.0 + 4.0 * x)) / 2.0)  # largest n: n (n - 1) <= x

    # ---- the switches -------------------------------------------------------------------------
    def _idle_training(self, obs: Observation) -> list[int]:
        training = obs.cells(Role.TRAINING)
        if not obs.step_running:
            return training
        return [i for i in training if obs.in_step and not obs.in_step[i]]

    def _switches(self, obs: Observation) -> tuple[Switch, ...]:
        costs = obs.switch_costs
        rollout = obs.cells(Role.ROLLOUT)
        w, c_r, c_e = obs.waterlevel, obs.rollout_capacity, max(obs.capacity, default=0)
        # a cell moved now trains only once the next step can start: until then it idles
        next_step = self.next_step_s(obs)
        idle = self._idle_training(obs)
        if w > c_r and idle and next_step > costs.round_trip_s:
            # high water, and the idle cells would be back before the next step needs them
            if obs.switching_to(Role.ROLLOUT):
                return ()
            gain = obs.queue * obs.call_s / max(c_r, 1)  # the queue's drain time now
            if gain > self.gain_margin * costs.mean(Role.ROLLOUT):
                return self._moves(obs, idle, Role.ROLLOUT, math.ceil(obs.queue / max(c_e, 1)))
            return ()
        # low water, no step near: the idle cells beyond those a step is worth serve until
        # then (spreading the calls, fewer per cell) rather than idle in training; the gain
        # (serving time after the round trip) must beat margin x the round trip
        near = next_step <= (1.0 + self.gain_margin) * costs.round_trip_s
        near = near or obs.switching_to(Role.ROLLOUT) > 0
        keep = self._worth(obs) if next_step <= self.hold_round_trips * costs.round_trip_s else 0
        if len(idle) > keep and w > 0 and not near:
            return self._moves(obs, idle, Role.ROLLOUT, len(idle) - keep)
        spare = len(rollout) - self.min_rollout_cells
        if next_step > costs.mean(Role.TRAINING) or spare <= 0:
            return ()
        if w == 0 and obs.queue == 0:  # an empty system
            return self._moves(obs, rollout, Role.TRAINING, spare)
        have = len(obs.cells(Role.TRAINING)) + obs.switching_to(Role.TRAINING)
        want = self.training_cells_wanted(obs) - have
        if want <= 0 and w <= c_r - c_e and not obs.switching_to(Role.TRAINING):
            want = 1  # low water: one more cell
        return self._moves(obs, rollout, Role.TRAINING, min(want, spare)) if want > 0 else ()

    def _moves(self, obs: Observation, cells: list[int], to: Role, n: int) -> tuple:
        """Up to ``n`` of ``cells`` to ``to``, least loaded first, among those that have
        dwelt long enough in their role."""
        dwell = self.min_dwell_factor * obs.switch_costs.mean(to)
        ok = [i for i in cells if obs.time - obs.last_switch[i] >= dwell]
        if n < len(ok):
            ok = sorted(ok, key=lambda i: obs.in_flight[i])[:n]
        return tuple(Switch(i, to) for i in ok)

    # ---- the step -----------------------------------------------------------------------------
    def _spares_stale(self, obs: Observation, cells: int) -> bool:
        """Whether the step that could start now waits for the running groups at the
        staleness bound (``obs.running_lags``): when its end would push at least
        ``spare_stale_share`` of a batch past it and, at the rate groups finish, they would be done
        within ``spare_stale_steps`` x the step's own length (a one-batch step on
        ``cells``); for that long at most. Groups that would not be done in time are let go
        at once: waiting for them only idles the training cells (growing episodes: waiting
        the whole limit regardless cut waterlevel to 0.97x async at 6 h)."""
        bound = obs.staleness_bound
        at_bound = obs.running_lags[bound] if len(obs.running_lags) > bound else 0
        if at_bound < self.spare_stale_share * obs.groups_per_step or not self.spare_stale_steps:
            self._waiting = None
            return False
        limit = self.spare_stale_steps * self._batch_work(obs) / max(cells, 1)
        rate = self.group_rate(obs)  # the oldest groups finish first, at about this rate
        if rate <= 0 or at_bound / rate > limit:
            self._waiting = None  # they would not be done in time: waiting only idles
            return False
        if self._waiting is None:
            self._waiting = obs.time
        if obs.time - self._waiting < limit:
            return True
        self._waiting = None
        return False

    def _train_now(self, obs: Observation, coming: int) -> int:
        """The step to start now (0: none); ``coming``: cells on their way to training,
        those this decision sends included."""
        if obs.step_running or obs.groups_ready < obs.groups_per_step:
            return 0
        settled = len(obs.cells(Role.TRAINING))
        if not settled:
            return 0
        if coming and settled < self.training_cells_wanted(obs):
            return 0  # the cells on their way join this step
        if self._spares_stale(obs, settled):
            return 0
        # low load (no queue), and admissions not waiting on the trainer (a grown step
        # advances the version once for more groups): up to the grown batch of what is
        # ready. Not under load: grown steps there, their groups admitted back, put more
        # work in flight than the bound's batches, and long groups aged past it (24 h
        # curriculum: 3,944 samples dropped against 1,480, 17% fewer tokens trained)
        if obs.queue == 0 and self.admits(obs) > 0:
            return min(obs.groups_ready, int(obs.groups_per_step * self.max_batch_growth))
        return obs.groups_per_step
