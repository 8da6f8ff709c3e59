"""The scheduling policy interface, and Gyre's own waterlevel policy.

A policy is plain Python with no I/O and no clock of its own: it reads an
:class:`Observation` of the cluster and returns a :class:`Decision`. The real elastic
scheduler and the discrete-event simulator (:mod:`gyre_env.scheduler.sim`) build the same
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

    @property
    def n_cells(self) -> int:
        return len(self.roles)

    def cells(self, role: Role, *, settled: bool = True) -> list[int]:
        """Cell ids in ``role``; ``settled``: only those not switching."""
        return [
            i
            for i, (r, s) in enumerate(zip(self.roles, self.switching, strict=True))
            if r is role and not (settled and s)
        ]

    def switching_to(self, role: Role) -> int:
        """Cells switching towards ``role``."""
        return sum(s and r is not role for r, s in zip(self.roles, self.switching, strict=True))


class Policy(Protocol):
    """Reads an observation, returns a decision; keeps only its own bookkeeping."""

    name: str

    def decide(self, obs: Observation) -> Decision: ...


def staleness_admits(obs: Observation, eta: int) -> int:
    """Groups the AReaL-style bound admits now: the groups started may not exceed
    ``(trainer_version + eta + 1) * groups_per_step`` (rollouts more than ``eta`` versions
    ahead of the trainer are held back)."""
    limit = (obs.trainer_version + eta + 1) * obs.groups_per_step
    return max(0, limit - obs.groups_started)


@dataclass(kw_only=True)
class WaterlevelPolicy:
    """Gyre's elastic policy: cells follow the waterlevel of agent work.

    - ROLLOUT -> TRAINING, one cell at a time, while ``w(t) <= C_R(t) - C_e`` (the requests
      in flight would still fit without one cell) and there is training work;
    - TRAINING -> ROLLOUT when ``w(t) > C_R(t)`` (requests queue for a slot);
    - an empty system (no calls at all) sends every cell but ``min_rollout_cells`` to
      training when there is training work;
    - a switch happens only when its expected gain beats the measured switch cost times
      ``gain_margin``, and a cell stays ``min_dwell_factor`` x its switch cost in a role;
    - rollouts are admitted within the staleness bound (``obs.staleness_bound``);
    - under low load the training batch grows up to ``max_batch_growth`` x the configured
      batch instead of leaving training cells idle.

    Source: the elastic RL design for long-horizon agents (2026) this project follows; the
    switch-cost gate and batch growth are Gyre's.
    """

    name: str = "waterlevel"
    min_rollout_cells: int = 1
    gain_margin: float = 1.0
    """Switch only when expected gain > margin x switch cost."""
    min_dwell_factor: float = 1.0
    max_batch_growth: float = 2.0
    _last_move: float = field(default=float("-inf"), repr=False)

    def decide(self, obs: Observation) -> Decision:
        admit = staleness_admits(obs, obs.staleness_bound)
        switches = self._switches(obs)
        return Decision(switches=switches, admit_groups=admit, train_groups=_train_now(obs, self))

    def _switches(self, obs: Observation) -> tuple[Switch, ...]:
        costs = obs.switch_costs
        rollout = obs.cells(Role.ROLLOUT)
        training = obs.cells(Role.TRAINING)
        c_e = max(obs.capacity[i] for i in rollout) if rollout else 0
        w, c_r = obs.waterlevel, obs.rollout_capacity
        if w > c_r and training and obs.switching_to(Role.ROLLOUT) == 0:
            cell = self._pick(obs, training, Role.ROLLOUT)
            # gain: how long the queue would take to drain at the present capacity
            gain = obs.queue * obs.call_s / max(c_r, 1)
            if cell is not None and gain > self.gain_margin * costs.mean(Role.ROLLOUT):
                return (Switch(cell, Role.ROLLOUT),)
            return ()
        work_s = self._training_work_s(obs)
        if len(rollout) <= self.min_rollout_cells or work_s <= 0:
            return ()
        if obs.switching_to(Role.TRAINING) and w > 0:
            return ()  # one at a time while agents are active
        if w <= c_r - c_e and work_s > self.gain_margin * costs.round_trip_s:
            if w == 0 and obs.queue == 0:
                spare = len(rollout) - self.min_rollout_cells
                picks = sorted(rollout, key=lambda i: obs.in_flight[i])[:spare]
            else:
                picks = [self._pick(obs, rollout, Role.TRAINING)]
            return tuple(Switch(i, Role.TRAINING) for i in picks if i is not None)
        return ()

    def _pick(self, obs: Observation, cells: list[int], to: Role) -> int | None:
        """The least loaded cell that has dwelt long enough in its role."""
        dwell = self.min_dwell_factor * obs.switch_costs.mean(to)
        ok = [i for i in cells if obs.time - obs.last_switch[i] >= dwell]
        return min(ok, key=lambda i: obs.in_flight[i]) if ok else None

    def _training_work_s(self, obs: Observation) -> float:
        """Seconds of work one more training cell would find: ready tokens at one cell's
        throughput, shared with the cells already training."""
        n_train = len(obs.cells(Role.TRAINING, settled=False)) + 1
        if obs.train_tokens_per_s <= 0:
            return 0.0
        return obs.ready_tokens / (obs.train_tokens_per_s * n_train)


def _train_now(obs: Observation, policy: WaterlevelPolicy) -> int:
    if obs.step_running or not obs.cells(Role.TRAINING) or obs.groups_ready == 0:
        return 0
    if obs.groups_ready >= obs.groups_per_step:
        growth = int(obs.groups_per_step * policy.max_batch_growth)
        # low load (no queue): take what is ready up to the grown batch
        return min(obs.groups_ready, growth if obs.queue == 0 else obs.groups_per_step)
    return 0
