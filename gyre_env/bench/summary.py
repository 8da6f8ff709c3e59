"""Benchmark summaries: a results table, a JSON summary and an HTML report with plots.

Episodes whose reward is not valid (``infra_error``) or that were cancelled are listed but
never averaged into scores: an infrastructure failure is not a 0.
"""

from __future__ import annotations

import base64
import html
import io
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from gyre_env._optional import require
from gyre_env.runner import EpisodeResult

TIME_KEYS = ("setup", "model", "tool", "scoring", "agent")


def summarize(results: Sequence[EpisodeResult], wall_s: float | None = None) -> dict:
    """Counts per outcome, mean score over valid episodes, and where the time went."""
    valid = [r for r in results if r.reward_valid and r.score is not None]
    outcomes = Counter(r.outcome for r in results)
    times = {k: sum(r.times.get(k, 0.0) for r in results) for k in (*TIME_KEYS, "wall")}
    summary = {
        "episodes": len(results),
        "completed": sum(
            1 for r in results if r.outcome not in ("infra_error", "cancelled", "killed")
        ),
        "valid": len(valid),
        "outcomes": dict(sorted(outcomes.items())),
        "end_reasons": dict(sorted(Counter(r.end_reason for r in results).items())),
        "mean_score": statistics.fmean(r.score for r in valid) if valid else None,
        "solved": sum(1 for r in valid if r.score >= 1.0),
        "retried_attempts": sum(r.attempts - 1 for r in results),
        "model_calls": sum(r.model_calls for r in results),
        "steps": sum(r.steps for r in results),
        "episode_seconds": times,
        "time_fractions": {
            k: (times[k] / times["wall"] if times["wall"] > 0 else 0.0) for k in TIME_KEYS
        },
        "mean_wait_fraction": (
            statistics.fmean(r.wait_fraction for r in results) if results else 0.0
        ),
        "episodes_waiting_over_30pct": sum(1 for r in results if r.wait_fraction > 0.3),
    }
    if wall_s is not None:
        summary["wall_s"] = wall_s
    return summary


def format_table(results: Sequence[EpisodeResult]) -> str:
    """A plain-text table, one row per episode."""
    head = ("episode", "task", "outcome", "score", "end", "steps", "calls", "wall", "model%")
    rows = [head]
    for r in results:
        wall = r.times.get("wall", 0.0)
        rows.append(
            (
                r.episode_id,
                r.task_id,
                r.outcome,
                "-" if r.score is None else f"{r.score:.3f}",
                r.end_reason,
                str(r.steps),
                str(r.model_calls),
                f"{wall:.1f}s",
                f"{100 * r.wait_fraction:.0f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_summary(summary: dict) -> str:
    mean = summary["mean_score"]
    fr = summary["time_fractions"]
    parts = [
        f"episodes {summary['episodes']}, completed {summary['completed']}, "
        f"valid {summary['valid']}, solved {summary['solved']}, "
        f"mean score {'-' if mean is None else f'{mean:.3f}'}",
        "outcomes: " + ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items()),
        "time: "
        + ", ".join(f"{k} {100 * fr[k]:.0f}%" for k in TIME_KEYS)
        + f" of {summary['episode_seconds']['wall']:.1f} episode-seconds",
    ]
    if "wall_s" in summary:
        parts.append(f"wall time {summary['wall_s']:.1f}s")
    return "\n".join(parts)


# ---------------------------------------------------------------------------- HTML


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plot_scores(results: Sequence[EpisodeResult], plt) -> str:
    """Mean valid score per task (bars); infra errors are shown as a count, not a 0."""
    by_task: dict[str, list[float]] = {}
    for r in results:
        by_task.setdefault(r.task_id or r.episode_id, [])
        if r.reward_valid and r.score is not None:
            by_task[r.task_id or r.episode_id].append(r.score)
    tasks = sorted(by_task)
    means = [statistics.fmean(by_task[t]) if by_task[t] else 0.0 for t in tasks]
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(tasks) + 2), 3.2))
    ax.bar(range(len(tasks)), means, color="#3b7dd8")
    ax.set_xticks(range(len(tasks)), tasks, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean score (valid episodes)")
    ax.set_title("Score per task")
    out = _png(fig)
    plt.close(fig)
    return out


def plot_partial_rewards(results: Sequence[EpisodeResult], plt) -> str:
    """Cumulative reward (the potential Φ in ``potential`` mode) after each step."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for r in results:
        if r.trace:
            ys = [
                s.get("partial") if s.get("partial") is not None else s["cumulative"]
                for s in r.trace
            ]
            ax.plot(range(1, len(ys) + 1), ys, alpha=0.6, linewidth=1, marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("partial reward")
    ax.set_title("Partial reward over steps (one line per episode)")
    out = _png(fig)
    plt.close(fig)
    return out


def plot_time_breakdown(results: Sequence[EpisodeResult], plt) -> str:
    """Stacked seconds per episode: setup, model, tool, scoring, agent."""
    fig, ax = plt.subplots(figsize=(max(5, 0.35 * len(results) + 2), 3.2))
    bottom = [0.0] * len(results)
    for key in TIME_KEYS:
        vals = [r.times.get(key, 0.0) for r in results]
        ax.bar(range(len(results)), vals, bottom=bottom, label=key)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(
        range(len(results)), [r.episode_id for r in results], rotation=60, ha="right", fontsize=7
    )
    ax.set_ylabel("seconds")
    ax.set_title("Time breakdown per episode")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    out = _png(fig)
    plt.close(fig)
    return out


def write_html(
    results: Sequence[EpisodeResult], summary: dict, path: str | Path, title: str = "gyre bench"
) -> Path:
    """A single self-contained HTML file (plots embedded as base64 PNGs)."""
    require("matplotlib", "the bench HTML report")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = [
        ("Score per task", plot_scores(results, plt)),
        ("Partial reward over steps", plot_partial_rewards(results, plt)),
        ("Time breakdown per episode", plot_time_breakdown(results, plt)),
    ]
    esc = html.escape
    body = [
        f"<h1>{esc(title)}</h1>",
        f"<pre>{esc(format_summary(summary))}</pre>",
        *(
            f'<h2>{esc(name)}</h2><img alt="{esc(name)}" src="data:image/png;base64,{data}">'
            for name, data in plots
        ),
        f"<h2>Episodes</h2><pre>{esc(format_table(results))}</pre>",
    ]
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto}</style></head><body>"
        + "\n".join(body)
        + "</body></html>"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
