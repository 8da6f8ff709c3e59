"""Metrics of a training run: one JSON line per record, mirrored to TensorBoard and W&B.

``out_dir/metrics.jsonl`` is the record of truth: every ``log`` call appends one line
``{"kind": ..., "time": ..., **values}`` and flushes it, so a crash loses nothing already
logged, and ``gyre_env.train.report`` renders the HTML report from it alone. TensorBoard
(default on) and W&B (off unless asked) get the numeric values as ``"{kind}/{key}"``;
anything else (strings, lists, nested dicts) stays in the JSON line only. The one
exception is ``"staleness"``, a ``{lag: count}`` dict that TensorBoard gets as a histogram.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from pathlib import Path
from typing import IO, Any

from gyre_env._optional import require

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_run_id"
HISTOGRAM_KEYS = ("staleness",)
"""Keys whose value is a ``{lag: count}`` dict, logged to TensorBoard as a histogram."""
_RESERVED = ("kind", "time")


def scalar(value: Any) -> float | None:
    """``value`` as a float if it is one number (int, float, numpy or 0-d tensor), else None.

    Booleans are not numbers here: a flag is not a curve.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # 0-d array or tensor
        item = value.item()
        return None if isinstance(item, bool) else float(item)
    return None


def _json_default(value: Any) -> Any:
    """numpy scalars/arrays and tensors become plain lists or numbers; anything else is an error."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"metric value of type {type(value).__name__} is not JSON-serialisable")


def lag_counts(counts: dict) -> dict[int, float]:
    """``{lag: count}`` with lags as ints (JSON writes the keys as strings), sorted by lag.

    Raises ValueError for a lag that is not an integer or a count that is negative.
    """
    out: dict[int, float] = {}
    for lag, count in counts.items():
        n = scalar(count)
        if n is None or n < 0:
            raise ValueError(f"histogram count {count!r} for lag {lag!r} is not a count")
        out[int(lag)] = out.get(int(lag), 0.0) + n
    return dict(sorted(out.items()))


def _count_kinds(path: Path) -> dict[str, int]:
    """How many records of each kind ``path`` holds (unreadable lines are not counted)."""
    counts: dict[str, int] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                kind = json.loads(line).get("kind")
            except (json.JSONDecodeError, AttributeError):
                continue
            counts[str(kind)] = counts.get(str(kind), 0) + 1
    return counts


class MetricsLogger:
    """Appends metric records to ``out_dir/metrics.jsonl`` and mirrors them to TensorBoard/W&B.

    ``resume=False`` starts a fresh record (an existing metrics.jsonl is truncated and old
    TensorBoard event files under ``out_dir/tensorboard`` are removed, so the two agree);
    ``resume=True`` appends to both and, with W&B, continues the same W&B run.
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "gyre",
        run_name: str = "train",
        config: dict | None = None,
        resume: bool = False,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / METRICS_FILE
        # Per-kind record counts: the x-axis of records without a "step" (continued on resume).
        self._counters: dict[str, int] = _count_kinds(self.path) if resume else {}
        self._writer = self._open_tensorboard(config, resume) if tensorboard else None
        try:
            self._wandb = (
                self._init_wandb(wandb_project, run_name, config, resume) if wandb else None
            )
        except BaseException:
            if self._writer is not None:
                self._writer.close()
            raise
        self._wandb_kinds: set[str] = set()
        self._file: IO[str] | None = self.path.open("a" if resume else "w", encoding="utf-8")

    # ------------------------------------------------------------------ backends

    def _open_tensorboard(self, config: dict | None, resume: bool):
        require("tensorboard", "TensorBoard logging")
        require("torch", "TensorBoard logging")
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.out_dir / TENSORBOARD_DIR
        if not resume and log_dir.is_dir():
            for old in log_dir.glob("events.out.tfevents.*"):
                old.unlink()
        writer = SummaryWriter(log_dir=str(log_dir))
        if config is not None and not resume:
            text = json.dumps(config, indent=2, sort_keys=True, default=str)
            writer.add_text("config", "```\n" + text + "\n```", global_step=0)
        return writer

    def _init_wandb(self, project: str, run_name: str, config: dict | None, resume: bool):
        wandb = require("wandb", "W&B logging")
        id_file = self.out_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        run = wandb.init(
            project=project,
            name=run_name,
            config=config,
            dir=str(self.out_dir),
            id=run_id,
            resume="allow" if run_id else None,
        )
        if getattr(run, "id", None):
            id_file.write_text(str(run.id))
        return run

    # ------------------------------------------------------------------ logging

    def log(self, kind: str, values: dict) -> None:
        """Append ``{"kind": kind, "time": now, **values}`` and mirror the numeric values.

        The x-axis is ``values["step"]``; records without one are numbered per kind.
        """
        if self._file is None:
            raise RuntimeError("MetricsLogger.log after close()")
        clash = [k for k in _RESERVED if k in values]
        if clash:
            raise ValueError(f"metric keys {clash} are reserved by the record itself")
        record = {"kind": kind, "time": time.time(), **values}
        self._file.write(json.dumps(record, default=_json_default) + "\n")
        self._file.flush()

        count = self._counters.get(kind, 0)
        self._counters[kind] = count + 1
        step_value = scalar(values.get("step"))
        step = int(step_value) if step_value is not None else count
        numeric = {k: v for k, v in ((k, scalar(v)) for k, v in values.items()) if v is not None}
        numeric.pop("step", None)
        if self._writer is not None:
            self._log_tensorboard(kind, values, numeric, step)
        if self._wandb is not None:
            self._log_wandb(kind, numeric, step)

    def _log_tensorboard(self, kind: str, values: dict, numeric: dict, step: int) -> None:
        for key, value in numeric.items():
            if math.isfinite(value):
                self._writer.add_scalar(f"{kind}/{key}", value, global_step=step)
        for key in HISTOGRAM_KEYS:
            if isinstance(values.get(key), dict):
                self._log_histogram(f"{kind}/{key}", lag_counts(values[key]), step)

    def _log_histogram(self, tag: str, counts: dict[int, float], step: int) -> None:
        """One bucket per integer lag, written from the counts (the samples may be millions of
        tokens: expanding them into values just to re-bin them would cost memory for nothing)."""
        total = sum(counts.values())
        if total <= 0:
            return
        present = [lag for lag, n in counts.items() if n > 0]
        lags = range(min(present), max(present) + 1)  # no gaps: a bucket spans one lag
        self._writer.add_histogram_raw(
            tag,
            min=float(lags[0]),
            max=float(lags[-1]),
            num=total,
            sum=sum(lag * n for lag, n in counts.items()),
            sum_squares=sum(lag * lag * n for lag, n in counts.items()),
            bucket_limits=[lag + 0.5 for lag in lags],  # right edges
            bucket_counts=[counts.get(lag, 0.0) for lag in lags],
            global_step=step,
        )

    def _log_wandb(self, kind: str, numeric: dict, step: int) -> None:
        # Each kind has its own x-axis ("sft/step", "rl/step", ...): W&B's global step must
        # only grow, and SFT steps, RL steps and per-kind counters do not share one order.
        if kind not in self._wandb_kinds:
            self._wandb_kinds.add(kind)
            self._wandb.define_metric(f"{kind}/step")
            self._wandb.define_metric(f"{kind}/*", step_metric=f"{kind}/step")
        data = {f"{kind}/{k}": v for k, v in numeric.items()}
        data[f"{kind}/step"] = step
        self._wandb.log(data)

    def close(self) -> None:
        """Flush and close the JSON file, the TensorBoard writer and the W&B run (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
