"""Real runs as simulator input, and their measured wall times: trace fitting.

Two kinds of run are read.

**A synchronous ``gyre train`` run folder** (:func:`load_run`, :func:`validate_run`).
Inputs taken from the trace: each RL episode's setup, tool, agent and scoring times and
its calls (tokens from ``store.db``, measured call times), the optimizer steps' times
and tokens (``metrics.jsonl`` ``rl`` records), the weight push time, and the run's shape
(``config.json``: agent slots, batch, optimizer steps). Outputs kept apart for checking:
each RL iteration's wall time (from the previous record to its ``iteration`` record, so
held-out evaluations between iterations are not part of it).

**An elastic run** (:func:`load_elastic_trace`, :func:`validate_elastic`). The trace
(``elastic-trace.json``, written by :func:`write_elastic_trace` for every ``gyre train
--elastic`` run and for ``benchmarks/elastic.py --trace-out``) holds the run's shape
(cells, batch, staleness bound, agent slots, the policy and its parameters), every
finished group's calls (new prompt tokens, output tokens, start, queue and service
seconds, the engine that served it) and tool waits, its optimizer steps (groups, cells,
seconds) and its switches (direction, seconds). :func:`validate_elastic` simulates the
same policy on it three ways, as :func:`validate_run` does for the synchronous loop:
replaying the measured call times, pricing calls with the cell model fitted to them, and
drawing fresh episodes from distributions fitted to the trace. Measured: the run's wall
time from its start to its last step (``wall_s``), never an input.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gyre_env.sim.config import CellConfig, Dist, SimConfig, TrainingConfig, WorkloadConfig
from gyre_env.sim.workload import Episode

_RL_ID = re.compile(r"^rl\.(\d+)\.r\d+\.(\d+)\..*\.(\d+)$")


@dataclass
class RunTrace:
    """What :func:`load_run` read from a run folder."""

    folder: Path
    groups: list[list[Episode]]
    """RL groups in the order the run started them."""
    groups_per_iteration: int
    steps_per_iteration: int
    parallel: int
    group_size: int
    measured_s: list[float]
    """Measured wall time of each RL iteration."""
    step_tokens: list[tuple[int, float, float]] = field(default_factory=list)
    """Per iteration: (trained episode tokens, optimizer steps, summed step seconds)."""
    sync_s: float = 0.0
    calls: np.ndarray | None = None
    """[n, 5]: new prompt tokens, output tokens, prefill s, decode s, calls in flight."""

    @property
    def iterations(self) -> int:
        return len(self.measured_s)


def _records(folder: Path, name: str) -> list[dict]:
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a gyre train run folder: no {name}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _store_calls(folder: Path) -> dict[str, list[dict]]:
    """session -> its calls in order: new prompt tokens, output tokens and timings."""
    path = folder / "store.db"
    if not path.is_file():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT session, prompt_len, length(output_ids) / 4, meta FROM calls "
            "ORDER BY session, call_index"
        ).fetchall()
    finally:
        db.close()
    out: dict[str, list[dict]] = {}
    for session, prompt_len, n_out, meta in rows:
        m = json.loads(meta)
        tm = m.get("timings", {})
        total = float(tm.get("total", 0.0))
        out.setdefault(session, []).append(
            dict(
                new=max(int(prompt_len) - int(m.get("prefix_len") or 0), 0),
                out=int(n_out),
                total=total,
                prefill=float(tm.get("prefill", 0.0)),
                decode=float(tm.get("decode", 0.0)),
                # ``created`` is when the proxy took the request (time.time())
                end=float(m.get("created", 0.0)) + total,
            )
        )
    return out


def _episode(rec: dict, calls: list[dict], trained: bool) -> Episode:
    """One episodes.jsonl record as an Episode: per-call times replayed (the store's call
    times scaled to the agent-side model time), tool time after each call from the trace,
    agent overhead shared evenly between the turns."""
    t = rec["times"]
    n = len(calls) or int(rec.get("model_calls", 0))
    if not n:
        return Episode(
            setup_s=t["setup"], scoring_s=t["scoring"] + t["tool"] + t["agent"],
            prompt_new=[], output=[], tool_s=[], call_s=[], trained=trained,
        )  # fmt: skip
    tool = [0.0] * n
    for step in rec.get("trace", []):
        if step.get("tool") != "submit":
            tool[min(int(step.get("after_call", 0)), n - 1)] += float(step["seconds"])
    scale = t["tool"] / sum(tool) if sum(tool) > 0 else 0.0
    tool = [x * scale + t["agent"] / n for x in tool]
    if not sum(tool) and t["tool"]:
        tool = [t["tool"] / n + t["agent"] / n] * n
    engine = [c["total"] for c in calls] if calls else [t["model"] / n] * n
    model_scale = t["model"] / sum(engine) if sum(engine) > 0 else 1.0
    return Episode(
        setup_s=t["setup"],
        scoring_s=t["scoring"],
        prompt_new=[c["new"] for c in calls] if calls else [0] * n,
        output=[c["out"] for c in calls] if calls else [0] * n,
        tool_s=tool,
        call_s=[x * model_scale for x in engine],
        trained=trained,
    )


def load_run(folder: str | Path) -> RunTrace:
    """Read a ``gyre train`` run folder (see the module doc)."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    rollout, schedule = cfg["rollout"], cfg["schedule"]
    skip_zero = bool(cfg.get("algorithm", {}).get("skip_zero_variance", True))
    metrics = _records(folder, "metrics.jsonl")
    store = _store_calls(folder)
    by_iter: dict[int, dict[str, list]] = {}
    for rec in _records(folder, "episodes.jsonl"):
        m = _RL_ID.match(rec["episode_id"])
        if m and rec.get("outcome") != "infra_error":
            key = (int(m[2]), int(m[3]))
            by_iter.setdefault(int(m[1]), {}).setdefault(rec["group"], []).append((key, rec))
    iterations = [r for r in metrics if r.get("kind") == "iteration"]
    groups: list[list[Episode]] = []
    step_tokens = []
    for it in sorted(by_iter):
        ordered = sorted(by_iter[it].values(), key=lambda g: min(k for k, _ in g))
        tokens = 0
        for members in ordered:
            members.sort(key=lambda kr: kr[0])
            scores = {r.get("score") for _, r in members}
            trained = not (skip_zero and len(scores) <= 1)
            grp = [_episode(r, store.get(r["session"], []), trained) for _, r in members]
            tokens += sum(e.tokens for e in grp) if trained else 0
            groups.append(grp)
        # RL steps and the gold SFT steps after them (``ptx``, sft.steps_per_iteration):
        # the fitted per-step overhead carries the gold steps' time
        steps = [r for r in metrics if r.get("kind") in _STEPS and r.get("iteration") == it]
        step_tokens.append((tokens, len(steps), sum(r["step_s"] for r in steps)))
    return RunTrace(
        folder=folder,
        groups=groups,
        groups_per_iteration=int(rollout["tasks_per_iteration"]),
        steps_per_iteration=int(schedule["optimizer_steps"]),
        parallel=int(rollout["parallel"]),
        group_size=int(rollout["group_size"]),
        measured_s=_iteration_walls(metrics),
        step_tokens=step_tokens,
        sync_s=float(np.mean([r["time_sync"] for r in iterations])) if iterations else 0.0,
        calls=_call_table(store),
    )


_STEPS = ("rl", "ptx")
"""Optimizer steps inside an RL iteration (``gyre train``'s metrics kinds)."""


def _iteration_walls(metrics: list[dict]) -> list[float]:
    """Each ``iteration`` record's time minus the record before it (an eval, a phase or the
    previous iteration)."""
    out, prev = [], None
    for r in metrics:
        if r.get("kind") in (*_STEPS, "sft"):
            continue
        if r.get("kind") == "iteration" and prev is not None:
            out.append(r["time"] - prev)
        prev = r["time"]
    return out


def in_flight_at_start(starts, ends, keys) -> np.ndarray:
    """Per call, the calls in flight on its engine (``keys``) when it starts, itself
    included."""
    starts, ends, keys = np.asarray(starts), np.asarray(ends), np.asarray(keys)
    out = np.zeros(len(starts), np.int64)
    for key in np.unique(keys):
        m = keys == key
        order_s, order_e = np.sort(starts[m]), np.sort(ends[m])
        out[m] = np.searchsorted(order_s, starts[m], "right") - np.searchsorted(
            order_e, starts[m], "right"
        )
    return out


def _call_table(store: dict[str, list[dict]], by: str | None = None) -> np.ndarray | None:
    """[n, 5] rows of the calls (see ``RunTrace.calls``); ``by``: the key naming the engine
    a call ran on, so that calls in flight are counted per engine (else all together)."""
    calls = [c for cs in store.values() for c in cs]
    if not calls:
        return None
    keys = np.array([str(c.get(by)) if by else "" for c in calls])
    ends = np.array([c["end"] for c in calls])
    starts = ends - np.array([c["total"] for c in calls])
    in_flight = in_flight_at_start(starts, ends, keys)
    return np.array(
        [
            [c["new"], c["out"], c["prefill"], c["decode"], f]
            for c, f in zip(calls, in_flight, strict=True)
        ],
        dtype=np.float64,
    )


def _covered(starts: np.ndarray, ends: np.ndarray, a: float, b: float) -> float:
    """Seconds of ``[a, b)`` inside at least one of the intervals ``[starts, ends)``."""
    lo, hi = np.maximum(starts, a), np.minimum(ends, b)
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if not len(lo):
        return 0.0
    order = np.argsort(lo)
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    gaps = np.maximum(lo[1:] - hi[:-1], 0.0).sum()  # hi made running max: gaps between runs
    return float(hi[-1] - lo[0] - gaps)


def _host_table(store: dict[str, list[dict]]) -> np.ndarray | None:
    """[n, 7] rows of the calls of cells that share one host's cores: new prompt tokens,
    output tokens, prefill s, decode s, over the call's decode the mean number of calls
    in flight on the host (itself included) and of engines with a call in flight (its own
    included), and the calls that started on the host during it: what
    :func:`_fit_host_calls` prices."""
    calls = [c for cs in store.values() for c in cs]
    if not calls:
        return None
    keys = np.array([str(c.get("replica")) for c in calls])
    ends = np.array([c["end"] for c in calls], np.float64)
    starts = ends - np.array([c["total"] for c in calls], np.float64)
    decode = np.array([c["decode"] for c in calls], np.float64)
    engines = [keys == k for k in np.unique(keys)]
    calls_avg, engines_avg = np.ones(len(calls)), np.ones(len(calls))
    order = np.sort(starts)
    began = np.searchsorted(order, ends, "left") - np.searchsorted(order, ends - decode, "left")
    for i in range(len(calls)):
        a, b = ends[i] - decode[i], ends[i]
        if b <= a:
            continue
        calls_avg[i] = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None).sum() / (
            b - a
        )
        engines_avg[i] = sum(_covered(starts[m], ends[m], a, b) for m in engines) / (b - a)
    return np.array(
        [
            [c["new"], c["out"], c["prefill"], c["decode"], n, e, k]
            for c, n, e, k in zip(calls, calls_avg, engines_avg, began, strict=True)
        ],
        dtype=np.float64,
    )


def _fit_host_calls(c: np.ndarray) -> tuple[tuple[float, float, float], float, float]:
    """Calls of cells sharing one host (a :func:`_host_table`): one output token of a call
    takes every busy engine's decode step in turn, ``(E + s (n - E)) / d`` seconds with
    ``n`` calls in flight on ``E`` engines (so a lone call's token takes ``1 / d``, each
    more call on an engine adds ``s / d``, each more busy engine ``(1 - s) / d``), and
    each call that starts on the host meanwhile holds it up ``h`` seconds (its prefill and
    the host's work to route it). Fitted by least squares on decode seconds (a call
    weighs by its tokens): ((prefill tokens/s, d, s), h, the mean squared error of the
    seconds per token as :func:`_decode_residual`)."""
    prefill_tps = max(c[:, 0].sum() / max(c[:, 2].sum(), 1e-9), 1.0)
    ok = c[:, 1] > 0
    out, n, e, k = c[ok, 1], c[ok, 4], c[ok, 5], c[ok, 6]
    (a, b, h), *_ = np.linalg.lstsq(np.c_[out * e, out * n, k], c[ok, 3], rcond=None)
    a, b, h = max(a, 0.0), max(b, 0.0), max(h, 0.0)
    if a + b <= 0:
        return (float(prefill_tps), 60.0, 0.0), 0.0, math.inf
    predicted = a * e + b * n + h * k / out
    residual = float(np.mean(np.square(c[ok, 3] / out - predicted)))
    return (float(prefill_tps), 1.0 / (a + b), b / (a + b)), float(h), residual


def _decode_residual(c: np.ndarray, fit: tuple[float, float, float]) -> float:
    """Mean squared error of ``fit``'s decode seconds per output token on call table
    ``c``."""
    _, decode_tps, slowdown = fit
    ok = c[:, 1] > 0
    predicted = (1.0 + slowdown * (c[ok, 4] - 1)) / decode_tps
    return float(np.mean(np.square(c[ok, 3] / c[ok, 1] - predicted)))


def _fit_calls(c: np.ndarray | None) -> tuple[float, float, float]:
    """(prefill tokens/s, decode tokens/s of a lone request, batch slowdown) by least
    squares on a call table (defaults without calls)."""
    if c is None or not len(c):
        return 20000.0, 60.0, 0.0
    prefill_tps = max(c[:, 0].sum() / max(c[:, 2].sum(), 1e-9), 1.0)
    ok = c[:, 1] > 0
    per_token = c[ok, 3] / c[ok, 1]  # decode seconds per output token
    a, b = np.linalg.lstsq(np.c_[np.ones(ok.sum()), c[ok, 4] - 1], per_token, rcond=None)[0]
    a = max(a, 1e-6)
    return float(prefill_tps), 1.0 / a, max(b / a, 0.0)


def fit_cells(trace: RunTrace) -> CellConfig:
    """One cell priced from the trace: the engine's prefill rate and per-request decode rate
    against its batch (least squares on the calls), the training rate and step overhead
    (least squares on the iterations' steps), the weight push time. No switch cost: the
    synchronous CPU loop keeps its engine loaded while it trains."""
    prefill_tps, decode_tps, slowdown = _fit_calls(trace.calls)
    tps, overhead = _fit_training(trace.step_tokens)
    return CellConfig(
        count=1,
        max_concurrent=trace.parallel,
        prefill_tokens_per_s=float(prefill_tps),
        decode_tokens_per_s=float(decode_tps),
        batch_slowdown=float(slowdown),
        context_halfspeed_tokens=1e12,
        train_tokens_per_s=float(tps),
        step_overhead_s=float(overhead),
        switch_to_training_s=0.0,
        switch_to_rollout_s=0.0,
        switch_jitter=0.0,
        weight_sync_s=float(trace.sync_s),
    )


def _fit_training(rows: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(tokens/s, seconds per step) with seconds = tokens / rate + steps * overhead."""
    rows = [r for r in rows if r[1] > 0]
    if not rows:
        return 1e9, 0.0
    x = np.array([[tok, steps] for tok, steps, _ in rows], dtype=np.float64)
    y = np.array([s for *_, s in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    inv_rate, overhead = float(coef[0]), float(coef[1])
    if inv_rate <= 0 or overhead < 0:  # degenerate: one rate for everything
        return float(x[:, 0].sum() / max(y.sum(), 1e-9)), 0.0
    return 1.0 / inv_rate, overhead


def trace_config(trace: RunTrace, *, seed: int = 0) -> SimConfig:
    """A simulation of the traced run: one cell, the run's agent slots and batch, room
    enough for its iterations (the synchronous loop ends on ``max_steps``)."""
    return SimConfig(
        name=f"replay of {trace.folder}",
        seed=seed,
        duration_s=10 * sum(trace.measured_s) + 3600.0,
        max_groups=len(trace.groups),
        decision_interval_s=1.0,
        cells=fit_cells(trace),
        workload=WorkloadConfig(
            source="trace",
            trace=str(trace.folder),
            group_size=trace.group_size,
            max_concurrent_episodes=trace.parallel,
        ),
        training=TrainingConfig(
            groups_per_step=1,
            steps_per_iteration=trace.steps_per_iteration,
            groups_per_iteration=trace.groups_per_iteration,
            staleness_bound=10**6,
        ),
    )


def _fit(values: list[float], **kw) -> Dist:
    """A lognormal body fitted to ``values`` (log-mean and log-std of the positive ones),
    clipped to the range they span (a capped quantity, such as output tokens under
    ``max_tokens``, stays under its cap); zeros are kept as a point mass only when they
    are the majority (then: constant 0)."""
    x = np.asarray(values, dtype=np.float64)
    pos = x[x > 0]
    if len(pos) < max(1, len(x) // 2):
        return Dist(median=0.0)
    logs = np.log(pos)
    kw = {"min": float(pos.min()), "max": float(pos.max())} | kw
    kw["min"] = min(kw["min"], float(pos.min()))
    return Dist(median=float(np.exp(logs.mean())), sigma=float(logs.std()), **kw)


def _split_spread(groups: list[np.ndarray]) -> tuple[float, float]:
    """(within-group, between-group) log-space standard deviations of ``groups``' values
    (one-way analysis of variance: the between part is what the group means spread beyond
    what their within-group noise explains)."""
    logs = [np.log(np.maximum(g, 1e-9)) for g in groups if len(g)]
    if not logs:
        return 0.0, 0.0
    within = float(np.mean(np.concatenate([v - v.mean() for v in logs]) ** 2))
    means = np.array([v.mean() for v in logs])
    noise = float(np.mean([within / len(v) for v in logs]))
    between = max(float(means.var()) - noise, 0.0) if len(means) > 1 else 0.0
    return math.sqrt(within), math.sqrt(between)


def fit_workload(trace: RunTrace, *, by_group: bool = False) -> WorkloadConfig:
    """Distributions fitted to the trace's episodes: what a fresh draw of the same workload
    looks like (the simulator then prices calls with :func:`fit_cells`). ``by_group``: a
    group's episodes share one task, so the spread of turns and of tool times is split
    into a part the group shares (``group_turns_sigma`` / ``group_tool_sigma``) and the
    rest, within it; else every episode is drawn on its own."""
    eps = [e for g in trace.groups for e in g]
    turns = [len(e.output) for e in eps]
    turns_dist, tool_dist = _fit(turns, min=1.0), _fit([x for e in eps for x in e.tool_s])
    turns_between = tool_between = 0.0
    if by_group:
        turns_within, turns_between = _split_spread(
            [np.array([len(e.output) for e in g], np.float64) for g in trace.groups]
        )
        tools = [np.array([x for e in g for x in e.tool_s if x > 0]) for g in trace.groups]
        tool_within, tool_between = _split_spread(tools)
        turns_dist = dataclasses.replace(turns_dist, sigma=min(turns_dist.sigma, turns_within))
        tool_dist = dataclasses.replace(tool_dist, sigma=min(tool_dist.sigma, tool_within))
    return WorkloadConfig(
        source="fitted",
        group_size=trace.group_size,
        max_concurrent_episodes=trace.parallel,
        turns=turns_dist,
        group_turns_sigma=turns_between,
        first_prompt_tokens=_fit([e.prompt_new[0] for e in eps if e.prompt_new]),
        turn_prompt_tokens=_fit([x for e in eps for x in e.prompt_new[1:]] or [0.0]),
        output_tokens=_fit([x for e in eps for x in e.output], min=1.0),
        tool_s=tool_dist,
        group_tool_sigma=tool_between,
        setup_s=_fit([e.setup_s for e in eps]),
        scoring_s=_fit([e.scoring_s for e in eps]),
        zero_variance_fraction=float(np.mean([not g[0].trained for g in trace.groups])),
        max_context_tokens=10**9,
    )


@dataclass
class Validation:
    """Predicted against measured wall time of a run's RL iterations, for one way of
    building the workload: ``replay`` (measured call times), ``cell-model`` (calls priced
    by :func:`fit_cells`), ``fitted seed N`` (fresh episodes from :func:`fit_workload`),
    ``by-group seed N`` (the same with a group's episodes sharing its task's size),
    ``held-out`` (:func:`validate_held_out`)."""

    folder: str
    mode: str
    policy: str
    count: int
    """The run's iterations or steps (``unit``) the times cover."""
    predicted_s: float
    measured_s: float
    unit: str = "steps"
    """``iterations`` (a ``gyre train`` run) or ``steps`` (an elastic run)."""

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def validate_run(folder: str | Path, fitted_seeds: int = 3) -> list[Validation]:
    """The synchronous loop (the policy the run really ran: colocated) simulated three ways
    from the run's own inputs, each against the measured wall time."""
    from gyre_env.scheduler.peers import ColocatedSyncPolicy
    from gyre_env.sim.workload import FittedWorkload, TraceWorkload

    trace = load_run(folder)
    cfg = trace_config(trace)
    measured = sum(trace.measured_s)
    runs = [
        ("replay", cfg, TraceWorkload(trace.groups)),
        ("cell-model", cfg, TraceWorkload(trace.groups, replay_calls=False)),
    ]
    for label, by_group in (("fitted", False), ("by-group", True)):
        work = fit_workload(trace, by_group=by_group)
        for seed in range(fitted_seeds):
            fitted = dataclasses.replace(cfg, workload=work, seed=seed)
            runs.append((f"{label} seed {seed}", fitted, FittedWorkload(work, seed)))
    return simulate_each(
        str(folder), runs, ColocatedSyncPolicy, measured, trace.iterations, unit="iterations"
    )


def simulate_each(
    folder: str, runs: list, make_policy, measured_s: float, count: int | None = None,
    unit: str = "steps",
) -> list[Validation]:  # fmt: skip
    """Each ``(mode, config, workload)`` of ``runs`` simulated with a fresh
    ``make_policy()``, as a :class:`Validation` against ``measured_s`` (``count``: the
    run's iterations or steps, as ``unit`` says; None: the simulated steps)."""
    from gyre_env.sim.simulator import simulate

    out = []
    for mode, c, workload in runs:
        r = simulate(c, make_policy(), workload)
        n = r.steps if count is None else count
        out.append(Validation(folder, mode, r.policy, n, r.duration_s, measured_s, unit))
    return out


# ---- elastic runs -------------------------------------------------------------------------
TRACE_FILE = "elastic-trace.json"
FORMAT = "gyre-elastic-trace/1"


@dataclass
class ElasticTrace:
    """What :func:`load_elastic_trace` read."""

    path: Path
    policy: str
    policy_params: dict
    cells: int
    max_batch_size: int
    switch_prior_s: float
    group_size: int
    agent_slots: int
    """Groups running at once."""
    steps: int
    groups_per_step: int
    steps_per_iteration: int
    staleness_bound: int
    decision_interval_s: float
    groups: list[list[Episode]]
    """Finished groups by index (a group the run did not finish is replayed as the next
    finished one: ``TraceWorkload`` cycles)."""
    step_rows: list[tuple[int, int, float]] = field(default_factory=list)
    """Per optimizer step: (tokens of its groups, as the simulator counts them, cells,
    seconds from the step's start to its end: packing, the optimizer step, publishing)."""
    switches: dict[str, list[float]] = field(default_factory=dict)
    """Measured switch seconds by target role (``TRAINING`` / ``ROLLOUT``)."""
    calls: np.ndarray | None = None
    """[n, 5] as ``RunTrace.calls``: in flight counted per engine."""
    host_calls: np.ndarray | None = None
    """[n, 6] as :func:`_host_table`: calls priced as cells sharing one host's cores."""
    measured_s: float = 0.0

    @property
    def parallel(self) -> int:
        """Agent slots in episodes (what the simulator counts)."""
        return self.agent_slots * self.group_size


def write_elastic_trace(
    folder, *, policy, label: str, cells: int, max_batch_size: int, switch_prior_s: float,
    config, group_size: int, result, groups: list[dict],
) -> Path:  # fmt: skip
    """``folder/elastic-trace.json`` for the elastic run ``result`` (an ``ElasticResult``)
    of ``policy`` under ``config`` (its ``ElasticConfig``): its shape, ``groups`` (every
    finished group: ``index``, ``start``, ``end`` and per episode its ``calls``
    (:func:`gyre_env.trajectory.records.trace_calls`) and ``tool_s``, the seconds after each call before the next one
    or the episode's end), its steps and switches, and the measured wall time (kept
    apart, for checking the prediction)."""
    from gyre_env.scheduler.driver import switch_values

    params = {
        f.name: getattr(policy, f.name)
        for f in dataclasses.fields(policy)
        if not f.name.startswith("_") and f.name not in ("name", "params")
    }
    trace = {
        "format": FORMAT,
        "policy": policy.name,
        "policy_params": params,
        "label": label,
        "cells": cells,
        "max_batch_size": max_batch_size,
        "switch_prior_s": switch_prior_s,
        "config": dataclasses.asdict(config),
        "group_size": group_size,
        # the run's zero on the clock the calls' start times use (time.time())
        "t0": result.t0 + (time.time() - time.monotonic()),
        "wall_s": result.wall_s,
        "groups": groups,
        "steps": [{k: v for k, v in m.items() if k != "staleness"} for m in result.steps],
        "switches": [switch_values(r, result.t0) for r in result.switches],
        "busy": [result.busy_fraction(i) for i in range(cells)],
        "idle": result.idle_fraction(),
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / TRACE_FILE
    path.write_text(json.dumps(trace, default=str), encoding="utf-8")
    return path


def _engine_wait(call: dict) -> float:
    """Seconds a call waited in its engine for a batch slot: its ``engine_queue`` when the
    batch was full (``slot_wait``, set by :func:`_mark_slot_waits`), else 0 (below a full
    batch the engine's wait is its other requests' prefills, which it runs one at a
    time: part of serving the call)."""
    return float(call.get("engine_queue", 0.0)) if call.get("slot_wait", True) else 0.0


def _waited(call: dict) -> float:
    """Seconds a call waited for a slot, in the proxy for a replica and in the engine
    (the simulator queues calls itself)."""
    return float(call.get("queue", 0.0)) + _engine_wait(call)


def _mark_slot_waits(calls: list[dict], max_batch: int) -> None:
    """``slot_wait`` on each call: whether its engine held ``max_batch`` calls or more
    when it arrived there (after its proxy queue)."""
    if not calls:
        return
    arrive = np.array([c["start"] + float(c.get("queue", 0.0)) for c in calls])
    ends = np.array([c["start"] + c["total"] for c in calls])
    keys = np.array([str(c.get("replica")) for c in calls])
    for c, n in zip(calls, in_flight_at_start(arrive, ends, keys), strict=True):
        c["slot_wait"] = bool(n > max_batch)  # (n counts the call itself)


def _elastic_episode(ep: dict, group_start: float) -> Episode:
    """One traced episode: each call's service time (the proxy's total less its waits for
    a slot), the measured gap after each call before the next one (the tool wait and the
    agent's own time), the injected wait after the last."""
    calls, tools = ep["calls"], ep["tool_s"]
    starts = [c["start"] for c in calls]
    ends = [c["start"] + c["total"] for c in calls]
    gaps = [b - a for a, b in zip(ends[:-1], starts[1:], strict=True)]
    last = float(tools[len(calls) - 1]) if calls else 0.0
    return Episode(
        setup_s=max(starts[0] - group_start, 0.0) if calls else 0.0,
        scoring_s=0.0,
        prompt_new=[int(c["new"]) for c in calls],
        output=[int(c["out"]) for c in calls],
        tool_s=[max(g, 0.0) for g in gaps] + ([last] if calls else []),
        call_s=[max(c["total"] - _waited(c), 1e-6) for c in calls],
    )


def load_elastic_trace(path: str | Path) -> ElasticTrace:
    """Read ``elastic-trace.json`` (the file, or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / TRACE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {TRACE_FILE} at {path.parent}")
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file (format {data.get('format')!r})")
    cfg = data["config"]
    by_index = {g["index"]: g for g in data["groups"]}
    calls = [c for g in data["groups"] for e in g["episodes"] for c in e["calls"]]
    _mark_slot_waits(calls, int(data["max_batch_size"]))
    groups = {
        i: [_elastic_episode(e, g["start"]) for e in g["episodes"]]
        for i, g in sorted(by_index.items())
    }
    rows = []
    for step in data["steps"]:
        members = [groups[i] for i in step.get("group_index", []) if i in groups]
        tokens = sum(e.tokens for grp in members for e in grp)
        seconds = step["ended_s"] - step["started_s"] if "ended_s" in step else step["step_s"]
        rows.append((tokens, len(step["cells"]), float(seconds)))
    switches: dict[str, list[float]] = {"TRAINING": [], "ROLLOUT": []}
    for sw in data["switches"]:
        switches[sw["to"]].append(float(sw["total_s"]))
    store = {
        str(k): [
            dict(
                c,
                prefill=max(c["prefill"] - _engine_wait(c), 0.0),
                total=c["total"] - _waited(c),
                end=c["start"] + c["total"],
            )
            for e in g["episodes"]
            for c in e["calls"]
        ]
        for k, g in by_index.items()
    }
    return ElasticTrace(
        path=path,
        policy=data["policy"],
        policy_params=dict(data.get("policy_params") or {}),
        cells=int(data["cells"]),
        max_batch_size=int(data["max_batch_size"]),
        switch_prior_s=float(data["switch_prior_s"]),
        group_size=int(data["group_size"]),
        agent_slots=int(cfg["agent_slots"]),
        steps=int(cfg["steps"]),
        groups_per_step=int(cfg["groups_per_step"]),
        steps_per_iteration=int(cfg["steps_per_iteration"]),
        staleness_bound=int(cfg["staleness_bound"]),
        decision_interval_s=float(cfg["decision_interval_s"]),
        groups=list(groups.values()),
        step_rows=rows,
        switches=switches,
        calls=_call_table(store, by="replica"),
        host_calls=_host_table(store),
        measured_s=float(data["wall_s"]),
    )


def _fit_steps(rows: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(one cell's tokens/s, data-parallel efficiency, seconds per step) with
    ``seconds = tokens / (rate x cells x efficiency) + overhead`` (efficiency 1 for one
    cell). The efficiency is fitted only when the run stepped on one cell and on more;
    a fit that comes out negative falls back to one mean rate and no overhead."""
    rows = [r for r in rows if r[0] > 0]
    if not rows:
        return 1e9, 1.0, 0.0
    tok = np.array([r[0] for r in rows], np.float64)
    n = np.array([r[1] for r in rows], np.float64)
    y = np.array([r[2] for r in rows])
    one, many = n == 1, n > 1
    if one.any() and many.any():
        x = np.c_[tok * one, tok * many / n, np.ones(len(rows))]
        a1, an, overhead = np.linalg.lstsq(x, y, rcond=None)[0]
        if a1 > 0 and an > 0 and overhead >= 0:
            return 1.0 / a1, min(a1 / an, 1.0), float(overhead)
    x = np.c_[tok / n, np.ones(len(rows))]
    a, overhead = np.linalg.lstsq(x, y, rcond=None)[0]
    if a > 0 and overhead >= 0:
        return 1.0 / a, 1.0, float(overhead)
    return float((tok / n).sum() / y.sum()), 1.0, 0.0


def fit_elastic_cells(trace: ElasticTrace, fit_on: list[ElasticTrace] | None = None) -> CellConfig:
    """The cells of ``trace``'s run (its count, batch and switch-cost prior) priced from the
    measurements of ``fit_on`` (default: ``trace`` itself; other runs: a prediction of a
    run none of whose timings were fitted): calls as in ``fit_cells`` (in flight counted
    per engine), steps by :func:`_fit_steps`, switches at their measured mean per
    direction (their log-space spread around it as jitter), pooled over ``fit_on``.
    Weights are published inside the measured step (no separate sync time); a migrated
    call's KV move is part of the measured switch (no separate transfer time)."""
    fit_on = fit_on if fit_on is not None else [trace]
    tables = [t.calls for t in fit_on if t.calls is not None and len(t.calls)]
    engine = np.concatenate(tables) if tables else None
    prefill_tps, decode_tps, slowdown = fits = _fit_calls(engine)
    # each engine its own device, or every engine on the host's cores in turn: the one
    # whose fit explains the fitted runs' decode times better
    host_tables = [t.host_calls for t in fit_on if t.host_calls is not None and len(t.host_calls)]
    shared, host_call_s = False, 0.0
    if engine is not None and len(host_tables) == len(tables):
        host_fit, h, host_residual = _fit_host_calls(np.concatenate(host_tables))
        if host_residual < _decode_residual(engine, fits):
            (prefill_tps, decode_tps, slowdown), host_call_s = host_fit, h
            shared = True
    tps, dp, overhead = _fit_steps([row for t in fit_on for row in t.step_rows])
    switches = {
        k: [s for t in fit_on for s in t.switches.get(k, [])] for k in ("TRAINING", "ROLLOUT")
    }
    # the spread of each direction's switches around their own mean, pooled
    spread = [
        np.log(s) - np.log(v).mean() for v in map(np.array, switches.values()) if len(v) > 1
        for s in v
    ]  # fmt: skip
    jitter = float(np.sqrt(np.mean(np.square(spread)))) if spread else 0.0
    to_t, to_r = (
        float(np.mean(switches[k])) if switches[k] else trace.switch_prior_s
        for k in ("TRAINING", "ROLLOUT")
    )
    return CellConfig(
        count=trace.cells,
        max_concurrent=trace.max_batch_size,
        prefill_tokens_per_s=prefill_tps,
        decode_tokens_per_s=decode_tps,
        batch_slowdown=slowdown,
        shared_host=shared,
        host_call_s=host_call_s,
        context_halfspeed_tokens=1e12,
        train_tokens_per_s=tps,
        dp_efficiency=dp,
        step_overhead_s=overhead,
        switch_to_training_s=to_t,
        switch_to_rollout_s=to_r,
        switch_jitter=jitter,
        switch_prior_s=trace.switch_prior_s,
        weight_sync_s=0.0,
        kv_bytes_per_token=0.0,
    )


def elastic_config(
    trace: ElasticTrace, *, seed: int = 0, fit_on: list[ElasticTrace] | None = None
) -> SimConfig:
    """A simulation of the traced run: its cells (priced from ``fit_on``'s measurements,
    default its own), agent slots, batch, staleness bound and decision interval, ending on
    its number of steps."""
    return SimConfig(
        name=f"replay of {trace.path.parent}",
        seed=seed,
        duration_s=10 * trace.measured_s + 3600.0,
        max_steps=trace.steps,
        decision_interval_s=trace.decision_interval_s,
        resolution_s=min(trace.decision_interval_s, 0.05),
        cells=fit_elastic_cells(trace, fit_on),
        workload=WorkloadConfig(
            source="trace",
            trace=str(trace.path),
            group_size=trace.group_size,
            max_concurrent_episodes=trace.parallel,
        ),
        training=TrainingConfig(
            groups_per_step=trace.groups_per_step,
            steps_per_iteration=trace.steps_per_iteration,
            staleness_bound=trace.staleness_bound,
        ),
    )


def make_policy(name: str, params: dict):
    """A fresh policy object of the kind a trace names, with its parameters."""
    from gyre_env.scheduler.peers import (
        AsyncStalenessPolicy,
        ColocatedSyncPolicy,
        DynamicResourcePolicy,
        StaticSplitPolicy,
    )
    from gyre_env.scheduler.policy import WaterlevelPolicy

    kinds = {
        "colocated": ColocatedSyncPolicy,
        "static_split": StaticSplitPolicy,
        "async": AsyncStalenessPolicy,
        "dynamic": DynamicResourcePolicy,
        "waterlevel": WaterlevelPolicy,
    }
    for cls in kinds.values():
        default = next(f.default for f in dataclasses.fields(cls) if f.name == "name")
        if default == name:
            return cls(**params)
    raise ValueError(f"unknown policy {name!r} in the trace (known: {', '.join(kinds)})")


def validate_elastic(path: str | Path, fitted_seeds: int = 3) -> list[Validation]:
    """The policy the run really ran, simulated three ways from the run's own inputs, each
    against the measured wall time (see the module doc)."""
    from gyre_env.sim.workload import FittedWorkload, TraceWorkload

    trace = load_elastic_trace(path)
    cfg = elastic_config(trace)
    runs = [
        ("replay", cfg, TraceWorkload(trace.groups)),
        ("cell-model", cfg, TraceWorkload(trace.groups, replay_calls=False)),
    ]
    for label, by_group in (("fitted", False), ("by-group", True)):
        work = dataclasses.replace(fit_workload(trace, by_group=by_group), max_context_tokens=10**9)
        for seed in range(fitted_seeds):
            fitted = dataclasses.replace(cfg, workload=work, seed=seed)
            runs.append((f"{label} seed {seed}", fitted, FittedWorkload(work, seed)))
    policy = functools.partial(make_policy, trace.policy, trace.policy_params)
    return simulate_each(str(trace.path.parent), runs, policy, trace.measured_s)


def validate_held_out(fit: list, predict: list) -> list[Validation]:
    """Runs predicted from other runs: the cells (call, step and switch costs) fitted on
    the elastic traces ``fit`` only, then each run of ``predict`` (none of them in ``fit``)
    simulated with the policy it ran, its shape (cells, batch, agent slots, bound) and
    its agents' own work (each call's tokens, each tool wait), every call priced by
    the fitted cell model (``held-out``: none of its measured timings is an input), against
    its measured wall time. ``fit``: trace paths, or traces already loaded."""
    from gyre_env.sim.workload import TraceWorkload

    fits = [p if isinstance(p, ElasticTrace) else load_elastic_trace(p) for p in fit]
    fitted_paths = {t.path.resolve() for t in fits}
    out = []
    for path in predict:
        trace = load_elastic_trace(path)
        if trace.path.resolve() in fitted_paths:
            raise ValueError(f"{path}: in both the fitted and the predicted runs")
        cfg = elastic_config(trace, fit_on=fits)
        run = [("held-out", cfg, TraceWorkload(trace.groups, replay_calls=False))]
        policy = functools.partial(make_policy, trace.policy, trace.policy_params)
        out += simulate_each(str(trace.path.parent), run, policy, trace.measured_s)
    return out


def group_factor(groups: list[list[Episode]]) -> dict[str, float]:
    """How much of an episode's size its group shares (a group's episodes are one task):
    for turns, tokens and agent-side (tool) seconds per episode, the intra-group
    correlation in log space, ``(MSB - MSW) / (MSB + (k - 1) MSW)`` of a one-way analysis
    of variance over the groups (0: episodes of a group are as different as any two; 1:
    a group's episodes are alike; NaN: no spread to share)."""
    quantities = {
        "turns": lambda e: len(e.output),
        "tokens": lambda e: e.tokens,
        "tool_s": lambda e: float(np.sum(e.tool_s)),
    }
    groups = [g for g in groups if len(g) > 1]
    out = {}
    for name, of in quantities.items():
        x = [np.log(np.maximum([of(e) for e in g], 1e-9)) for g in groups]
        if len(x) < 2:
            out[name] = float("nan")
            continue
        k = float(np.mean([len(v) for v in x]))
        grand = np.mean(np.concatenate(x))
        msb = sum(len(v) * (v.mean() - grand) ** 2 for v in x) / (len(x) - 1)
        msw = sum(((v - v.mean()) ** 2).sum() for v in x) / sum(len(v) - 1 for v in x)
        den = msb + (k - 1) * msw
        out[name] = float(np.clip((msb - msw) / den, 0.0, 1.0)) if den > 1e-12 else float("nan")
    return out
