"""The simulator and the policies: properties each policy promises, on small clusters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gyre_env.scheduler.peers import AsyncStalenessPolicy, ColocatedSyncPolicy
from gyre_env.scheduler.policy import Observation, Role, SwitchCosts, WaterlevelPolicy
from gyre_env.sim.compare import k_grid, policy_factories, sweep_best
from gyre_env.sim.config import Dist, SimConfig
from gyre_env.sim.rounds import CALL, QUEUED
from gyre_env.sim.simulator import STATES, Simulation, simulate
from gyre_env.sim.workload import make_workload


def small(**over) -> SimConfig:
    cfg = SimConfig(duration_s=1800.0, seed=1)
    cfg.cells.count = 4
    cfg.cells.max_concurrent = 8
    cfg.workload.max_concurrent_episodes = 48
    cfg.workload.group_size = 4
    cfg.workload.turns = Dist(median=6.0, sigma=0.5, min=1.0)
    cfg.workload.tool_s = Dist(median=2.0, sigma=1.0, tail_fraction=0.1, tail_min=10.0)
    cfg.workload.setup_s = Dist(median=2.0)
    cfg.workload.scoring_s = Dist(median=5.0)
    cfg.training.groups_per_step = 3
    cfg.training.staleness_bound = 2
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


class Checked(Simulation):
    """Asserts conservation after every round, and records what it saw."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.served_during_step = 0
        self.stepped_with_calls = 0
        self.max_started_over_bound = -math.inf
        self._served_seen = 0

    def _after_round(self):
        super()._after_round()
        if self.step_cells:
            self.served_during_step += self.served - self._served_seen
        self._served_seen = self.served
        tab = self.tab
        calls = tab.phase == CALL
        assert self.waterlevel == int(calls.sum()) + int((tab.phase == QUEUED).sum())
        assert (self.load <= self.cap).all() and (self.load >= 0).all()
        assert (self.load[~self._serving] == 0).all()  # calls only on settled ROLLOUT cells
        assert (np.bincount(tab.cell[calls], minlength=len(self.load)) == self.load).all()

    def _start_step(self, groups):
        if self.load.any() and not self.step_cells:
            self.stepped_with_calls += 1
        super()._start_step(groups)

    def _admit(self, groups):
        super()._admit(groups)
        t = self.cfg.training
        limit = (self.trainer_version + t.staleness_bound + 1) * t.groups_per_step
        # (waterlevel: plus the groups its grown steps took beyond one batch, admitted back)
        limit += self.groups_discarded + getattr(self.policy, "grown_groups", 0)
        self.max_started_over_bound = max(self.max_started_over_bound, self.group_started - limit)


def run_checked(cfg, policy):
    init = getattr(policy, "initial_roles", None)
    roles = init(cfg.cells.count) if init else None
    sim = Checked(cfg, policy, make_workload(cfg.workload, cfg.seed), roles=roles)
    return sim, sim.run()


def test_colocated_never_overlaps_rollout_and_training():
    cfg = small()
    sim, r = run_checked(cfg, ColocatedSyncPolicy())
    assert r.steps >= 2
    assert sim.served_during_step == 0 and sim.stepped_with_calls == 0
    assert r.staleness and max(r.staleness) == 0  # one step per batch: always on-policy


def test_async_overlaps_and_respects_the_staleness_bound():
    cfg = small()
    cfg.workload.tool_s = Dist(median=2.0, sigma=1.5, tail_fraction=0.3, tail_min=20.0)
    sim, r = run_checked(cfg, AsyncStalenessPolicy(rollout_cells=3))
    assert r.steps >= 3
    assert sim.served_during_step > 0  # it is asynchronous
    assert sim.max_started_over_bound <= 0
    # samples past the bound are trained, as the real trainer does, but the output tokens
    # sampled more than the bound behind weigh nothing there (trainers.losses.stale_mask):
    # the simulator counts them as dropped, and counts no samples past it without them
    past = sum(n for lag, n in r.staleness.items() if lag > cfg.training.staleness_bound)
    assert past > 0 and r.dropped_tokens > 0
    assert r.dropped_stale <= past


@pytest.mark.slow
@pytest.mark.parametrize("name", ["async", "waterlevel"])
def test_filtered_groups_do_not_starve_the_staleness_bound(name):
    # 40% of groups carry no learning signal: they finish but are never trained on. If they
    # counted against the bound, each step would spend 5/3 of what a version admits and the
    # work in flight would shrink until no batch fills (steps stop).
    cfg = small(duration_s=6 * 3600.0)
    cfg.workload.zero_variance_fraction = 0.4
    make = policy_factories(cfg)[name]
    sim, r = run_checked(cfg, make(2) if name == "async" else make())
    half = r.duration_s / 2
    first = sum(t < half for t in r.step_end_times)
    assert first >= 5 and len(r.step_end_times) - first >= 0.7 * first
    assert sim.max_started_over_bound <= 0


@pytest.mark.parametrize("name", ["colocated", "static_split", "async", "dynamic", "waterlevel"])
def test_every_second_of_every_cell_is_accounted(name):
    cfg = small()
    make = policy_factories(cfg)[name]
    sim, r = run_checked(cfg, make(2) if name in ("static_split", "async") else make())
    assert set(r.state_seconds) == set(STATES)
    assert sum(r.state_seconds.values()) == pytest.approx(cfg.cells.count * r.duration_s, rel=1e-9)
    assert sum(r.fractions().values()) == pytest.approx(1.0)
    assert r.trained_samples > 0
    assert all(sim.group_left[g] > 0 for g in sim.group_left)  # no group counted twice


def test_same_seed_same_result_other_seed_other_result():
    def key(r):
        return (r.trained_tokens, r.steps, r.switches, r.state_seconds, r.staleness, r.events)

    a = simulate(small(), WaterlevelPolicy())
    b = simulate(small(), WaterlevelPolicy())
    c = simulate(small(seed=2), WaterlevelPolicy())
    assert key(a) == key(b)
    assert key(a) != key(c)


def test_static_split_sweep_finds_the_best_k():
    # Deterministic episodes, a batch bigger than the rollout slots and slow training:
    # generation takes ceil(32 / 4k) waves of ~35 s, a step ~170k tokens / (520 tok/s x m
    # x 0.9): k = 2 waits on generation (140 s), k = 4 on training (~190 s), k = 3 on
    # neither (~125 s), and the extremes lose badly.
    cfg = small(duration_s=3000.0)
    cfg.cells.count, cfg.cells.max_concurrent = 6, 4
    cfg.cells.train_tokens_per_s = 520.0
    cfg.workload.turns = Dist(median=6.0)
    cfg.workload.tool_s = Dist(median=2.0)
    cfg.workload.output_tokens = Dist(median=300.0)
    cfg.workload.turn_prompt_tokens = Dist(median=300.0)
    cfg.workload.max_concurrent_episodes = 64
    cfg.training.groups_per_step = 8
    make = policy_factories(cfg)["static_split"]
    runs = sweep_best(cfg, make, k_grid(6, []))
    best_k, best = runs[0]
    brute = {k: simulate(cfg, make(k)).trained_tokens for k in range(1, 6)}
    assert best.trained_tokens == max(brute.values()) and brute[best_k] == best.trained_tokens
    assert best_k == 3
    assert best.trained_tokens > max(brute[1], brute[5])


def _obs(**kw) -> Observation:
    n = kw.pop("n", 4)
    roles = kw.pop("roles", (Role.ROLLOUT,) * n)
    base = dict(
        time=1000.0, roles=roles, switching=(False,) * n, in_flight=(0,) * n,
        capacity=(8,) * n, last_switch=(-math.inf,) * n, version_lag=(0,) * n,
        trainer_version=0, step_running=False, waterlevel=0, queue=0,
        rollout_capacity=8 * sum(r is Role.ROLLOUT for r in roles), groups_started=0,
        groups_pending=0, groups_running=0, groups_ready=0, groups_trained=0,
        ready_tokens=0, groups_per_step=2, groups_per_iteration=2, steps_per_iteration=1,
        staleness_bound=2, switch_costs=SwitchCosts(), call_s=5.0, train_tokens_per_s=1000.0,
    )  # fmt: skip
    base.update(kw)
    return Observation(**base)


def test_waterlevel_trains_when_the_queue_drains_and_serves_when_it_rises():
    policy = WaterlevelPolicy()
    # low water, a batch ready: cells go to training (all but one: nothing is in flight)
    d = policy.decide(_obs(waterlevel=0, groups_ready=4, ready_tokens=200_000))
    assert {s.to for s in d.switches} == {Role.TRAINING} and len(d.switches) == 3
    # some calls in flight, a batch ready: the cells the step is worth, least loaded first
    # (100 cell-s of work: a 3rd cell saves 17 s > the 12 s round trip, a 4th 8 s)
    busy = dict(waterlevel=10, in_flight=(5, 5, 0, 0), groups_ready=4)
    d = WaterlevelPolicy().decide(_obs(**busy, ready_tokens=200_000))
    assert [s.to for s in d.switches] == [Role.TRAINING] * 3
    d = WaterlevelPolicy().decide(_obs(**busy, ready_tokens=50_000))  # 25 cell-s: two cells
    assert sorted((s.cell, s.to) for s in d.switches) == [(2, Role.TRAINING), (3, Role.TRAINING)]
    # high water: requests queue for slots -> idle training cells come back, as many as
    # the queue fills (8 queued requests: one cell of 8 slots; 32: all three)
    roles = (Role.ROLLOUT, Role.TRAINING, Role.TRAINING, Role.TRAINING)
    d = WaterlevelPolicy().decide(
        _obs(roles=roles, waterlevel=16, queue=8, in_flight=(8, 0, 0, 0), call_s=20.0)
    )
    assert [s.to for s in d.switches] == [Role.ROLLOUT]
    d = WaterlevelPolicy().decide(
        _obs(roles=roles, waterlevel=40, queue=32, in_flight=(8, 0, 0, 0))
    )
    assert [s.to for s in d.switches] == [Role.ROLLOUT] * 3
    # no training work: no switch even at low water
    assert policy.decide(_obs(waterlevel=0)).switches == ()


def test_waterlevel_moves_no_cell_to_training_for_a_batch_that_cannot_run():
    # the defect this guards: ready groups short of a batch sent cells to training, where
    # they idled until the batch filled up
    policy = WaterlevelPolicy()
    partial = dict(groups_ready=1, ready_tokens=100_000, in_flight=(2, 2, 0, 0), waterlevel=4)
    assert policy.decide(_obs(**partial)).switches == ()
    assert policy.decide(_obs(waterlevel=0, groups_ready=1, ready_tokens=100_000)).switches == ()
    # ... unless the rest of the batch is due before a moved cell would arrive: one group
    # finished a second ago, one a second before that
    policy = WaterlevelPolicy()
    policy.decide(_obs(time=998.0, groups_trained=0))
    policy.decide(_obs(time=999.0, groups_trained=1))
    d = policy.decide(_obs(**partial, groups_trained=1))
    assert d.switches and {s.to for s in d.switches} == {Role.TRAINING}


def test_waterlevel_never_recalls_a_cell_inside_the_running_step():
    roles = (Role.ROLLOUT, Role.TRAINING, Role.TRAINING, Role.TRAINING)
    obs = _obs(
        roles=roles, waterlevel=40, queue=32, in_flight=(8, 0, 0, 0), step_running=True,
        in_step=(False, True, True, False),
    )  # fmt: skip
    assert [(s.cell, s.to) for s in WaterlevelPolicy().decide(obs).switches] == [(3, Role.ROLLOUT)]


def test_waterlevel_sizes_the_step_and_waits_for_its_cells():
    # a batch of 2 x 300k tokens at 1000 tok/s: 600 cell-s; round trip ~12 s: a 7th cell
    # saves 600 / 42 s > 12 s, an 8th 600 / 56 s < 12 s; admissions wait on the trainer
    # (started groups at the bound), so the step wants every spare cell (3 of 4)
    policy = WaterlevelPolicy()
    gated = dict(groups_ready=2, ready_tokens=600_000, groups_started=6, waterlevel=20)
    gated["in_flight"] = (5, 5, 5, 5)
    assert policy.training_cells_wanted(_obs(**gated)) == 3
    full = dict(gated, n=10, roles=(Role.ROLLOUT,) * 10, in_flight=(8,) * 10, waterlevel=80)
    assert policy.training_cells_wanted(_obs(**full)) == 7
    # a small step is not worth many switches: 60 cell-s, the 2nd cell saves 30 s, the 3rd 10
    assert policy.training_cells_wanted(_obs(**dict(full, ready_tokens=60_000))) == 2
    # ... but cells whose slots are idle anyway all join: 20 calls on 10 x 8 slots
    idle = dict(full, ready_tokens=60_000, waterlevel=20, in_flight=(2,) * 10)
    assert policy.training_cells_wanted(_obs(**idle)) == 7
    d = policy.decide(_obs(**gated))
    assert [s.to for s in d.switches] == [Role.TRAINING] * 3 and d.train_groups == 0
    # one cell has arrived, two are still switching: the step waits for them
    # (a switching cell shows the role it leaves)
    roles = (Role.ROLLOUT, Role.TRAINING, Role.ROLLOUT, Role.ROLLOUT)
    obs = _obs(**gated, roles=roles, switching=(False, False, True, True))
    assert policy.decide(obs).train_groups == 0
    roles = (Role.ROLLOUT, Role.TRAINING, Role.TRAINING, Role.TRAINING)
    assert policy.decide(_obs(**gated, roles=roles)).train_groups == 2


def test_waterlevel_moves_cells_both_ways_in_a_bursty_run():
    cfg = small(duration_s=3600.0)
    cfg.workload.tool_s = Dist(median=1.0, sigma=1.0, tail_fraction=0.4, tail_min=30.0)
    sim, r = run_checked(cfg, WaterlevelPolicy())
    by_cell: dict[int, list[str]] = {}
    for cell, _, _, label in r.gantt:
        by_cell.setdefault(cell, []).append(label)
    moves = [
        (a, b)
        for labels in by_cell.values()
        for a, s, b in zip(labels, labels[1:], labels[2:], strict=False)
        if s == "switching"
    ]
    assert ("rollout", "training idle") in moves or ("rollout", "training") in moves
    assert any(a.startswith("training") and b == "rollout" for a, b in moves)
    assert r.switches >= 2 and r.busy_fraction()["training"] > 0 and r.trained_samples > 0


def test_sweeps_run_as_long_as_the_main_run_unless_told():
    from gyre_env.sim.compare import _variant

    cfg = small(duration_s=5400.0)
    assert _variant(cfg, "cells", 2).duration_s == 5400.0
    cfg.sweep.duration_s = 600.0
    assert _variant(cfg, "tool_tail_fraction", 0.3).duration_s == 600.0


def test_waterlevel_neither_starts_a_step_without_the_cells_it_sends_nor_sends_them_twice():
    # the defects this guards (24 h NL2Repo runs): a batch ready, two cells idle in training:
    # the step started on those two (hours long) while the same decision sent the rest,
    # which then idled beside it; and cells on their way were not counted, so every tick
    # sent another round until the whole cluster was switching
    roles = (Role.TRAINING, Role.TRAINING) + (Role.ROLLOUT,) * 8
    gated = dict(
        n=10, roles=roles, groups_ready=2, ready_tokens=600_000, groups_started=6,
        waterlevel=64, in_flight=(0, 0) + (8,) * 8,
    )  # fmt: skip
    policy = WaterlevelPolicy()
    d = policy.decide(_obs(**gated))
    sent = [s.cell for s in d.switches if s.to is Role.TRAINING]
    assert len(sent) == policy.training_cells_wanted(_obs(**gated)) - 2 > 0
    assert d.train_groups == 0, "the step waits for the cells this decision sends"
    switching = tuple(i in sent for i in range(10))
    again = policy.decide(_obs(**gated, switching=switching))
    assert not [s for s in again.switches if s.to is Role.TRAINING]


def test_waterlevel_sends_no_cell_to_training_while_a_long_step_runs():
    # a full batch is ready but the running step has minutes left: a cell moved now would
    # idle until it ends; one ending within a switch gets its cells in time
    policy = WaterlevelPolicy()
    roles = (Role.TRAINING,) + (Role.ROLLOUT,) * 3
    base = dict(roles=roles, groups_ready=2, ready_tokens=600_000, in_flight=(0, 1, 1, 1))
    base.update(waterlevel=3, last_switch=(-math.inf,) + (1000.0,) * 3)  # just arrived
    assert policy.decide(_obs(**base)).train_groups == 2  # 600 cell-s on one cell
    running = dict(base, step_running=True, in_step=(True, False, False, False))
    assert policy.step_left_s(_obs(**running, time=1001.0)) == pytest.approx(599.0)
    assert policy.decide(_obs(**running, time=1001.0)).switches == ()
    late = policy.decide(_obs(**running, time=1595.0))
    assert late.switches and {s.to for s in late.switches} == {Role.TRAINING}


def test_waterlevel_idle_training_cells_serve_at_low_water_while_no_step_is_near():
    # low water (no queue), the next batch a minute off (one group of two ready, one group
    # finished a minute ago): training cells beyond the one a small step is worth go back
    # to spread the calls; with a batch due they stay
    roles = (Role.ROLLOUT, Role.TRAINING, Role.TRAINING, Role.TRAINING)
    low = dict(roles=roles, waterlevel=6, in_flight=(6, 0, 0, 0), ready_tokens=10_000)

    def minute_off() -> WaterlevelPolicy:
        policy = WaterlevelPolicy()
        policy.decide(_obs(**low, time=940.0))  # 0 groups done by then: 1 a minute
        return policy

    d = minute_off().decide(_obs(**low, groups_ready=1))  # 20 cell-s: one cell's worth
    assert len(d.switches) == 2 and {s.to for s in d.switches} == {Role.ROLLOUT}
    assert minute_off().decide(_obs(**low, groups_ready=2)).switches == ()


def test_waterlevel_holds_no_idle_training_cell_while_the_next_batch_is_far_off():
    # the defect this guards (a slow sandbox pool, issue 37): a step's worth of cells
    # (a third of the cluster) idled in training for hours while the next batch was an
    # hour away; now every idle one serves until the batch is within hold_round_trips
    roles = (Role.ROLLOUT, Role.TRAINING, Role.TRAINING, Role.TRAINING)
    low = dict(roles=roles, waterlevel=6, in_flight=(6, 0, 0, 0), ready_tokens=400_000)
    policy = WaterlevelPolicy()
    policy.decide(_obs(**low, time=0.0))  # a group a thousand seconds: the batch 1000 s off
    far = _obs(**low, groups_ready=1)
    d = policy.decide(far)  # a step of 400 cell-s is worth all three cells, but it is 83
    assert policy.batch_due_s(far) == pytest.approx(1000.0)  # round trips away: they serve
    assert sorted(s.cell for s in d.switches) == [1, 2, 3]
    assert {s.to for s in d.switches} == {Role.ROLLOUT}
    near = WaterlevelPolicy(hold_round_trips=100.0)
    near.decide(_obs(**low, time=0.0))
    assert near.decide(_obs(**low, groups_ready=1)).switches == ()  # within 100: they stay


def test_waterlevel_does_not_grow_a_step_under_load():
    # requests queue and admissions wait on the trainer (the bound is reached): two batches
    # ready, the step takes one (grown steps there, their groups admitted back, put more
    # work in flight than the bound's batches: 24 h curriculum, 2.7x the stale drops)
    policy = WaterlevelPolicy()
    roles = (Role.ROLLOUT,) + (Role.TRAINING,) * 3
    obs = dict(roles=roles, groups_ready=4, ready_tokens=40_000, groups_started=6)
    obs.update(queue=12, waterlevel=20, in_flight=(8, 0, 0, 0))
    assert policy.admits(_obs(**obs)) == 0
    assert policy.decide(_obs(**obs)).train_groups == 2
    assert policy.grown_groups == 0


def test_waterlevel_grows_a_step_at_low_load_without_shrinking_the_work_in_flight():
    # 2 batches ready at low load (no queue, headroom under the bound): one step takes both
    # (max_batch_growth 2); once it runs, the 2 groups beyond one batch are admitted back
    # (the bound counts a batch per version: else every grown step shrinks the pipeline)
    policy = WaterlevelPolicy()
    roles = (Role.ROLLOUT,) + (Role.TRAINING,) * 3
    obs = dict(roles=roles, groups_ready=4, ready_tokens=40_000, groups_started=4)
    before = policy.admits(_obs(**obs))
    d = policy.decide(_obs(**obs))
    assert d.train_groups == 4 and d.admit_groups == before == 2
    running = dict(obs, step_running=True, in_step=(False, True, True, True), groups_ready=0)
    running["groups_trained"] = 4
    policy.decide(_obs(**running))
    assert policy.admits(_obs(**running)) == before + 2


def test_workload_phases_scale_their_groups_in_order_and_repeat():
    from gyre_env.config import ConfigError, from_dict
    from gyre_env.sim.config import WorkloadConfig, WorkloadPhase

    base = dict(
        group_size=2,
        turns={"median": 20.0},
        tool_s={"median": 2.0},
        output_tokens={"median": 100.0},
        max_context_tokens=10**9,
    )
    phases = [
        {"groups": 3, "turns_scale": 0.25, "tool_scale": 0.5, "output_scale": 2.0},
        {"groups": 2},
    ]
    work = make_workload(from_dict(WorkloadConfig, {**base, "phases": phases}), seed=0)
    shape = [
        {(len(e.output), float(e.tool_s[0]), int(e.output[0])) for e in work.group(g)}
        for g in range(6)
    ]
    assert shape == [{(5, 1.0, 200)}] * 3 + [{(20, 2.0, 100)}] * 2 + [{(5, 1.0, 200)}]
    # without phases (or with all-1 scales) a group is what it always was
    plain = make_workload(from_dict(WorkloadConfig, base), seed=0)
    ones = make_workload(from_dict(WorkloadConfig, {**base, "phases": [{"groups": 4}]}), seed=0)
    assert [len(e.output) for e in plain.group(7)] == [len(e.output) for e in ones.group(7)]
    assert WorkloadConfig().phase_of(5) is None
    assert isinstance(
        from_dict(WorkloadConfig, {**base, "phases": phases}).phase_of(4), WorkloadPhase
    )
    with pytest.raises(ConfigError, match=r"workload phase scales must be > 0"):
        from_dict(WorkloadConfig, {**base, "phases": [{"groups": 2, "turns_scale": 0.0}]})
    with pytest.raises(ConfigError, match=r"unknown key 'phases\[0\].turn_scale'"):
        from_dict(WorkloadConfig, {**base, "phases": [{"groups": 2, "turn_scale": 0.5}]})


def test_waterlevel_waits_for_groups_at_the_staleness_bound_only_when_they_finish_in_time():
    """Groups that started ``staleness_bound`` versions ago are lost if a step ends before
    they are taken: the step waits for them while, at the rate groups finish, they would be
    done within a step's length, and no longer; groups that would not be are let go."""
    roles = (Role.ROLLOUT,) + (Role.TRAINING,) * 3
    ready = dict(roles=roles, groups_ready=2, ready_tokens=40_000, waterlevel=8)
    ready.update(in_flight=(8, 0, 0, 0), groups_started=4)

    def primed(policy: WaterlevelPolicy) -> WaterlevelPolicy:
        policy.decide(_obs(**{**ready, "groups_ready": 0, "ready_tokens": 0}, time=990.0))
        return policy  # 2 groups finished in 10 s: 0.2 groups/s

    # one-batch step: 40k tokens / (3 cells x 1000 tokens/s) = 13.3 s; 2 groups at the
    # bound (2) finish in about 10 s: the step waits, then starts once the limit is past
    policy = primed(WaterlevelPolicy())
    assert policy.decide(_obs(**ready, running_lags=(0, 0, 2, 0))).train_groups == 0
    later = _obs(**ready, running_lags=(0, 0, 2, 0), time=1014.0)
    assert policy.decide(later).train_groups == 2
    # nobody at the bound, or no report: at once
    assert primed(WaterlevelPolicy()).decide(_obs(**ready, running_lags=(3, 1, 0, 0))).train_groups
    assert primed(WaterlevelPolicy()).decide(_obs(**ready)).train_groups == 2
    # 6 at the bound would take 30 s at 0.2 groups/s, past the 13.3 s: not worth waiting
    far = _obs(**ready, running_lags=(0, 0, 6, 0))
    assert primed(WaterlevelPolicy()).decide(far).train_groups == 2
    # switched off
    off = WaterlevelPolicy(spare_stale_steps=0)
    assert primed(off).decide(_obs(**ready, running_lags=(0, 0, 2, 0))).train_groups == 2


def test_waterlevel_admits_ahead_of_the_staleness_window_only_while_the_cluster_has_room():
    """``admit_ahead_batches``: once the window (``(version + bound + 1)`` batches) is
    full, one more batch is admitted while no call queues, the calls fill at most
    ``admit_ahead_room`` of the slots and few running groups sit at the bound; off by
    default."""
    full = dict(groups_started=6, waterlevel=4)  # version 0, bound 2, batch 2: window 6
    assert WaterlevelPolicy().admits(_obs(**full)) == 0
    ahead = WaterlevelPolicy(admit_ahead_batches=1)
    assert ahead.admits(_obs(**full)) == 2
    assert ahead.admits(_obs(**{**full, "groups_started": 7})) == 1
    assert ahead.admits(_obs(**{**full, "groups_started": 3})) == 3  # the window's own first
    assert ahead.admits(_obs(**full, queue=1)) == 0  # calls wait for a slot
    assert ahead.admits(_obs(**{**full, "waterlevel": 25})) == 0  # 25 of 32 slots > 0.75
    assert ahead.admits(_obs(**full, running_lags=(2, 1, 0, 0))) == 2  # none at the bound
    assert ahead.admits(_obs(**full, running_lags=(1, 1, 1, 0))) == 0  # 1 > 0.25 x 2
    assert WaterlevelPolicy(admit_ahead_batches=2).admits(_obs(**full)) == 4


def test_waterlevel_settings_out_of_range_are_refused_by_name():
    from gyre_env.config import ConfigError, from_dict
    from gyre_env.sim.config import WaterlevelParams

    assert from_dict(WaterlevelParams, {"spare_stale_steps": 0}).spare_stale_steps == 0
    with pytest.raises(ConfigError, match=r"spare_stale_steps = -1"):
        from_dict(WaterlevelParams, {"spare_stale_steps": -1})
    with pytest.raises(ConfigError, match=r"max_batch_growth must be >= 1"):
        from_dict(WaterlevelParams, {"max_batch_growth": 0.5})


def test_output_past_the_staleness_bound_is_trained_and_counts_nothing():
    # as the real trainer's loss (trainers.losses.stale_mask): a group whose first call was
    # sampled long before its step is trained whole, and only the share of its tokens in
    # its fresh output counts. Before, the simulator dropped such a group whole and ran
    # another in its place, which the real driver never does (held-out validation of the
    # elastic CPU runs: the waterlevel predicted 32% slow on a tool-delay run)
    from gyre_env.sim.workload import Episode, TraceWorkload

    long = Episode(0.0, 0.0, [10, 10], [100, 300], [60.0, 0.0], call_s=[1.0, 1.0])
    short = Episode(0.0, 0.0, [10], [50], [0.0], call_s=[1.0])
    cfg = small(max_steps=30)
    cfg.cells.count = 2
    cfg.workload.group_size = 1
    cfg.workload.max_concurrent_episodes = 2
    cfg.training.groups_per_step = 1
    cfg.training.staleness_bound = 3
    work = TraceWorkload([[long]] + [[short]] * 50)
    r = simulate(cfg, AsyncStalenessPolicy(rollout_cells=1), work)
    assert r.steps == 30 and r.trained_samples == 30  # the long group is one of them
    assert max(r.staleness) > 3  # it was trained past the bound
    assert r.dropped_stale == 0  # its last call is fresh: it still teaches
    # its first call's output (100 of 400) weighs nothing: that share of its 420 tokens
    assert r.dropped_tokens == 105
    assert r.trained_tokens + r.dropped_tokens == 420 + 29 * 60
