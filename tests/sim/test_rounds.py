"""The simulator's rounds: their pieces against brute force, exact FIFO timing, and results
that converge as the round length shrinks."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_env.scheduler.peers import AsyncStalenessPolicy, ColocatedSyncPolicy
from gyre_env.scheduler.policy import WaterlevelPolicy
from gyre_env.sim.config import Dist, SimConfig
from gyre_env.sim.rounds import free_slots, rolling_mean, serving_sweep
from gyre_env.sim.simulator import simulate
from gyre_env.sim.workload import Episode, TraceWorkload


def test_rolling_mean_is_the_sequential_one():
    values = np.random.default_rng(0).exponential(5.0, 300)
    mean = 1.0
    for v in values:
        mean += 0.01 * (v - mean)
    assert rolling_mean(1.0, values) == pytest.approx(mean, rel=1e-12)
    assert rolling_mean(2.5, np.zeros(0)) == 2.5


def test_serving_sweep_matches_a_brute_force_integral():
    rng = np.random.default_rng(1)
    n, t0, t1 = 6, 10.0, 11.0
    load0 = rng.integers(0, 3, n)
    serving = np.array([True, True, True, True, False, True])
    load0[~serving] = 0
    k = 40
    cells = rng.choice(np.flatnonzero(serving), k)
    times = t0 + rng.random(k) * (t1 - t0)
    deltas = rng.choice([-1, 1], k)
    # keep loads non-negative: add the +1 of each -1 at the round start
    load0 = load0 + np.bincount(cells[deltas < 0], minlength=n)
    slot_s, serve_s = serving_sweep(t0, t1, load0, serving, cells, times, deltas)
    grid = np.linspace(t0, t1, 200001)[:-1] + 0.5 * (t1 - t0) / 200000
    loads = np.repeat(load0[:, None], len(grid), axis=1).astype(float)
    for c, t, d in zip(cells, times, deltas, strict=True):
        loads[c, grid >= t] += d
    dt = (t1 - t0) / 200000
    assert slot_s == pytest.approx((loads[serving].sum()) * dt, rel=1e-3)
    assert serve_s == pytest.approx((loads[serving] > 0).sum() * dt, rel=1e-3)


def test_free_slots_fill_the_least_loaded_cells_first():
    load = np.array([3, 0, 1, 0, 4])
    cap = np.array([4, 4, 4, 4, 4])
    serving = np.array([True, True, True, False, True])
    cells, levels = free_slots(load, cap, serving, 5, np.zeros(5, int))
    # cell 3 is not serving, cell 4 is full; levels are the load each one reaches
    assert cells.tolist() == [1, 1, 2, 1, 2]
    assert levels.tolist() == [1, 2, 2, 3, 3]
    # a release this round counts the slot as not free before it
    cells, _ = free_slots(load, cap, serving, 10, np.array([0, 0, 0, 0, 0]))
    assert len(cells) == 1 + 4 + 3  # cell 0: one, cell 1: four, cell 2: three


def _one_cell(call_s: float, episodes: int, cap: int, resolution: float) -> SimConfig:
    cfg = SimConfig(duration_s=600.0, seed=0, max_steps=1, resolution_s=resolution)
    c = cfg.cells
    c.count, c.max_concurrent = 1, cap
    c.switch_to_training_s = c.switch_to_rollout_s = 0.0
    c.train_tokens_per_s, c.step_overhead_s, c.weight_sync_s = 1e12, 0.0, 0.0
    cfg.workload.group_size = episodes
    cfg.workload.max_concurrent_episodes = episodes
    cfg.training.groups_per_step = 1
    return cfg


@pytest.mark.parametrize("resolution", [0.05, 1.0, 10.0])
@pytest.mark.parametrize(("call_s", "cap"), [(3.0, 2), (0.4, 1)])
def test_calls_queue_first_in_first_out_at_their_exact_times(resolution, call_s, cap):
    # 4 one-call episodes on one cell with `cap` slots, no tools: the batch ends after
    # ceil(4 / cap) back-to-back calls, whatever the round length (0.4 s calls chain
    # several times inside a 1 s or 10 s round)
    episodes = 4
    eps = [
        Episode(setup_s=0.0, scoring_s=0.0, prompt_new=[10], output=[5], tool_s=[0.0],
                call_s=[call_s])
        for _ in range(episodes)
    ]  # fmt: skip
    cfg = _one_cell(call_s, episodes, cap, resolution)
    r = simulate(cfg, ColocatedSyncPolicy(), TraceWorkload([eps]))
    assert r.steps == 1
    assert r.step_end_times[0] == pytest.approx(call_s * -(-episodes // cap), abs=1e-6)
    assert r.state_seconds["rollout/serving"] == pytest.approx(call_s * -(-episodes // cap))


def _bursty(resolution: float) -> SimConfig:
    cfg = SimConfig(duration_s=3 * 3600.0, seed=3, resolution_s=resolution)
    cfg.cells.count, cfg.cells.max_concurrent = 6, 8
    w = cfg.workload
    w.max_concurrent_episodes, w.group_size = 64, 4
    w.turns = Dist(median=8.0, sigma=0.5, min=1.0)
    w.tool_s = Dist(median=1.5, sigma=1.2, tail_fraction=0.1, tail_min=20.0)
    w.setup_s, w.scoring_s = Dist(median=2.0), Dist(median=5.0)
    cfg.training.groups_per_step, cfg.training.staleness_bound = 4, 2
    return cfg


@pytest.mark.parametrize(
    "make",
    [lambda: AsyncStalenessPolicy(rollout_cells=4), WaterlevelPolicy],
    ids=["async", "waterlevel"],
)
@pytest.mark.slow
def test_results_converge_as_rounds_shrink(make):
    fine = simulate(_bursty(0.02), make())
    for resolution in (0.5, 2.0):
        coarse = simulate(_bursty(resolution), make())
        assert coarse.rounds < fine.rounds
        assert coarse.trained_tokens == pytest.approx(fine.trained_tokens, rel=0.06)
        assert coarse.slot_utilisation == pytest.approx(fine.slot_utilisation, abs=0.02)
        for state, f in fine.fractions().items():
            assert coarse.fractions()[state] == pytest.approx(f, abs=0.02), state
