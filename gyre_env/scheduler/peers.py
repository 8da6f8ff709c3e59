"""Peer policies: how other RL systems place rollout and training, on the same interface.

Each is one class implementing :class:`~gyre_env.scheduler.policy.Policy`, so that the
simulator compares them against Gyre's :class:`~gyre_env.scheduler.policy.WaterlevelPolicy`
on the same cluster, workload and cost model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from gyre_env.scheduler.policy import Decision, Observation, Role, Switch, staleness_admits


def _split(n: int, k: int) -> list[int]:
    """Sizes of ``numpy.array_split(range(n), min(k, n))`` (the real loop's minibatches)."""
    return [len(c) for c in np.array_split(np.arange(n), min(k, n))] if n else []


def _everyone(obs: Observation, to: Role) -> tuple[Switch, ...]:
    return tuple(
        Switch(i, to)
        for i, (r, s) in enumerate(zip(obs.roles, obs.switching, strict=True))
        if r is not to and not s
    )


def _settled(obs: Observation, role: Role) -> bool:
    return not any(obs.switching) and all(r is role for r in obs.roles)


class _Phase(enum.Enum):
    ROLLOUT = "rollout"
    TRAIN = "train"


@dataclass(kw_only=True)
class ColocatedSyncPolicy:
    """All cells roll out a batch, then all cells train on it, then all roll out again.

    Source: verl's hybrid engine (HybridFlow, EuroSys 2025) and Gyre's own synchronous
    ``gyre train`` loop: the batch is ``groups_per_iteration`` groups, split into up to
    ``steps_per_iteration`` minibatch steps once every episode of it finished; rollout and
    training never overlap.
    """

    name: str = "colocated"
    params: dict = field(default_factory=dict)
    _phase: _Phase = _Phase.ROLLOUT
    _admitted: bool = False
    _plan: list[int] = field(default_factory=list)

    def decide(self, obs: Observation) -> Decision:
        if self._phase is _Phase.ROLLOUT:
            if not self._admitted:
                if not _settled(obs, Role.ROLLOUT):
                    return Decision(switches=_everyone(obs, Role.ROLLOUT))
                self._admitted = True
                return Decision(admit_groups=obs.groups_per_iteration)
            if obs.groups_pending or obs.groups_running:
                return Decision()
            self._phase = _Phase.TRAIN
            self._plan = _split(obs.groups_ready, obs.steps_per_iteration)
        if not _settled(obs, Role.TRAINING):
            return Decision(switches=_everyone(obs, Role.TRAINING))
        if obs.step_running:
            return Decision()
        if self._plan and obs.groups_ready:
            return Decision(train_groups=self._plan.pop(0))
        self._phase, self._admitted = _Phase.ROLLOUT, False
        return Decision(switches=_everyone(obs, Role.ROLLOUT))


def _split_roles(n: int, k: int) -> list[Role]:
    k = max(1, min(k, n - 1)) if n > 1 else n
    return [Role.ROLLOUT] * k + [Role.TRAINING] * (n - k)


@dataclass(kw_only=True)
class StaticSplitPolicy:
    """``k`` cells only roll out, the other ``m`` only train; batches are pipelined one
    step off-policy: batch i+1 is generated while batch i trains (at most one batch ahead).

    Source: disaggregated one-step-off-policy training (verl's one-step-off recipe,
    StreamRL's static split); the best ``k`` comes from a sweep (``sweep_best``).
    """

    rollout_cells: int
    name: str = "static_split"
    _plan: list[int] = field(default_factory=list)
    _generating: bool = False

    @property
    def params(self) -> dict:
        return {"rollout_cells": self.rollout_cells}

    def initial_roles(self, n: int) -> list[Role]:
        return _split_roles(n, self.rollout_cells)

    def decide(self, obs: Observation) -> Decision:
        batch = obs.groups_per_iteration
        admit = train = 0
        done_generating = not (obs.groups_pending or obs.groups_running)
        if self._generating and done_generating:
            self._generating = False
            self._plan.extend(_split(obs.groups_ready - sum(self._plan), obs.steps_per_iteration))
        in_system = obs.groups_started - obs.groups_trained
        if not self._generating and in_system <= batch:
            self._generating, admit = True, batch
        if self._plan and not obs.step_running and obs.groups_ready:
            train = self._plan.pop(0)
        return Decision(admit_groups=admit, train_groups=train)


@dataclass(kw_only=True)
class AsyncStalenessPolicy:
    """Fully asynchronous: ``k`` rollout cells generate without pause, the trainer steps as
    soon as ``groups_per_step`` groups are ready, and a new group starts only while the
    staleness bound allows: started <= (version + eta + 1) x batch.

    Source: AReaL (Fu et al., 2025), its rollout controller and staleness bound eta; the
    best ``k`` comes from a sweep.
    """

    rollout_cells: int
    name: str = "async"

    @property
    def params(self) -> dict:
        return {"rollout_cells": self.rollout_cells}

    def initial_roles(self, n: int) -> list[Role]:
        return _split_roles(n, self.rollout_cells)

    def decide(self, obs: Observation) -> Decision:
        admit = staleness_admits(obs, obs.staleness_bound)
        ready = obs.groups_ready >= obs.groups_per_step and not obs.step_running
        return Decision(admit_groups=admit, train_groups=obs.groups_per_step if ready else 0)


@dataclass(kw_only=True)
class DynamicResourcePolicy:
    """Asynchronous training whose split moves with the request queue: a training cell joins
    rollout when more than ``queue_threshold`` requests per rollout cell wait, a rollout cell
    joins training when no request waits, slots are less than half used and a batch is
    ready; each move must pass a cost/benefit gate against a switch-cost estimate that starts
    from a ``switch_prior_s`` prior, and moves are at least one estimated switch apart.

    Source: verl's dynamic resource scheduling for agentic RL (queue-size trigger,
    cost/benefit gate, 10 s switch-cost prior).
    """

    name: str = "dynamic"
    queue_threshold: int = 8
    switch_prior_s: float = 10.0
    initial_rollout_fraction: float = 0.75
    _last_move: float = float("-inf")

    @property
    def params(self) -> dict:
        return {"queue_threshold": self.queue_threshold, "switch_prior_s": self.switch_prior_s}

    def initial_roles(self, n: int) -> list[Role]:
        return _split_roles(n, round(n * self.initial_rollout_fraction))

    def decide(self, obs: Observation) -> Decision:
        admit = staleness_admits(obs, obs.staleness_bound)
        ready = obs.groups_ready >= obs.groups_per_step and not obs.step_running
        train = obs.groups_per_step if ready else 0
        return Decision(switches=self._move(obs), admit_groups=admit, train_groups=train)

    def _move(self, obs: Observation) -> tuple[Switch, ...]:
        costs = obs.switch_costs.with_prior(self.switch_prior_s, self.switch_prior_s)
        if obs.time - self._last_move < costs.round_trip_s / 2 or any(obs.switching):
            return ()
        rollout, training = obs.cells(Role.ROLLOUT), obs.cells(Role.TRAINING)
        c_r = max(obs.rollout_capacity, 1)
        if training and obs.queue > self.queue_threshold * max(len(rollout), 1):
            benefit = obs.queue * obs.call_s / c_r  # queue drain time the move shortens
            idle = [i for i in training if not obs.step_running]
            if idle and benefit > costs.mean(Role.ROLLOUT):
                self._last_move = obs.time
                return (Switch(idle[0], Role.ROLLOUT),)
        if len(rollout) > 1 and obs.queue == 0 and obs.waterlevel < c_r / 2:
            if obs.groups_ready >= obs.groups_per_step and obs.train_tokens_per_s > 0:
                benefit = obs.ready_tokens / (obs.train_tokens_per_s * (len(training) + 1))
                if benefit > costs.mean(Role.TRAINING):
                    self._last_move = obs.time
                    cell = min(rollout, key=lambda i: obs.in_flight[i])
                    return (Switch(cell, Role.TRAINING),)
        return ()
