"""The HTML report of a training run, rendered from ``out_dir/metrics.jsonl`` alone.

One self-contained page (plots embedded as base64 PNGs): a headline table (held-out pass
rate of the random model, the SFT checkpoint and the last RL eval; total wall time), then
one section per view of the run. A section without data (a run stopped before any RL
iteration, say) is replaced by a one-line note; a missing key or a truncated last line
never stops the report. An elastic run (``gyre train --elastic``: ``cell_state``,
``switch`` and ``cell`` records) adds the cell-role Gantt chart (inline SVG, the
simulator's chart with a marker per switch) and the per-cell busy/idle and switch tables.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from gyre_env._optional import require
from gyre_env.train.metrics import METRICS_FILE, lag_counts

REPORT_FILE = "report.html"
TIME_PARTS = (("time_rollout", "rollout"), ("time_train", "train"), ("time_sync", "sync"))
SIGNALS = ("clip_frac", "entropy", "kl_ref", "grad_norm")

Rows = list[dict]


# ---------------------------------------------------------------------------- reading


def read_metrics(path: Path) -> tuple[dict[str, Rows], int]:
    """Records grouped by kind, and how many lines could not be read (a crash mid-write)."""
    by_kind: dict[str, Rows] = {}
    bad = 0
    if not path.is_file():
        return by_kind, bad
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            by_kind.setdefault(str(row.get("kind")), []).append(row)
        else:
            bad += 1
    # A resumed run re-logs the steps after its last checkpoint: the later line wins.
    for kind, key in (("sft", "step"), ("rl", "step"), ("ptx", "step"), ("iteration", "iteration")):
        if kind in by_kind:
            by_kind[kind] = _last_by(by_kind[kind], key)
    return by_kind, bad


def _last_by(rows: Rows, key: str) -> Rows:
    """Keep the last row per value of ``key`` (rows without it are kept), ordered by it."""
    keyed: dict[float, dict] = {}
    rest = []
    for row in rows:
        k = num(row, key)
        if k is None:
            rest.append(row)
        else:
            keyed[k] = row
    return [keyed[k] for k in sorted(keyed)] + rest


def num(row: dict, key: str) -> float | None:
    """``row[key]`` as a float, or None when it is missing or not a number."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def series(rows: Rows, x: str, y: str) -> tuple[list[float], list[float]]:
    """The (x, y) points of rows that have both as numbers."""
    pts = [(num(r, x), num(r, y)) for r in rows]
    pts = [(a, b) for a, b in pts if a is not None and b is not None]
    return [a for a, _ in pts], [b for _, b in pts]


def last_eval(evals: Rows, phase: str) -> dict | None:
    """The last eval of ``phase`` (highest iteration; file order breaks ties)."""
    rows = [r for r in evals if r.get("phase") == phase and num(r, "pass_rate") is not None]
    if not rows:
        return None
    return max(enumerate(rows), key=lambda ir: (num(ir[1], "iteration") or 0.0, ir[0]))[1]


# ---------------------------------------------------------------------------- headline


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f}s"
    return f"{value / 60:.1f} min" if value < 7200 else f"{value / 3600:.2f} h"


def phase_totals(by_kind: dict[str, Rows]) -> dict[str, float]:
    """Seconds per phase, every phase counted once: the ``phase`` records (setup, gold
    recording, SFT), the RL iterations' rollout / train / sync times, and the evals."""
    totals: dict[str, float] = {}

    def add(name: str, seconds: float | None) -> None:
        if seconds is not None:
            totals[name] = totals.get(name, 0.0) + seconds

    for r in by_kind.get("phase", []):
        add(str(r.get("phase")), num(r, "seconds"))
    for r in by_kind.get("iteration", []):
        for key, label in TIME_PARTS:
            add(f"rl {label}", num(r, key))
    for r in by_kind.get("eval", []):
        add("eval", num(r, "time_eval"))
    return totals


def wall_time(by_kind: dict[str, Rows]) -> tuple[float | None, str]:
    """Total time: the sum over every phase (``phase_totals``), else the span of the
    record timestamps."""
    totals = phase_totals(by_kind)
    if totals:
        return sum(totals.values()), "sum of phases, RL iterations and evals included"
    stamps = [num(r, "time") for rows in by_kind.values() for r in rows]
    stamps = [t for t in stamps if t is not None]
    if len(stamps) >= 2:
        return max(stamps) - min(stamps), "first to last record"
    return None, ""


def headline(by_kind: dict[str, Rows]) -> list[tuple[str, str]]:
    """(label, value) rows of the headline table."""
    evals = by_kind.get("eval", [])
    rate = {p: last_eval(evals, p) for p in ("random", "sft", "rl", "control")}
    pr = {p: (num(r, "pass_rate") if r else None) for p, r in rate.items()}
    rows = [
        ("held-out pass rate, random model", _pct(pr["random"])),
        ("held-out pass rate, SFT checkpoint", _pct(pr["sft"])),
    ]
    rl = rate["rl"]
    it = num(rl, "iteration") if rl else None
    rl_label = "held-out pass rate, last RL eval"
    rows.append((rl_label + (f" (iteration {it:.0f})" if it is not None else ""), _pct(pr["rl"])))
    change = "-"
    if pr["rl"] is not None and pr["sft"] is not None:
        change = f"{100 * (pr['rl'] - pr['sft']):+.1f} points"
    rows.append(("change, RL - SFT", change))
    base = {str(r.get("name")): r for r in by_kind.get("baseline", [])}  # the last of each
    rated = [r for r in base.values() if num(r, "pass_rate") is not None]
    for r in rated:
        rows.append((f"no-learning baseline: {r['name']}", _pct(num(r, "pass_rate"))))
    if rated and pr["rl"] is not None:
        best = max(rated, key=lambda r: num(r, "pass_rate"))
        gain = pr["rl"] - num(best, "pass_rate")
        rows.append((f"change, RL - best baseline ({best['name']})", f"{100 * gain:+.1f} points"))
    if pr["control"] is not None:
        rows.append(("held-out pass rate, control", _pct(pr["control"])))
    iterations = by_kind.get("iteration", [])
    rows.append(("RL iterations", str(len(iterations))))
    rows.append(
        (
            "optimizer steps, SFT / RL",
            f"{len(by_kind.get('sft', []))} / {len(by_kind.get('rl', []))}",
        )
    )
    wall, how = wall_time(by_kind)
    rows.append(("total wall time" + (f" ({how})" if how else ""), _seconds(wall)))
    return rows


# ---------------------------------------------------------------------------- plots


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _done(fig, plt) -> str:
    out = _png(fig)
    plt.close(fig)
    return out


def _svg(fig, plt) -> str:
    """``fig`` as inline SVG markup, its text kept as text (findable in the page)."""
    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # no XML prolog inside HTML


def plot_reward(by_kind: dict[str, Rows], plt) -> str | None:
    """reward_mean with a ±std band and the training pass rate, per RL iteration."""
    rows = by_kind.get("iteration", [])
    xs, mean = series(rows, "iteration", "reward_mean")
    px, pass_rate = series(rows, "iteration", "pass_rate")
    if not xs and not px:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    if xs:
        ax.plot(xs, mean, marker="o", markersize=3, label="reward mean")
        band = [(num(r, "iteration"), num(r, "reward_mean"), num(r, "reward_std")) for r in rows]
        band = [b for b in band if None not in b]
        if band:
            bx = [b[0] for b in band]
            ax.fill_between(
                bx,
                [m - s for _, m, s in band],
                [m + s for _, m, s in band],
                alpha=0.2,
                label="± std",
            )
    if px:
        ax.plot(px, pass_rate, marker="s", markersize=3, label="pass rate (train)")
    ax.set_xlabel("iteration")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Reward over iterations")
    ax.legend(fontsize=8)
    return _done(fig, plt)


def plot_heldout(by_kind: dict[str, Rows], plt) -> str | None:
    """Held-out pass rate by eval phase; random and SFT sit at iteration 0 as reference lines."""
    evals = [r for r in by_kind.get("eval", []) if num(r, "pass_rate") is not None]
    if not evals:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    refs = {"random": ("#888888", "x"), "sft": ("#d8893b", "*")}
    for phase, (color, marker) in refs.items():
        r = last_eval(evals, phase)
        if r is not None:
            y = num(r, "pass_rate")
            ax.axhline(y, color=color, linestyle="--", linewidth=1)
            ax.plot(
                [0],
                [y],
                marker=marker,
                markersize=10,
                color=color,
                linestyle="",
                label=f"{phase} ({_pct(y)})",
            )
    others = sorted({str(r.get("phase")) for r in evals} - set(refs))
    for phase in others:
        xs, ys = series(
            [r for r in evals if str(r.get("phase")) == phase], "iteration", "pass_rate"
        )
        if xs:
            pts = sorted(zip(xs, ys, strict=True))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4, label=phase)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("iteration (SFT = 0)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("pass rate")
    ax.set_title("Held-out pass rate over iterations")
    ax.legend(fontsize=8)
    return _done(fig, plt)


def plot_sft(by_kind: dict[str, Rows], plt) -> str | None:
    """SFT loss (and NLL when logged apart) per optimizer step, and the gold NLL of the
    SFT steps taken between RL iterations (``sft.steps_per_iteration``)."""
    rows = by_kind.get("sft", [])
    curves = [(k, *series(rows, "step", k)) for k in ("loss", "nll")]
    curves.append(("gold nll during RL", *series(by_kind.get("ptx", []), "step", "nll")))
    curves = [c for c in curves if c[1]]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for key, xs, ys in curves:
        ax.plot(xs, ys, linewidth=1.2, label=key)
    ax.set_xlabel("optimizer step")
    ax.set_title("SFT loss")
    ax.legend(fontsize=8)
    return _done(fig, plt)


def plot_signals(by_kind: dict[str, Rows], plt) -> str | None:
    """clip_frac, entropy, kl_ref and grad_norm per RL optimizer step, one panel each."""
    rows = by_kind.get("rl", [])
    curves = {k: series(rows, "step", k) for k in SIGNALS}
    if not any(xs for xs, _ in curves.values()):
        return None
    fig, axes = plt.subplots(2, 2, figsize=(8, 5), sharex=True)
    for ax, (key, (xs, ys)) in zip(axes.flat, curves.items(), strict=True):
        if xs:
            ax.plot(xs, ys, linewidth=1)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(key, fontsize=9)
    for ax in axes[1]:
        ax.set_xlabel("RL step")
    fig.suptitle("Training signals")
    return _done(fig, plt)


def plot_time(by_kind: dict[str, Rows], plt) -> str | None:
    """Stacked rollout/train/sync seconds per iteration, and the wall time of each phase."""
    rows = [r for r in by_kind.get("iteration", []) if num(r, "iteration") is not None]
    rows = [r for r in rows if any(num(r, k) is not None for k, _ in TIME_PARTS)]
    totals = phase_totals(by_kind)
    if not rows and not totals:
        return None
    panels = int(bool(rows)) + int(bool(totals))
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 3.4), squeeze=False)
    axes = list(axes[0])
    if rows:
        ax = axes.pop(0)
        xs = [num(r, "iteration") for r in rows]
        bottom = [0.0] * len(rows)
        for key, label in TIME_PARTS:
            vals = [num(r, key) or 0.0 for r in rows]
            ax.bar(xs, vals, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xlabel("iteration")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("seconds")
        ax.set_title("Per iteration")
        ax.legend(fontsize=8)
    if totals:
        ax = axes.pop(0)
        names = list(totals)
        ax.barh(range(len(names)), [totals[n] for n in names], color="#3b7dd8")
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("seconds")
        ax.set_title("Phase totals")
    fig.suptitle("Where the time went")
    return _done(fig, plt)


def plot_staleness(by_kind: dict[str, Rows], plt) -> str | None:
    """Weight-version lag of the trained samples, summed over all iterations."""
    counts: dict[int, float] = {}
    for r in by_kind.get("iteration", []):
        hist = r.get("staleness")
        if not isinstance(hist, dict):
            continue
        try:
            hist = lag_counts(hist)
        except (TypeError, ValueError):
            continue
        for lag, n in hist.items():
            counts[lag] = counts.get(lag, 0.0) + n
    if not counts:
        return None
    lags = list(range(min(counts), max(counts) + 1))
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(lags, [counts.get(lag, 0) for lag in lags], color="#6a4fb3")
    ax.set_xticks(lags)
    ax.set_xlabel("weight versions behind the trainer")
    ax.set_ylabel("count")
    ax.set_title("Staleness (summed over iterations)")
    return _done(fig, plt)


def plot_throughput(by_kind: dict[str, Rows], plt) -> str | None:
    """Train and rollout tokens per second, per iteration."""
    rows = by_kind.get("iteration", [])
    curves = [
        (label, *series(rows, "iteration", key))
        for key, label in (("train_tokens_per_s", "train"), ("rollout_tokens_per_s", "rollout"))
    ]
    curves = [c for c in curves if c[1]]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for label, xs, ys in curves:
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set_xlabel("iteration")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput")
    ax.legend(fontsize=8)
    return _done(fig, plt)


# (title, plot, note shown when it has no data)
SECTIONS: Sequence[tuple[str, Callable, str]] = (
    ("Reward over iterations", plot_reward, "No RL iteration was logged."),
    ("Held-out pass rate over iterations", plot_heldout, "No held-out evaluation was logged."),
    ("SFT loss", plot_sft, "No SFT step was logged."),
    ("Training signals", plot_signals, "No RL optimizer step was logged."),
    ("Where the time went", plot_time, "No phase or iteration times were logged."),
    ("Staleness", plot_staleness, "No staleness histogram was logged."),
    ("Throughput", plot_throughput, "No throughput was logged."),
)


# ---------------------------------------------------------------------------- HTML


def _table(head: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> str:
    esc = html.escape
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>")
    out += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
    return "".join(out) + "</table>"


def _cell(row: dict, key: str) -> str:
    v = num(row, key)
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.0f}" if v == int(v) else f"{v:.3f}"


def eval_table(by_kind: dict[str, Rows]) -> str:
    """Every held-out evaluation, in the order logged."""
    keys = ("iteration", "step", "pass_rate", "mean_score", "episodes", "time_eval")
    rows = [[str(r.get("phase", "-"))] + [_cell(r, k) for k in keys] for r in by_kind["eval"]]
    return _table(("phase", *keys), rows)


# ---------------------------------------------------------------------------- elastic cells


def plot_cells(by_kind: dict[str, Rows], plt) -> str | None:
    """The cells' roles over the run (``cell_state`` records), a marker at each switch's
    start (SVG id ``switch-<i>``; down: to training, up: to rollout)."""
    from gyre_env.sim.report import gantt_chart

    rows = []
    for r in by_kind.get("cell_state", []):
        cell, start, end = num(r, "cell"), num(r, "start"), num(r, "end")
        if None not in (cell, start, end):
            rows.append((int(cell), start, end, str(r.get("state"))))
    if not rows:
        return None
    cells = max(c for c, *_ in rows) + 1
    end = max(t1 for _, _, t1, _ in rows)
    fig = gantt_chart(
        rows, cells, end, "Cell roles", xlabel="seconds since the elastic phase began"
    )
    ax = fig.axes[0]
    fig.set_size_inches(10, max(2.4, 1.0 + 0.35 * cells))
    for i, sw in enumerate(by_kind.get("switch", [])):
        cell, start = num(sw, "cell"), num(sw, "start")
        if cell is not None and start is not None:
            down = sw.get("to") == "TRAINING"
            ax.plot([start], [cell], marker="v" if down else "^", color="black", markersize=6,
                    linestyle="", zorder=5, gid=f"switch-{i}")  # fmt: skip
    if cells <= 32:
        ax.set_yticks(range(cells), [f"cell {c}" for c in range(cells)])
    return _svg(fig, plt)


def cell_table(by_kind: dict[str, Rows]) -> str | None:
    """Per cell: share of its time busy by role, switching, and idle by reason."""
    rows = sorted(
        (r for r in by_kind.get("cell", []) if num(r, "cell") is not None),
        key=lambda r: num(r, "cell"),
    )
    if not rows:
        return None
    fixed = ("busy", "rollout_busy", "training_busy", "switching", "idle")
    reasons = sorted({k for r in rows for k in r if "/idle:" in k})
    body = [
        [f"cell {num(r, 'cell'):.0f}"] + [_pct(num(r, k)) for k in (*fixed, *reasons)] for r in rows
    ]
    head = ("cell", "busy", "busy: rollout", "busy: training", "switching", "idle")
    return _table((*head, *(k.replace("/idle:", " idle: ") for k in reasons)), body)


def switch_table(by_kind: dict[str, Rows]) -> str | None:
    """Per cell and direction: how many switches, their mean time and mean phase times."""
    groups: dict[tuple[float, str], Rows] = {}
    for r in by_kind.get("switch", []):
        if num(r, "cell") is not None and num(r, "total_s") is not None:
            groups.setdefault((num(r, "cell"), str(r.get("to"))), []).append(r)
    if not groups:
        return None
    body = []
    for (cell, to), rs in sorted(groups.items()):
        phases: dict[str, list[float]] = {}
        for r in rs:
            for name, sec in (r.get("phases") or {}).items():
                if isinstance(sec, int | float):
                    phases.setdefault(name, []).append(float(sec))
        mean_ms = 1000 * sum(num(r, "total_s") for r in rs) / len(rs)
        parts = ", ".join(f"{k} {1000 * sum(v) / len(v):.1f}" for k, v in phases.items())
        body.append([f"cell {cell:.0f}", f"-> {to}", str(len(rs)), f"{mean_ms:.1f}", parts])
    return _table(("cell", "to", "switches", "mean ms", "mean ms per phase"), body)


def elastic_sections(by_kind: dict[str, Rows], plt) -> list[str]:
    """The elastic run's HTML (nothing for a run without elastic cells)."""
    gantt = plot_cells(by_kind, plt)
    tables = [
        (t, f(by_kind)) for t, f in (("Cell busy and idle", cell_table), ("Switches", switch_table))
    ]
    if gantt is None and not any(html_ for _, html_ in tables):
        return []
    out = ["<h2>Cell roles</h2>", gantt or "<p class='note'>No cell timeline was logged.</p>"]
    for title, html_ in tables:
        out.append(f"<h2>{html.escape(title)}</h2>")
        out.append(html_ or f"<p class='note'>No {html.escape(title.lower())} were logged.</p>")
    return out


def write_report(out_dir: Path, title: str = "gyre train") -> Path:
    """Render ``out_dir/metrics.jsonl`` into a self-contained ``out_dir/report.html``."""
    require("matplotlib", "the training HTML report")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    by_kind, bad = read_metrics(out_dir / METRICS_FILE)
    esc = html.escape
    body = [f"<h1>{esc(title)}</h1>", _table(None, headline(by_kind))]
    if not by_kind:
        body.append(f"<p class='note'>No metrics in {esc(str(out_dir / METRICS_FILE))}.</p>")
    if bad:
        body.append(f"<p class='note'>{bad} unreadable line(s) in metrics.jsonl were skipped.</p>")
    for name, plot, note in SECTIONS:
        body.append(f"<h2>{esc(name)}</h2>")
        data = plot(by_kind, plt)
        if data is None:
            body.append(f"<p class='note'>{esc(note)}</p>")
        else:
            body.append(f'<img alt="{esc(name)}" src="data:image/png;base64,{data}">')
        if name.startswith("Held-out") and by_kind.get("eval"):
            body.append(eval_table(by_kind))
    body += elastic_sections(by_kind, plt)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:.25em .6em;text-align:left}.note{color:#777;font-style:italic}"
        "</style></head><body>" + "\n".join(body) + "</body></html>"
    )
    path = out_dir / REPORT_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a report
    return path
