"""The simulator's timeline (each cell state, trained tokens, steps and stale drops per
bucket), one-way workload phases, the non-stationary examples, and the report of idle
causes over time next to the ceiling."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gyre_env.cli import main
from gyre_env.config import ConfigError, from_dict
from gyre_env.scheduler.peers import AsyncStalenessPolicy
from gyre_env.scheduler.policy import WaterlevelPolicy
from gyre_env.sim.config import SimConfig, WorkloadConfig, load_sim_config
from gyre_env.sim.result import STATES
from gyre_env.sim.simulator import simulate
from gyre_env.sim.workload import make_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHANGING = ["curriculum", "growing", "bursts", "slow_tools"]


SMALL = {
    "duration_s": 3 * 3600.0 + 600.0, "seed": 2, "timeline_s": 1800.0,
    "cells": {"count": 4, "max_concurrent": 8},
    "workload": {
        "max_concurrent_episodes": 40, "group_size": 4,
        "turns": {"median": 8.0, "sigma": 0.5, "min": 1.0},
        "tool_s": {"median": 3.0, "sigma": 1.0, "tail_fraction": 0.2, "tail_min": 30.0},
        "setup_s": {"median": 2.0}, "scoring_s": {"median": 5.0},
    },
    "training": {"groups_per_step": 2, "staleness_bound": 1},
}  # fmt: skip
"""Four cells, long-tailed tools and a tight bound: steps, drops and idle cells in 3 h."""


def _small(**over) -> SimConfig:
    return from_dict(SimConfig, {**SMALL, **over})


@pytest.mark.parametrize("policy", [WaterlevelPolicy(), AsyncStalenessPolicy(rollout_cells=3)])
def test_the_timeline_adds_up_to_the_run(policy):
    cfg = _small()
    r = simulate(cfg, policy)
    # 3 h 10 min in buckets of 30 min: seven, the last one 10 minutes long
    assert len(r.timeline) == 7 and r.timeline_s == 1800.0
    for state in STATES:
        total = sum(row[state] for row in r.timeline)
        assert total == pytest.approx(r.state_seconds[state], rel=1e-9, abs=1e-6)
    assert sum(row["trained_tokens"] for row in r.timeline) == r.trained_tokens > 0
    assert sum(row["steps"] for row in r.timeline) == r.steps
    assert sum(row["dropped_samples"] for row in r.timeline) == r.dropped_stale
    shares = r.timeline_fractions()
    for row in shares:  # every bucket's cell time is accounted once, the short last one too
        assert sum(row[s] for s in STATES) == pytest.approx(1.0)
    # a step's tokens land in the bucket it ended in
    for t in r.step_end_times[:3]:
        assert r.timeline[int(t // 1800.0)]["steps"] >= 1


def test_no_timeline_when_turned_off_and_a_bad_width_is_named(tmp_path):
    r = simulate(_small(timeline_s=0.0, duration_s=1200.0), WaterlevelPolicy())
    assert r.timeline == [] and r.timeline_fractions() == []
    bad = tmp_path / "bad.toml"
    bad.write_text("timeline_s = -5.0\n")
    with pytest.raises(ConfigError, match="timeline_s"):
        load_sim_config(bad)


def test_phases_run_once_when_they_do_not_cycle():
    base = dict(group_size=2, turns={"median": 20.0}, max_context_tokens=10**9)
    phases = [{"groups": 2, "turns_scale": 0.25}, {"groups": 1, "turns_scale": 0.5}]
    once = from_dict(WorkloadConfig, {**base, "phases": phases, "phases_cycle": False})
    again = from_dict(WorkloadConfig, {**base, "phases": phases})
    assert [once.phase_of(g).turns_scale for g in range(6)] == [0.25, 0.25, 0.5, 0.5, 0.5, 0.5]
    assert [again.phase_of(g).turns_scale for g in range(6)] == [0.25, 0.25, 0.5] * 2
    work = make_workload(once, seed=0)
    assert {len(e.output) for e in work.group(9)} == {10}


@pytest.mark.parametrize("name", CHANGING)
def test_non_stationary_examples_load_and_change_their_load(name):
    cfg = load_sim_config(EXAMPLES / f"simulate_nl2repo_{name}.toml")
    assert cfg.workload.phases, "a non-stationary example has workload phases"
    scales = {
        (p.turns_scale, p.tool_scale, p.output_scale)
        for p in (cfg.workload.phase_of(g) for g in range(2000))
    }
    assert len(scales) >= 2
    # every split peer sweeps its k over a grid, the waterlevel keeps its defaults
    assert len(cfg.policies.async_staleness.rollout_cells) >= 5
    assert cfg.policies.waterlevel == type(cfg.policies.waterlevel)()


@pytest.mark.slow
def test_simulate_prints_idle_causes_over_time_next_to_the_ceiling(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    text = (EXAMPLES / "simulate_small.toml").read_text().split("[sweep]")[0]
    cfg.write_text(text.replace("seed = 0", "seed = 0\ntimeline_s = 600.0"))
    assert main(["simulate", str(cfg), "--out", str(tmp_path / "out"), "--duration", "1800"]) == 0
    printed = capsys.readouterr().out
    assert "idle-free ceiling / best peer:" in printed
    assert "staleness-bound ceiling / best peer:" in printed
    assert "waterlevel: share of cell time per 10 min" in printed
    assert printed.count("no episodes") >= 2  # waterlevel's table and the best peer's
    data = json.loads((tmp_path / "out" / "simulation.json").read_text())
    assert data["idle_free_ceiling_over_best_peer"] >= data["waterlevel_over_best_peer"] * 0.5
    assert data["bound_ceiling_over_best_peer"] > 1.0  # the small example's cells bind
    for p in data["policies"].values():
        assert len(p["timeline"]) == 3
        assert sum(v for k, v in p["timeline"][1].items() if "/" in k or k == "switching") == (
            pytest.approx(1.0)
        )
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Idle causes over time" in page and "idle-free ceiling / best peer" in page
    assert "staleness-bound ceiling / best peer" in page
    assert page.count("<img") >= 5 + 5 + 2  # Gantt and timeline per policy, two k sweeps


@pytest.mark.parametrize("name", ["growing", "bursts", "slow_tools"])
def test_new_examples_run_with_a_tiny_budget(tmp_path, name):
    out = tmp_path / "out"
    args = ["simulate", str(EXAMPLES / f"simulate_nl2repo_{name}.toml"), "--out", str(out)]
    assert main([*args, "--duration", "60", "--no-sweeps"]) == 0
    data = json.loads((out / "simulation.json").read_text())
    assert data["policies"]["waterlevel"]["simulated_s"] == pytest.approx(60.0)


def test_the_bound_ceiling_frees_the_cells_and_keeps_what_binds_whatever_the_cells_do():
    from gyre_env.sim.compare import bound_run, free_cells

    cfg = _small(duration_s=7200.0)
    free = free_cells(cfg)
    assert free.cells.count == 10 * cfg.cells.count and free.cells.step_overhead_s == 0
    assert free.cells.publish_s == 0 and free.cells.switch_to_training_s < 0.01
    # what no use of the cells changes is left as it was
    assert free.workload == cfg.workload and free.training == cfg.training
    assert cfg.cells.count == 4  # the config itself is untouched
    # cells that share one host's cores get cores of their own (ten times the cells on
    # one host would add none)
    shared = dataclasses.replace(cfg, cells=dataclasses.replace(cfg.cells, shared_host=True))
    assert not free_cells(shared).cells.shared_host and shared.cells.shared_host
    workload = make_workload(cfg.workload, cfg.seed)
    bound = bound_run(cfg, workload)
    for policy in (WaterlevelPolicy(), AsyncStalenessPolicy(rollout_cells=3)):
        assert bound.finished_tokens_per_hour > simulate(cfg, policy, workload).tokens_per_hour
    # fewer agent slots: the bound run loses throughput, however many cells it has
    narrow = _small(duration_s=7200.0)
    narrow.workload.max_concurrent_episodes = 4  # one group at a time: the bound lets 2 run
    assert bound_run(narrow).finished_tokens_per_hour < 0.75 * bound.finished_tokens_per_hour
