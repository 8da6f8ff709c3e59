"""``gyre train --elastic --cells 2`` end to end on real parts (Docker sandboxes, the
LangGraph agent, the proxy over two embedded engines, the store, torch trainers), with
tiny budgets: the cells switch at runtime and the run's steps, switches and timeline are
written."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TINY = [
    "schedule.epochs=1",  # the toy makes one pass over each iteration's groups
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
    "model.context_length=1024", "tasks.train_count=50", "tasks.heldout_count=2",
    "rollout.group_size=2", "rollout.tasks_per_iteration=2", "rollout.max_new_tokens=16",
    "rollout.max_steps=1", "algorithm.skip_zero_variance=false", "schedule.optimizer_steps=2",
    "sft.trajectories=2", "sft.steps=2", "sft.batch_size=2", "schedule.eval_random=true",
]  # fmt: skip


def _ctrl_c_after_step(checkpointer, n: int):
    """``_checkpointer`` whose hook raises KeyboardInterrupt (a Ctrl-C) right after the
    checkpoint of step ``n``."""

    def make(*args):
        on_step = checkpointer(*args)

        def step(driver):
            on_step(driver)
            if len(driver.result.steps) == n:
                raise KeyboardInterrupt

        return step

    return make


def _checkpointed_groups(out) -> tuple[set[int], int]:
    """The checkpoint's finished groups not yet trained on, and its next group index."""
    import torch

    saved = torch.load(out / "checkpoints" / "elastic.pt", weights_only=False)["driver"]
    return {g["index"] for g in saved["ready"]}, saved["next_index"]


def _no_group_twice(data: dict, carried: set[int], next_index: int) -> None:
    """Steps 3-4 of a resumed run train the groups the checkpoint held ready and new ones
    numbered from its next index on, never a group steps 1-2 trained."""
    before = {i for s in data["steps"][:2] for i in s["group_index"]}
    after = {i for s in data["steps"][2:] for i in s["group_index"]}
    assert after and not after & before and not carried & before
    assert all(i >= next_index for i in after - carried), (after, carried, next_index)


def test_gyre_train_elastic_switches_roles_and_trains(tmp_path, capsys):
    from gyre_env.cli import main

    out = tmp_path / "run"
    sets = [a for kv in TINY for a in ("--set", kv)]
    argv = ["train", "--preset", "cpu-demo", "--elastic", "--cells", "2", "--out", str(out)]
    gold = ["--set", "sft.steps_per_iteration=3"]  # the synchronous loop's: noted, not taken
    assert main([*argv, "--iterations", "1", "--no-progress", *sets, *gold]) == 0
    data = json.loads((out / "elastic.json").read_text())
    assert [s["step"] for s in data["steps"]] == [1, 2]
    captured = capsys.readouterr()
    assert "note: sft.steps_per_iteration=3" in captured.err
    assert any(s["to"] == "TRAINING" for s in data["switches"])
    assert {"stop_admitting", "release", "onload"} <= set(data["switches"][0]["phases"])
    assert {state for _, state, _, _ in data["timeline"]} >= {"rollout", "training"}
    assert (out / "store.db").is_file() and (out / "episodes.jsonl").is_file()
    assert json.loads((out / "config.json").read_text())["sft"]["steps_per_iteration"] == 0
    printed = captured.out
    assert "switches" in printed and "held-out pass rate: random" in printed
    # Warm start (the synchronous loop's phases), then the trained weights evaluated.
    assert [e["phase"] for e in data["evals"]] == ["random", "sft", "rl"]
    assert [e["step"] for e in data["evals"]][1:] == [data["evals"][1]["step"]] + [
        data["evals"][1]["step"] + 2
    ], "the trained weights' eval counts the warm start's steps and the 2 elastic ones"
    assert f"held-out rl (step {data['evals'][2]['step']})" in printed
    assert (out / "warm-start" / "model-sft").is_dir() and (out / "model").is_dir()
    assert all(e["episodes"] == 2 for e in data["evals"])
    # The run as simulator input: every trained group's episodes with their calls, the
    # policy it ran, its steps; the validation simulates it against the measured wall time.
    from gyre_env.sim.trace import load_elastic_trace, validate_elastic

    trace = load_elastic_trace(out)
    trained = {i for s in data["steps"] for i in s["group_index"]}
    assert trace.policy == "waterlevel" and trace.steps == 2 and trace.cells == 2
    assert len(trace.groups) >= len(trained) and trace.calls is not None and len(trace.calls)
    assert all(len(grp) == 2 for grp in trace.groups)  # rollout.group_size episodes each
    assert trace.measured_s == pytest.approx(data["wall_s"])
    rows = validate_elastic(out, fitted_seeds=1)
    assert [v.mode for v in rows] == ["replay", "cell-model", "fitted seed 0", "by-group seed 0"]
    assert all(v.policy == "waterlevel" and v.predicted_s > 0 for v in rows)


def test_gyre_train_elastic_resumes_after_ctrl_c(tmp_path, capsys, monkeypatch):
    """Ctrl-C right after the checkpoint of step 2 (of 4): exit 130, saying so; ``--resume``
    goes on from there to step 4 with new groups (no session stored twice) and ends with
    the held-out evaluations; a resume under another model shape is refused by name."""
    from gyre_env.cli import main
    from gyre_env.train import elastic as elastic_train

    real = elastic_train._checkpointer
    interrupting = _ctrl_c_after_step(real, 2)

    out = tmp_path / "run"
    sets = [a for kv in TINY for a in ("--set", kv)]
    argv = ["train", "--preset", "cpu-demo", "--elastic", "--cells", "2", "--out", str(out),
            "--iterations", "2", "--no-progress", *sets]  # fmt: skip
    monkeypatch.setattr(elastic_train, "_checkpointer", interrupting)
    assert main(argv) == 130
    assert "interrupted after 2 steps; the last checkpoint" in capsys.readouterr().out
    assert (out / "checkpoints" / "elastic.pt").is_file() and not (out / "elastic.json").exists()
    carried, next_index = _checkpointed_groups(out)
    monkeypatch.setattr(elastic_train, "_checkpointer", real)

    assert main([*argv, "--resume", "--set", "model.num_layers=2"]) == 2
    assert "model.num_layers: 1 in the run, 2 now" in capsys.readouterr().err

    assert main([*argv, "--resume"]) == 0
    data = json.loads((out / "elastic.json").read_text())
    assert [s["step"] for s in data["steps"]] == [1, 2, 3, 4]
    _no_group_twice(data, carried, next_index)
    assert [e["phase"] for e in data["evals"]] == ["random", "sft", "rl"]
    # its wall time and groups would be those since the resume: no simulator input
    assert "elastic-trace.json: not written for a resumed run" in capsys.readouterr().out
    assert not (out / "elastic-trace.json").exists()
    # finished: a resume has nothing to continue and says so before any work; with more
    # iterations it trains on, and its evaluation does not collide with the first one's
    assert main([*argv, "--resume"]) == 2
    assert "is finished (4 of 4 steps" in capsys.readouterr().err
    more = [a if a != "2" or argv[i - 1] != "--iterations" else "3" for i, a in enumerate(argv)]
    assert main([*more, "--resume"]) == 0
    data = json.loads((out / "elastic.json").read_text())
    assert [s["step"] for s in data["steps"]] == [1, 2, 3, 4, 5, 6]
    assert (out / "eval-rl").is_dir() and (out / "eval-rl-step6").is_dir()
    assert [e["phase"] for e in data["evals"]] == ["random", "sft", "rl"]


def test_gyre_train_elastic_on_megatron_cells(tmp_path, capsys):
    """``--backend megatron``: every cell's trainer is megatron-core (CPU shim), the core
    sums the satellites' grad buffers and steps; the run trains and evaluates as above."""
    import os

    if not os.environ.get("CI"):
        pytest.importorskip("megatron.core", reason="pip install 'gyre-env[megatron]'")
    from gyre_env.cli import main

    out = tmp_path / "run"
    sets = [a for kv in TINY for a in ("--set", kv)]
    argv = ["train", "--preset", "cpu-demo", "--elastic", "--cells", "2", "--out", str(out),
            "--backend", "megatron", "--iterations", "1", "--no-progress", *sets]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "elastic.json").read_text())
    assert [s["step"] for s in data["steps"]] == [1, 2]
    # (all-zero rewards at this size: zero advantages; the gradient path is checked
    # against one train_step in tests/trainers/test_megatron.py)
    assert all(s["tokens"] > 0 and s["loss"] == s["loss"] for s in data["steps"])
    assert json.loads((out / "config.json").read_text())["backend"] == "megatron"
    assert [e["phase"] for e in data["evals"]] == ["random", "sft", "rl"]
    assert (out / "model" / "config.json").is_file()


def test_gyre_train_elastic_on_ray_ranks_resumes(tmp_path, monkeypatch, capsys):
    """``--ray local``: the trainers are rank actors; Ctrl-C after the checkpoint of step
    2 (the core rank's state fetched from its actor), then ``--resume`` loads it back into
    the ranks and goes on to step 4."""
    import os

    if not os.environ.get("CI"):
        pytest.importorskip("ray", reason="the ray extra (pip install gyre-env[ray])")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    from gyre_env.cli import main
    from gyre_env.train import elastic as elastic_train

    real = elastic_train._checkpointer
    interrupting = _ctrl_c_after_step(real, 2)

    out = tmp_path / "run"
    sets = [a for kv in TINY for a in ("--set", kv)]
    argv = ["train", "--preset", "cpu-demo", "--elastic", "--cells", "2", "--ray", "local",
            "--out", str(out), "--iterations", "2", "--no-progress", *sets]  # fmt: skip
    try:
        monkeypatch.setattr(elastic_train, "_checkpointer", interrupting)
        assert main(argv) == 130
        assert "interrupted after 2 steps; the last checkpoint" in capsys.readouterr().out
        carried, next_index = _checkpointed_groups(out)
        monkeypatch.setattr(elastic_train, "_checkpointer", real)
        assert main([*argv, "--resume"]) == 0
    finally:
        import ray

        ray.shutdown()
    data = json.loads((out / "elastic.json").read_text())
    assert [s["step"] for s in data["steps"]] == [1, 2, 3, 4]
    _no_group_twice(data, carried, next_index)


def test_gyre_train_elastic_stops_on_sigterm_like_ctrl_c_and_bounds_the_loss(
    tmp_path, capsys, monkeypatch
):
    """A preempted elastic run (SIGTERM right after step 1's checkpoint) stops as Ctrl-C
    stops it: exit 130, the last checkpoint named; ``--resume`` finishes. Before, SIGTERM
    killed it outright. The run's loss carries the driver's staleness bound (config.json)
    and its steps count the tokens past it."""
    import os
    import signal

    from gyre_env.cli import main
    from gyre_env.scheduler.driver import ElasticConfig
    from gyre_env.train import elastic as elastic_train

    real, handler = elastic_train._checkpointer, signal.getsignal(signal.SIGTERM)

    def sigterm_after_step_1(*args):
        on_step = real(*args)

        def step(driver):
            on_step(driver)
            if len(driver.result.steps) == 1:
                os.kill(os.getpid(), signal.SIGTERM)

        return step

    out = tmp_path / "run"
    sets = [a for kv in [*TINY, "sft.trajectories=0"] for a in ("--set", kv)]
    argv = ["train", "--preset", "cpu-demo", "--elastic", "--cells", "2", "--out", str(out),
            "--iterations", "1", "--no-progress", *sets]  # fmt: skip
    monkeypatch.setattr(elastic_train, "_checkpointer", sigterm_after_step_1)
    assert main(argv) == 130
    assert "interrupted after 1 steps; the last checkpoint" in capsys.readouterr().out
    assert (out / "checkpoints" / "elastic.pt").is_file() and not (out / "elastic.json").exists()
    assert signal.getsignal(signal.SIGTERM) is handler  # restored
    saved = json.loads((out / "config.json").read_text())
    assert saved["algorithm"]["loss"]["max_staleness"] == ElasticConfig().staleness_bound
    monkeypatch.setattr(elastic_train, "_checkpointer", real)
    assert main([*argv, "--resume"]) == 0
    data = json.loads((out / "elastic.json").read_text())
    assert [s["step"] for s in data["steps"]] == [1, 2]
    assert all("stale_tokens" in s for s in data["steps"])
