"""A synthetic ``gyre train`` run folder: the simulator predicts its wall time from its
inputs. The run is built from a known schedule (2 agent slots, episodes of known times,
one engine serving both), so the measured wall time is exact."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from gyre_env.scheduler.peers import ColocatedSyncPolicy
from gyre_env.sim.simulator import simulate
from gyre_env.sim.trace import fit_cells, load_run, trace_config, validate_run
from gyre_env.sim.workload import TraceWorkload

GROUPS, SIZE, ITERS, PARALLEL = 2, 2, 3, 2


def _episode_times(rng):
    return {
        "setup": float(rng.uniform(1, 2)),
        "model": float(rng.uniform(1, 3)),
        "tool": float(rng.uniform(0, 1)),
        "scoring": float(rng.uniform(2, 4)),
        "agent": 0.2,
    }


def make_run(folder, seed=0, gold_steps=0):
    """Episodes of 1 call + 1 tool, 2 slots, up to 2 optimizer steps per iteration, then
    ``gold_steps`` gold SFT steps (``ptx``, logged with their time as the loop does)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "rollout": {"tasks_per_iteration": GROUPS, "group_size": SIZE, "parallel": PARALLEL},
        "schedule": {"optimizer_steps": 2},
        "algorithm": {"skip_zero_variance": True},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    db = sqlite3.connect(folder / "store.db")
    db.execute(
        "CREATE TABLE calls (session TEXT, call_index INTEGER, prompt_len INTEGER, "
        "output_ids BLOB, meta TEXT)"
    )
    episodes, metrics, now = [], [{"kind": "eval", "time": 1000.0}], 1000.0
    for it in range(ITERS):
        slots = [now] * PARALLEL
        for g in range(GROUPS):
            for k in range(SIZE):
                t = _episode_times(rng)
                t["wall"] = sum(t.values())
                start = min(slots)
                slots[slots.index(start)] = start + t["wall"]
                sid = f"rl.{it:04d}.r0.{g}.task{g}.{k}"
                episodes.append({
                    "episode_id": sid, "session": sid, "group": f"task{g}", "outcome": "ok",
                    "score": float(k % 2 if g == 0 else 0.0), "model_calls": 1, "times": t,
                    "trace": [{"tool": "run", "seconds": t["tool"], "after_call": 0},
                              {"tool": "submit", "seconds": t["scoring"], "after_call": 0}],
                })  # fmt: skip
                meta = {"prefix_len": 0, "created": start + t["setup"],
                        "timings": {"total": t["model"], "prefill": 0.1 * t["model"],
                                    "decode": 0.9 * t["model"]}}  # fmt: skip
                db.execute(
                    "INSERT INTO calls VALUES (?, 0, 500, ?, ?)",
                    (sid, np.zeros(64, "<i4").tobytes(), json.dumps(meta)),
                )
        rollout_end = max(slots)
        steps = [0.6]  # one group has signal (group 0: scores 0, 1): min(2, 1) steps
        for s in steps:
            metrics.append({"kind": "rl", "iteration": it, "step_s": s, "tokens": 564})
        for k in range(gold_steps):
            done = rollout_end + sum(steps) + 0.4 * (k + 1)
            metrics.append({"kind": "ptx", "time": done, "iteration": it, "step_s": 0.4})
        now = rollout_end + sum(steps) + 0.4 * gold_steps + 0.01
        metrics.append({"kind": "iteration", "time": now, "iteration": it, "time_sync": 0.01})
    db.commit()
    db.close()
    (folder / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return folder


def test_load_run_reads_inputs_and_measured_walls(tmp_path):
    trace = load_run(make_run(tmp_path / "run"))
    assert trace.iterations == ITERS and len(trace.groups) == GROUPS * ITERS
    assert [g[0].trained for g in trace.groups[:2]] == [True, False]  # zero-variance group
    ep = trace.groups[0][0]
    assert ep.output == [64] and ep.prompt_new == [500] and len(ep.call_s) == 1
    cells = fit_cells(trace)
    assert cells.count == 1 and cells.max_concurrent == PARALLEL
    assert cells.train_tokens_per_s > 0 and cells.weight_sync_s == pytest.approx(0.01)


def test_replay_predicts_the_synthetic_run(tmp_path):
    trace = load_run(make_run(tmp_path / "run"))
    r = simulate(trace_config(trace), ColocatedSyncPolicy(), TraceWorkload(trace.groups))
    measured = sum(trace.measured_s)
    assert r.duration_s == pytest.approx(measured, rel=0.05)
    assert r.steps == ITERS


def test_gold_steps_count_in_the_iterations_wall_and_training_time(tmp_path):
    """A run with ``sft.steps_per_iteration``: each iteration's wall runs from the record
    before it (not from its last gold step), and the replay prices the gold steps."""
    trace = load_run(make_run(tmp_path / "run", gold_steps=3))
    plain = load_run(make_run(tmp_path / "plain"))
    assert trace.measured_s == pytest.approx([w + 1.2 for w in plain.measured_s])
    assert [(steps, secs) for _, steps, secs in trace.step_tokens] == [(4, pytest.approx(1.8))] * 3
    r = simulate(trace_config(trace), ColocatedSyncPolicy(), TraceWorkload(trace.groups))
    assert r.duration_s == pytest.approx(sum(trace.measured_s), rel=0.05)


def test_validate_run_reports_every_mode_within_tolerance(tmp_path):
    rows = validate_run(make_run(tmp_path / "run"), fitted_seeds=2)
    assert [v.mode for v in rows] == [
        "replay",
        "cell-model",
        "fitted seed 0",
        "fitted seed 1",
        "by-group seed 0",
        "by-group seed 1",
    ]
    assert all(
        v.policy == "colocated" and v.count == ITERS and v.unit == "iterations" for v in rows
    )
    assert abs(rows[0].error) < 0.05
    assert all(abs(v.error) < 0.3 for v in rows)  # a 12-episode run: fitted draws vary
