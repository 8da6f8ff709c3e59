"""MetricsLogger (JSONL, TensorBoard, W&B) and the HTML report rendered from its record."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

from gyre_env._optional import MissingExtraError
from gyre_env.train.metrics import MetricsLogger, lag_counts
from gyre_env.train.report import SECTIONS, read_metrics, write_report


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _event_accumulator(log_dir: Path):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea_mod.EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


# ---------------------------------------------------------------------------- logger


def test_jsonl_lines_are_written_and_flushed_at_once(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log("sft", {"step": 1, "loss": 2.5, "note": "warmup"})
    # Readable before close: a crash after log() loses nothing.
    (row,) = _lines(tmp_path / "metrics.jsonl")
    assert row["kind"] == "sft" and row["step"] == 1 and row["loss"] == 2.5
    assert row["note"] == "warmup" and isinstance(row["time"], float)
    logger.log("phase", {"phase": "setup", "seconds": 1.0})
    logger.close()
    logger.close()  # idempotent
    assert [r["kind"] for r in _lines(tmp_path / "metrics.jsonl")] == ["sft", "phase"]
    with pytest.raises(RuntimeError):
        logger.log("sft", {"step": 2})


def test_numpy_and_tensor_values_are_plain_json(tmp_path):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log("rl", {"step": np.int64(3), "loss": np.float32(0.5), "kl": torch.tensor(0.25)})
    (row,) = _lines(tmp_path / "metrics.jsonl")
    assert row["step"] == 3 and row["loss"] == 0.5 and row["kl"] == 0.25


def test_reserved_keys_are_rejected(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger, pytest.raises(ValueError):
        logger.log("sft", {"time": 3.0})


def test_resume_appends_and_fresh_run_truncates(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log("sft", {"step": 1, "loss": 1.0})
    with MetricsLogger(tmp_path, tensorboard=False, resume=True) as logger:
        logger.log("sft", {"step": 2, "loss": 0.5})
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == [1, 2]
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log("sft", {"step": 7, "loss": 0.1})
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == [7]


def test_tensorboard_scalars_and_staleness_histogram(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsLogger(tmp_path, config={"lr": 1e-5}) as logger:
        for step in (1, 2):
            logger.log("rl", {"step": step, "iteration": 0, "loss": 0.1 * step, "flag": True})
        logger.log("iteration", {"iteration": 0, "step": 2, "staleness": {"0": 5, "2": 1}})
        logger.log("phase", {"phase": "setup", "seconds": 3.0})  # no step: per-kind counter
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    (row,) = [r for r in _lines(tmp_path / "metrics.jsonl") if r["kind"] == "iteration"]
    assert row["staleness"] == {"0": 5, "2": 1}  # kept as-is in the JSON line

    acc = _event_accumulator(tmp_path / "tensorboard")
    tags = acc.Tags()
    loss = acc.Scalars("rl/loss")
    assert [e.step for e in loss] == [1, 2]
    assert [round(e.value, 6) for e in loss] == [0.1, 0.2]
    assert "rl/flag" not in tags["scalars"] and "rl/step" not in tags["scalars"]
    assert [e.step for e in acc.Scalars("phase/seconds")] == [0]
    (hist,) = acc.Histograms("iteration/staleness")
    assert hist.step == 2
    assert hist.histogram_value.num == 6
    assert list(hist.histogram_value.bucket) == [5, 0, 1]  # lags 0, 1, 2


def test_fresh_run_clears_old_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsLogger(tmp_path) as logger:
        logger.log("sft", {"step": 1, "loss": 9.0})
    with MetricsLogger(tmp_path) as logger:
        logger.log("sft", {"step": 1, "loss": 1.0})
    acc = _event_accumulator(tmp_path / "tensorboard")
    assert [e.value for e in acc.Scalars("sft/loss")] == [1.0]


def test_missing_tensorboard_names_the_train_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import now raises ImportError
    with pytest.raises(MissingExtraError, match=r"gyre-env\[train\]"):
        MetricsLogger(tmp_path)


def test_missing_wandb_names_pip_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingExtraError, match="pip install wandb"):
        MetricsLogger(tmp_path, tensorboard=False, wandb=True)


class _FakeRun:
    """Stands in for the W&B service (a remote API)."""

    def __init__(self, **kwargs):
        self.init_kwargs = kwargs
        self.id = kwargs.get("id") or "run123"
        self.defined: list[tuple] = []
        self.logged: list[dict] = []
        self.finished = False

    def define_metric(self, name, step_metric=None):
        self.defined.append((name, step_metric))

    def log(self, data):
        self.logged.append(data)

    def finish(self):
        self.finished = True


def test_wandb_gets_numeric_values_per_kind(tmp_path, monkeypatch):
    runs: list[_FakeRun] = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(_FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)

    logger = MetricsLogger(
        tmp_path, tensorboard=False, wandb=True, wandb_project="p", run_name="r", config={"a": 1}
    )
    logger.log("rl", {"step": 4, "loss": 0.5, "phase": "rl", "staleness": {"0": 1}})
    logger.close()
    (run,) = runs
    assert run.init_kwargs["project"] == "p" and run.init_kwargs["name"] == "r"
    assert run.init_kwargs["config"] == {"a": 1} and run.init_kwargs["dir"] == str(tmp_path)
    assert run.logged == [{"rl/loss": 0.5, "rl/step": 4}]
    assert ("rl/*", "rl/step") in run.defined and run.finished

    MetricsLogger(tmp_path, tensorboard=False, wandb=True, resume=True).close()
    assert runs[1].init_kwargs["id"] == "run123"  # the same W&B run continues


def test_lag_counts_parses_json_keys():
    assert lag_counts({"2": 1, "0": 3.0}) == {0: 3.0, 2: 1.0}
    with pytest.raises(ValueError):
        lag_counts({"x": 1})


# ---------------------------------------------------------------------------- report


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _full_run() -> list[dict]:
    t = 1000.0
    rows: list[dict] = [
        {"kind": "phase", "phase": "setup", "seconds": 4.0, "time": t},
        {"kind": "eval", "phase": "random", "iteration": 0, "step": 0, "pass_rate": 0.05,
         "mean_score": 0.1, "episodes": 20, "time_eval": 3.0, "time": t + 1},
    ]  # fmt: skip
    for step in range(1, 6):
        rows.append({"kind": "sft", "step": step, "loss": 2.0 / step, "nll": 2.0 / step,
                     "entropy": 1.0, "grad_norm": 0.5, "tokens_per_s": 900.0, "lr": 1e-4})  # fmt: skip
    rows.append({"kind": "eval", "phase": "sft", "iteration": 0, "step": 5, "pass_rate": 0.25})
    rows.append({"kind": "phase", "phase": "sft_train", "seconds": 20.0})
    step = 5
    for it in range(1, 4):
        for _ in range(2):
            step += 1
            rows.append({"kind": "rl", "step": step, "iteration": it, "loss": 0.1,
                         "clip_frac": 0.02 * it, "entropy": 0.9, "kl_ref": 0.01 * it,
                         "approx_kl_behaviour": 0.001, "grad_norm": 0.3, "tokens_per_s": 800.0,
                         "stale_tokens": 10, "lr": 1e-5})  # fmt: skip
        rows.append({"kind": "iteration", "iteration": it, "step": step, "reward_mean": 0.2 * it,
                     "reward_std": 0.1, "pass_rate": 0.1 * it, "zero_variance_groups": 0.25,
                     "episodes": 16, "infra_errors": 0, "rollout_tokens_per_s": 1500.0,
                     "train_tokens_per_s": 700.0, "wait_fraction": 0.3, "time_rollout": 10.0,
                     "time_train": 5.0, "time_sync": 1.0,
                     "staleness": {"0": 12, "1": 4 * it}})  # fmt: skip
        if it % 2 == 1:
            rows.append({"kind": "eval", "phase": "rl", "iteration": it, "step": step,
                         "pass_rate": 0.25 + 0.1 * it, "mean_score": 0.5, "episodes": 20})  # fmt: skip
    rows.append(
        {"kind": "eval", "phase": "control", "iteration": 3, "step": step, "pass_rate": 0.2}
    )
    return rows


def _images(page: str) -> int:
    return len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{100,}"', page))


def test_report_renders_every_section(tmp_path):
    pytest.importorskip("matplotlib")
    _write_jsonl(tmp_path / "metrics.jsonl", _full_run())
    path = write_report(tmp_path, title="demo <run>")
    assert path == tmp_path / "report.html"
    page = path.read_text()
    assert "<h1>demo &lt;run&gt;</h1>" in page
    for title, _, note in SECTIONS:
        assert f"<h2>{title}</h2>" in page
        assert note not in page
    assert _images(page) == len(SECTIONS) == 7
    assert "5.0%" in page and "25.0%" in page  # random and SFT pass rates
    assert "55.0%" in page and "+30.0 points" in page  # last RL eval (iteration 3) - SFT
    # setup 4 + SFT 20 + 3 RL iterations of 10 + 5 + 1 + the random eval's 3: every phase
    total = "total wall time (sum of phases, RL iterations and evals included)"
    assert f"{total}</td><td>75.0s</td>" in page
    assert "control" in page


def test_report_before_any_training(tmp_path):
    """A run stopped after the random-model eval: notes instead of plots, no crash."""
    pytest.importorskip("matplotlib")
    rows = [
        {"kind": "phase", "phase": "setup", "seconds": 2.0, "time": 1.0},
        {"kind": "eval", "phase": "random", "iteration": 0, "pass_rate": 0.0, "time": 2.0},
        {"kind": "phase", "phase": "eval_random", "seconds": 1.5, "time": 3.0},
    ]
    path = tmp_path / "metrics.jsonl"
    _write_jsonl(path, rows)
    with path.open("a") as f:
        f.write('{"kind": "sft", "step": 1, "lo')  # the line a crash cut short
    page = write_report(tmp_path).read_text()
    assert _images(page) == 2  # held-out pass rate (random only) and phase times
    for note in ("No RL iteration was logged.", "No SFT step was logged.",
                 "No RL optimizer step was logged.", "No staleness histogram was logged."):  # fmt: skip
        assert note in page
    assert "1 unreadable line(s)" in page
    assert "<td>3.5s</td>" in page


def test_report_without_metrics_file(tmp_path):
    pytest.importorskip("matplotlib")
    page = write_report(tmp_path).read_text()
    assert _images(page) == 0 and "No metrics in" in page


def test_resumed_steps_keep_the_last_line(tmp_path):
    rows = [
        {"kind": "rl", "step": 1, "loss": 9.0},
        {"kind": "rl", "step": 2, "loss": 9.0},
        {"kind": "rl", "step": 2, "loss": 1.0},  # re-logged after resuming
        {"kind": "rl", "loss": "n/a"},
    ]
    _write_jsonl(tmp_path / "metrics.jsonl", rows)
    by_kind, bad = read_metrics(tmp_path / "metrics.jsonl")
    assert bad == 0
    assert [r.get("step") for r in by_kind["rl"]] == [1, 2, None]
    assert by_kind["rl"][1]["loss"] == 1.0


def test_gold_steps_between_rl_iterations_are_plotted_with_sft(tmp_path):
    """``ptx`` rows (``sft.steps_per_iteration``): their gold NLL goes on the SFT plot (a
    run that resumed keeps each step's last line), even with no SFT rows of the run's own."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gyre_env.train.report import plot_sft

    rows = [{"kind": "ptx", "step": s, "iteration": 0, "nll": 0.5} for s in (3, 4, 4)]
    _write_jsonl(tmp_path / "metrics.jsonl", rows)
    by_kind, _ = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in by_kind["ptx"]] == [3, 4]
    assert plot_sft(by_kind, plt) is not None
    assert plot_sft({"rl": by_kind["ptx"]}, plt) is None


def test_report_shows_the_no_learning_baselines_and_rl_over_the_best(tmp_path):
    pytest.importorskip("matplotlib")
    rows = _full_run() + [
        {"kind": "baseline", "name": "type-guess", "pass_rate": 0.9, "tasks": 44},  # replaced
        {"kind": "baseline", "name": "majority-op", "pass_rate": 0.1, "tasks": 44},
        {"kind": "baseline", "name": "type-guess", "pass_rate": 0.3, "tasks": 44},
        {"kind": "phase", "phase": "baselines", "seconds": 7.0},
    ]
    _write_jsonl(tmp_path / "metrics.jsonl", rows)
    page = write_report(tmp_path).read_text()
    assert "no-learning baseline: type-guess</td><td>30.0%" in page
    assert "no-learning baseline: majority-op</td><td>10.0%" in page
    assert "change, RL - best baseline (type-guess)</td><td>+25.0 points" in page  # 55 - 30
    assert "</td><td>82.0s</td>" in page  # the baselines' 7 s count in the total
