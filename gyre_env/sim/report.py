"""``gyre simulate``'s outputs: ``simulation.json`` and ``report.html``.

The JSON holds, per policy: trained samples and tokens per hour, busy fraction by role,
idle fraction and every state's share of cell time, the staleness histogram, time to N
steps, switches and migrations; the split policies' ``k`` sweeps and the ``[sweep]`` runs.
The HTML page shows the same with a Gantt chart of cell roles per policy and the sweep
plots (matplotlib, the ``plots`` extra).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
from pathlib import Path

from gyre_env.sim.compare import FREE_CELLS_SCALE, Comparison
from gyre_env.sim.config import SimConfig
from gyre_env.sim.simulator import SimResult

STEP_MARKS = (1, 10, 100, 1000)
_COLOURS = {
    "rollout": "#2b8cbe",
    "training": "#e6550d",
    "training idle": "#fdd0a2",
    "switching": "#756bb1",
}


def summary(r: SimResult) -> dict:
    """One policy run as plain numbers."""
    return {
        "policy": r.policy,
        "params": r.params,
        "trained_samples_per_hour": r.samples_per_hour,
        "trained_tokens_per_hour": r.tokens_per_hour,
        "busy_fraction": r.busy_fraction(),
        "idle_fraction": r.idle_fraction(),
        "state_fractions": r.fractions(),
        "slot_utilisation": r.slot_utilisation,
        "steps": r.steps,
        "time_to_steps": {str(n): r.time_to_steps(n) for n in STEP_MARKS},
        "staleness": {str(k): v for k, v in r.staleness.items()},
        "dropped_stale_samples": r.dropped_stale,
        "filtered_groups": r.filtered_groups,
        "switches": r.switches,
        "migrations": r.migrations,
        "rdma_transfer_failed": r.rdma_transfer_failed,
        "simulated_s": r.duration_s,
        "events": r.events,
        "wall_s": r.wall_s,
        "idle_free_tokens_per_hour": r.idle_free_tokens_per_hour(),
        "timeline_s": r.timeline_s,
        "timeline": r.timeline_fractions(),
    }


def to_json(cfg: SimConfig, comp: Comparison) -> dict:
    def brief(r: SimResult) -> dict:
        return {
            "trained_tokens_per_hour": r.tokens_per_hour,
            "trained_samples_per_hour": r.samples_per_hour,
            "busy_fraction": r.busy_fraction(),
            "idle_fraction": r.idle_fraction(),
        }

    return {
        "name": cfg.name,
        "config": dataclasses.asdict(cfg),
        "policies": {n: summary(r) for n, r in comp.results.items()},
        "best_peer": comp.best_peer(),
        "waterlevel_over_best_peer": comp.waterlevel_ratio(),
        "idle_free_ceiling_over_best_peer": comp.ceiling(),
        "bound_ceiling_over_best_peer": comp.bound_ceiling(),
        "bound_run": brief(comp.bound) if comp.bound is not None else None,
        "k_sweeps": {
            n: [{"rollout_cells": k, **brief(r)} for k, r in runs]
            for n, runs in comp.k_sweeps.items()
        },
        "sweeps": {
            what: [
                {"value": v, "policies": {n: brief(r) for n, r in row.items()}} for v, row in rows
            ]
            for what, rows in comp.sweeps.items()
        },
    }


def headline(cfg: SimConfig, comp: Comparison) -> str:
    """The table ``gyre simulate`` prints."""
    lines = [
        f"{cfg.name}: {cfg.cells.count} cells, {cfg.duration_s / 3600:.2f} simulated h",
        f"{'policy':<14}{'samples/h':>11}{'tokens/h':>12}{'busy roll':>10}{'busy train':>11}"
        f"{'idle':>7}{'steps':>7}{'switches':>9}  params",
    ]
    for name, r in comp.results.items():
        b = r.busy_fraction()
        lines.append(
            f"{name:<14}{r.samples_per_hour:>11.1f}{r.tokens_per_hour:>12.3g}"
            f"{b['rollout']:>10.3f}{b['training']:>11.3f}{r.idle_fraction():>7.3f}"
            f"{r.steps:>7}{r.switches:>9}  {r.params or ''}"
        )
    ratio = comp.waterlevel_ratio()
    if ratio is not None:
        lines.append(
            f"waterlevel / best peer ({comp.best_peer()}): {ratio:.2f}x trained tokens; "
            f"idle-free ceiling / best peer: {comp.ceiling():.2f}x"
        )
    if comp.bound_ceiling() is not None:
        lines.append(_bound_line(comp, 2))
    shown = [n for n in ("waterlevel", comp.best_peer()) if n in comp.results]
    for name in shown:
        lines.extend(idle_over_time(comp.results[name]))
    return "\n".join(lines)


TIMELINE_COLUMNS = (
    ("serving", ("rollout/serving",)),
    ("in tools", ("rollout/idle:agents_in_tools",)),
    ("no episodes", ("rollout/idle:no_episodes",)),
    ("training", ("training/step", "training/sync")),
    ("no batch", ("training/idle:no_batch",)),
    ("switching", ("switching",)),
)
"""The timeline table's columns: each a share of the bucket's cell time, summed over the
states named (``in tools``, ``no episodes`` and ``no batch`` are the idle causes)."""


def idle_over_time(r: SimResult) -> list[str]:
    """``r``'s timeline as table lines: per bucket, the trained tokens, each column of
    ``TIMELINE_COLUMNS`` and the samples whose output was all past the staleness bound
    (empty without a timeline)."""
    if not r.timeline:
        return []
    width = r.timeline_s / 3600.0
    head = "".join(f"{c:>12}" for c, _ in TIMELINE_COLUMNS)
    params = f" {r.params}" if r.params else ""
    lines = [
        f"{r.policy}{params}: share of cell time per {r.timeline_s / 60:g} min",
        f"{'from h':>6}{'Mtok':>8}{head}{'steps':>7}{'dropped':>9}",
    ]
    for b, row in enumerate(r.timeline_fractions()):
        cols = "".join(f"{sum(row[s] for s in states):>12.3f}" for _, states in TIMELINE_COLUMNS)
        lines.append(
            f"{b * width:>6.2f}{row['trained_tokens'] / 1e6:>8.1f}{cols}"
            f"{row['steps']:>7.0f}{row['dropped_samples']:>9.0f}"
        )
    return lines


def _bound_line(comp: Comparison, digits: int) -> str:
    """The staleness-bound ceiling, said the same way on the terminal and the page."""
    return (
        f"staleness-bound ceiling / best peer: {comp.bound_ceiling():.{digits}f}x (the async "
        f"policy with {FREE_CELLS_SCALE}x the cells, training and switches free: what one "
        "batch per trainer version can reach, whatever is done with the cells)"
    )


def write_report(cfg: SimConfig, comp: Comparison, out: Path) -> tuple[Path, Path]:
    """``out/simulation.json`` and ``out/report.html``; returns both paths. Without the
    ``plots`` extra the JSON is written all the same and ``MissingExtraError`` (naming the
    install) is raised for the page."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = to_json(cfg, comp)
    json_path = out / "simulation.json"
    json_path.write_text(json.dumps(data, indent=1, default=float), encoding="utf-8")
    html_path = out / "report.html"
    html_path.write_text(_html(cfg, comp), encoding="utf-8")
    return json_path, html_path


def _plt():
    from gyre_env._optional import require

    matplotlib = require("matplotlib", "gyre simulate's HTML report")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return '<img src="data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode() + '">'


def gantt_figure(r: SimResult, max_cells: int = 64):
    """Cell roles over time: one row per cell (the first ``max_cells``)."""
    return gantt_chart(
        r.gantt, r.cells, r.duration_s, f"{r.policy}: cell roles", max_cells=max_cells
    )


def gantt_chart(
    rows, cells: int, duration_s: float, title: str, *, xlabel="simulated seconds", max_cells=64
):
    """A Gantt chart of ``rows`` ``(cell, start, end, state)`` (states as in ``_COLOURS``),
    one row per cell (the first ``max_cells``); each cell's bars of one state carry the SVG
    id ``cell<c>-<state>``. Also drawn by ``gyre train --elastic``'s report."""
    plt = _plt()
    n = min(cells, max_cells)
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.12 * n))
    for label, colour in _COLOURS.items():
        bars = [(t0, t1 - t0, c) for c, t0, t1, lab in rows if lab == label and c < n]
        for c in range(n):
            row = [(a, w) for a, w, cc in bars if cc == c]
            if row:
                bar = ax.broken_barh(
                    row, (c - 0.4, 0.8), color=colour, label=label if c == 0 else None
                )
                bar.set_gid(f"cell{c}-{label.replace(' ', '-')}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLOURS.values()]
    ax.legend(handles, list(_COLOURS), loc="upper right", fontsize=7, ncol=4)
    ax.set(xlabel=xlabel, ylabel="cell", title=title)
    ax.set_xlim(0, duration_s)
    return fig


def _line_figure(title: str, xlabel: str, series: dict[str, tuple[list, list]]):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=name)
    ax.set(title=title, xlabel=xlabel, ylabel="trained tokens / h")
    ax.legend(fontsize=7)
    return fig


def timeline_figure(r: SimResult):
    """``r``'s cell time per timeline bucket, stacked by ``TIMELINE_COLUMNS``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3))
    rows = r.timeline_fractions()
    xs = [b * r.timeline_s / 3600.0 for b in range(len(rows))]
    ys = [[sum(row[s] for s in states) for row in rows] for _, states in TIMELINE_COLUMNS]
    ax.stackplot(xs, ys, labels=[c for c, _ in TIMELINE_COLUMNS], step="post")
    ax.set(title=f"{r.policy}: cell time", xlabel="simulated hours", ylabel="share of cells")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=6, loc="lower left", ncol=3)
    return fig


def _timeline_html(comp: Comparison) -> list[str]:
    """Each policy's idle causes over time, next to the idle-free ceiling."""
    ceiling = comp.ceiling()
    parts = ["<h2>Idle causes over time</h2>"]
    if ceiling is not None:
        parts.append(
            f"<p>waterlevel / best peer ({html.escape(str(comp.best_peer()))}): "
            f"{comp.waterlevel_ratio():.3f}x; idle-free ceiling / best peer: {ceiling:.3f}x "
            "(the most any policy gains by idling less, at the cell time per trained token "
            "the runs spent)</p>"
        )
    if comp.bound_ceiling() is not None:
        parts.append(f"<p>{html.escape(_bound_line(comp, 3))}</p>")
    for r in comp.results.values():
        if r.timeline:
            parts.append("<pre>" + html.escape("\n".join(idle_over_time(r))) + "</pre>")
            parts.append(_png(timeline_figure(r)))
    return parts


def _html(cfg: SimConfig, comp: Comparison) -> str:
    parts = [
        f"<html><head><meta charset='utf-8'><title>{html.escape(cfg.name)}</title></head><body>",
        f"<h1>gyre simulate: {html.escape(cfg.name)}</h1>",
        "<pre>" + html.escape(headline(cfg, comp)) + "</pre>",
        "<h2>Where cell time goes</h2><table border=1 cellpadding=3><tr><th>policy</th>",
    ]
    states = list(next(iter(comp.results.values())).state_seconds) if comp.results else []
    parts.append("".join(f"<th>{html.escape(s)}</th>" for s in states) + "</tr>")
    for name, r in comp.results.items():
        f = r.fractions()
        cells = "".join(f"<td>{f.get(s, 0.0):.3f}</td>" for s in states)
        parts.append(f"<tr><td>{html.escape(name)}</td>{cells}</tr>")
    parts.append("</table>")
    parts.extend(_timeline_html(comp))
    parts.append("<h2>Staleness (samples per version lag)</h2><ul>")
    for name, r in comp.results.items():
        parts.append(f"<li>{html.escape(name)}: {html.escape(str(r.staleness))}</li>")
    parts.append("</ul><h2>Cell roles</h2>")
    for r in comp.results.values():
        if r.gantt:
            parts.append(_png(gantt_figure(r)))
    for name, runs in comp.k_sweeps.items():
        xs = [k for k, _ in runs]
        fig = _line_figure(
            f"{name}: rollout cells k", "k", {name: (xs, [r.tokens_per_hour for _, r in runs])}
        )
        parts.append(_png(fig))
    for what, rows in comp.sweeps.items():
        names = list(rows[0][1]) if rows else []
        series = {
            n: ([v for v, _ in rows], [row[n].tokens_per_hour for _, row in rows]) for n in names
        }
        parts.append(_png(_line_figure(f"sweep: {what}", what, series)))
    parts.append("</body></html>")
    return "\n".join(parts)
