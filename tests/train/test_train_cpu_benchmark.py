"""benchmarks/train_cpu.py: its statistics (paired differences, standard errors clustered
by task family, the targets) on known numbers, and the whole benchmark end to end at toy
size: the RL run, the three controls from its SFT checkpoint, the measurements and the
no-learning baselines, on real parts (bubblewrap sandboxes, the embedded engine, the
torch trainer). Learning itself is not asserted here: the toy model learns nothing."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "train_cpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("train_cpu_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_clustered_standard_error_by_hand(bench):
    fam = {"t1": "A", "t2": "A", "t3": "B", "t4": "B"}
    c = bench.clustered({"t1": 1.0, "t2": 0.0, "t3": 1.0, "t4": 1.0}, fam)
    # residual sums per family: A 0.25 - 0.75 = -0.5, B 0.25 + 0.25 = 0.5; CR1 factor 2/1
    assert c["mean"] == 0.75 and c["g"] == 2
    assert math.isclose(c["se"], math.sqrt(2 * (0.25 + 0.25)) / 4)
    assert math.isclose(c["lo"], 0.75 - 12.706 * c["se"])


def test_clustering_widens_the_interval_of_correlated_tasks(bench):
    """Eight tasks in two families that move together: clustered by family the error is
    far larger than the same numbers read as eight independent tasks."""
    diffs = {f"t{i}": (1.0 if i < 4 else 0.0) for i in range(8)}
    by_family = bench.clustered(diffs, {t: t < "t4" for t in diffs})
    independent = bench.clustered(diffs, {t: t for t in diffs})
    assert by_family["se"] > 2 * independent["se"]
    assert by_family["lo"] < 0 < independent["lo"]


def _arms(rl: float, ctl: float, tasks: list[str]) -> dict:
    return {
        "sft": {t: 0.0 for t in tasks},
        "rl": {t: rl if i % 2 == 0 else 1.0 for i, t in enumerate(tasks)},
        "a_more_sft": {t: ctl for t in tasks},
        "b_gold_only": {t: ctl / 2 for t in tasks},
        "c_no_gold": {t: 0.0 for t in tasks},
    }


def test_targets_need_every_seed_and_an_interval_above_zero(bench):
    tasks = [f"t{i}" for i in range(12)]
    fam = {t: f"op{i % 4}" for i, t in enumerate(tasks)}
    gold = {t: i < 6 for i, t in enumerate(tasks)}
    base = {"type-guess": {t: 0.25 for t in tasks}, "majority-op": {t: 0.1 for t in tasks}}
    good = bench.analyse({0: _arms(0.8, 0.3, tasks), 1: _arms(0.7, 0.4, tasks)}, base, fam, gold)
    assert good["pooled"]["best_control"] == "a_more_sft"
    assert good["pooled"]["best_baseline"] == "type-guess"
    assert all(t["met"] for t in good["targets"].values()), good["targets"]
    assert math.isclose(good["arms"]["rl"]["mean"], (0.9 + 0.85) / 2)
    # one seed where the best control beats RL: the control target is missed
    bad = bench.analyse({0: _arms(0.8, 0.3, tasks), 1: _arms(0.2, 0.95, tasks)}, base, fam, gold)
    assert bad["per_seed"]["1"]["rl_minus_best_control"]["mean"] < 0
    assert not bad["targets"]["rl_minus_best_control"]["met"]


def test_an_rl_arm_without_gold_steps_has_control_a_alone(bench):
    """Without gold steps (b) would be the SFT checkpoint and (c) the RL arm itself: only
    (a) is run and compared, and the table says the RL arm has no gold steps."""
    from gyre_env.train import load_config

    cfg = load_config(preset="cpu-demo", overrides=["sft.steps_per_iteration=0"])
    assert bench.controls_of(cfg) == ("a_more_sft",)
    assert (
        bench.controls_of(load_config(preset="cpu-demo", overrides=["sft.steps_per_iteration=8"]))
        == bench.CONTROLS
    )
    tasks = [f"t{i}" for i in range(8)]
    fam = {t: f"op{i % 4}" for i, t in enumerate(tasks)}
    base = {"type-guess": {t: 0.25 for t in tasks}}
    arms = {
        s: {k: v for k, v in _arms(0.8, 0.9, tasks).items() if k in ("sft", "rl", "a_more_sft")}
        for s in (0, 1)
    }
    res = bench.analyse(arms, base, fam, {t: True for t in tasks}, ("a_more_sft",))
    assert res["controls"] == ["a_more_sft"] and set(res["arms"]) == {"sft", "rl", "a_more_sft"}
    assert res["pooled"]["best_control"] == "a_more_sft"
    assert math.isclose(res["pooled"]["rl_minus_best_control"]["mean"], 0.9 - 0.9)
    assert bench.labels_of(res)["rl"] == "RL (rollouts only, no gold steps)"
    assert "b_gold_only" not in bench.markdown(res)


def test_control_a_without_any_timed_step_asks_for_its_step_count(bench, tmp_path):
    """An RL run that took no SFT or gold step (RL from ``model.path`` with ``sft.steps =
    0``) leaves control (a) nothing to time: a clear exit naming ``--a-steps``."""
    rows = [{"kind": "iteration", "time_rollout": 9.0, "time_train": 1.0, "time_sync": 0.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit, match="--a-steps N"):
        bench._sft_steps_in(tmp_path)
    rows.append({"kind": "sft", "step_s": 0.5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench._sft_steps_in(tmp_path) == 20  # 10 s of RL at 0.5 s a step


def test_curve_counts_rl_attempts_by_block_and_by_gold(bench, tmp_path, capsys):
    """``--curve`` reads a run folder: RL's attempts (not the gold replays, not the
    evaluations) per block of iterations, on tasks with gold and on tasks without."""
    from gyre_env.tasks.splits import load_splits

    kw = {"names": "fixed", "only": "upper,sum", "phrasings": "words", "gold_phrasing": 0}
    tasks = {"suite": "nano", "train_count": 12, "heldout_count": 2, "seed": 0}
    tasks.update(suite_kwargs=kw, eval_suite_kwargs={}, eval_split="heldout")
    train, _ = load_splits(**tasks)
    with_gold = [t.id for t in train if t.gold_dir]
    without = [t.id for t in train if not t.gold_dir]
    assert with_gold and without
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"tasks": tasks}))
    episodes = [("sft.0", with_gold[0], 1.0), ("eval.0", without[0], 1.0)]  # not counted
    episodes += [("rl.0000.r0", with_gold[0], 1.0), ("rl.0000.r0", without[0], 0.0)]
    episodes += [("rl.0001.r0", without[0], 1.0), ("rl.0001.r0", without[1], 0.0)]
    ended = {("rl.0000.r0", without[0]): "no_tool_call"}  # the format lost once
    lines = [
        json.dumps(
            {
                "session": f"{s}.{t}.0",
                "task_id": t,
                "score": x,
                "reward_valid": True,
                "end_reason": ended.get((s, t), "submitted"),
            }
        )
        for s, t, x in episodes
    ]
    (run / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    rows = bench.curve(run, parts=2)
    assert rows == [
        {
            "iterations": "0-0",
            "gold": {"passed": 1, "attempts": 1},
            "no_gold": {"passed": 0, "attempts": 1},
            "no_tool_call": {"ended": 1, "attempts": 2},
        },
        {
            "iterations": "1-1",
            "gold": {"passed": 0, "attempts": 0},
            "no_gold": {"passed": 1, "attempts": 2},
            "no_tool_call": {"ended": 0, "attempts": 2},
        },
    ]
    assert bench.main(["--curve", str(run)]) == 0
    out = capsys.readouterr().out
    assert "ended without a tool call" in out and "1/2 = 0.50" in out and "0/2 = 0.00" in out
    with pytest.raises(SystemExit):  # a folder that is no run: named, nothing printed
        bench.main(["--curve", str(tmp_path)])
    assert "not a gyre train folder (no config.json or episodes.jsonl)" in capsys.readouterr().err


def test_answers_names_the_operation_each_attempt_wrote(bench, tmp_path, tiny_path, capsys):
    """``--answers`` reads a run folder's store: for RL's attempts at tasks without gold,
    which operation's expression each wrote (around any names), and how many passed."""
    from gyre_env.engines.tiny import load_tokenizer
    from gyre_env.tasks.splits import load_splits
    from gyre_env.trajectory.records import CallRecord
    from gyre_env.trajectory.store import TrajectoryStore

    kw = {"names": "fixed", "only": "upper,sum", "phrasings": "words", "gold_phrasing": 0}
    tasks = {"suite": "nano", "train_count": 12, "heldout_count": 2, "seed": 0}
    tasks.update(suite_kwargs=kw, eval_suite_kwargs={}, eval_split="heldout")
    train, _ = load_splits(**tasks)
    upper = next(t.id for t in train if not t.gold_dir and "-upper-" in t.id)
    gold = next(t.id for t in train if t.gold_dir)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"tasks": tasks}))
    (run / "model-sft").symlink_to(tiny_path)
    tok = load_tokenizer(tiny_path)
    wrote = {  # session -> (task, file the attempt wrote, score)
        "rl.0000.r0.0.a.0": (upper, "def solve(s):\n    return s.upper()\n", 1.0),
        "rl.0000.r0.0.a.1": (upper, "def solve(s):\n    return sum(word)\n", 0.0),
        "rl.0001.r0.0.a.0": (upper, "def solve(s):\n    return sorted(s > 0)\n", 0.0),
        "rl.0001.r0.0.b.0": (gold, "def solve(s):\n    return s.upper()\n", 1.0),  # has gold
    }
    lines = []
    with TrajectoryStore(run / "store.db") as store:
        for session, (task, text, score) in wrote.items():
            call = f'<tool_call>\n{{"name": "write_file", "arguments": {{"content": {json.dumps(text)}}}}}'
            out = tok.encode(call)
            store.write(
                CallRecord(
                    session=session, call_index=0, branch="b0", parent=None, role="main",
                    prompt_ids=[1, 2], output_ids=out, output_logprobs=[-0.5] * len(out),
                    weight_version=0,
                )
            )  # fmt: skip
            ep = {"session": session, "task_id": task, "score": score, "reward_valid": True}
            lines.append(json.dumps(ep))
    (run / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    rows = bench.answers(run, parts=2)
    assert rows == [
        {"iterations": "0-0", "asked": "upper", "attempts": 2, "passed": 1,
         "wrote": {"upper": 1, "sum": 1}},
        {"iterations": "1-1", "asked": "upper", "attempts": 1, "passed": 0, "wrote": {"?": 1}},
    ]  # fmt: skip
    assert bench.main(["--answers", str(run)]) == 0
    printed = capsys.readouterr().out  # three blocks asked, two iterations run
    lines = [" ".join(line.split()) for line in printed.splitlines()[1:]]
    assert lines == [
        "iterations 0-0 upper passed 1/2: wrote upper 1, sum 1",
        "iterations 1-1 upper passed 0/1: wrote ? 1",
    ]
    with pytest.raises(SystemExit):
        bench.main(["--answers", str(tmp_path)])
    assert "not a gyre train folder" in capsys.readouterr().err


def test_show_prints_the_stored_results_and_names_what_is_wrong_with_a_bad_file(
    bench, tmp_path, capsys
):
    """``--show`` on every results file the README cites prints its table; a missing file,
    a file that is not JSON and JSON of another shape are each a usage error that says
    which, not a traceback."""
    results = sorted((SCRIPT.parent / "results").glob("train_cpu*.json"))
    assert len(results) >= 2
    for path in results:
        assert bench.main(["--show", str(path)]) == 0, path
        shown = capsys.readouterr().out
        assert "pass rate" in shown and "measured at " in shown, path
        if path.name == "train_cpu_validation_rl_variants.json":
            assert "kl1fga0.1" in shown
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "other.json").write_text('{"seeds": [0]}')
    for path, says in [
        (tmp_path / "absent.json", "No such file or directory"),
        (tmp_path / "text.json", "not JSON"),
        (tmp_path / "list.json", "not a results file of this benchmark (not a JSON object)"),
        (tmp_path / "other.json", "not a results file of this benchmark (no split, arms"),
    ]:
        with pytest.raises(SystemExit) as e:
            bench.main(["--show", str(path)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"--show {path}: " in err and says in err, err


@pytest.mark.slow
@pytest.mark.bwrap
def test_the_benchmark_runs_every_arm_end_to_end(bench, tmp_path, capsys):
    toy = [
        "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
        "model.context_length=1024", "tasks.train_count=60", "tasks.heldout_count=6",
        "sft.trajectories=4", "sft.steps=2", "sft.batch_size=2", "sft.steps_per_iteration=2",
        "rollout.group_size=2", "rollout.tasks_per_iteration=2", "rollout.max_new_tokens=16",
        "rollout.parallel=4", "schedule.optimizer_steps=1", "schedule.epochs=1",
        "algorithm.skip_zero_variance=false",
    ]  # fmt: skip
    out = tmp_path / "bench"
    argv = ["--seeds", "0", "--iterations", "2", "--eval-attempts", "1", "--no-progress"]
    argv += ["--out", str(out), "--split", "validation", "--parallel", "2"]
    for item in toy:
        argv += ["--set", item]
    assert bench.main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["split"] == "validation" and res["tasks"] == 6 and res["commit"]
    assert set(res["arms"]) == set(bench.ARMS)
    assert set(res["baselines"]) == {"majority-op", "type-guess", "best-op-per-kind"}
    seed = out / "seed0"

    def rows(arm, kind):
        lines = (seed / arm / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    assert len(rows("rl", "rl")) == 2 and len(rows("rl", "ptx")) == 4
    # (b): the RL schedule's gold steps and nothing else
    assert not rows("b_gold_only", "rl") and len(rows("b_gold_only", "ptx")) == 4
    assert [r.get("episodes") for r in rows("b_gold_only", "iteration")] == [None, None]
    # (c): RL steps, no gold steps
    assert len(rows("c_no_gold", "rl")) == 2 and not rows("c_no_gold", "ptx")
    # (a): SFT continued past the checkpoint's 2 steps, at the gold steps' learning rate
    sft = rows("a_more_sft", "sft")
    assert len(sft) > 2 and sft[-1]["lr"] <= 3e-4 + 1e-12
    for arm in bench.ARMS:
        measured = json.loads((seed / "measure" / arm / "per_task.json").read_text())
        assert len(measured["per_task"]) == 6
    printed = capsys.readouterr().out
    assert "RL - best control" in printed and "target rl_minus_sft" in printed
    assert bench.main(["--show", str(out / "results.json")]) == 0  # the README's table
    shown = capsys.readouterr().out
    assert "| RL - best control |" in shown and res["commit"] in shown
