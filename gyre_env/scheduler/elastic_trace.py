"""A real elastic run as simulator input, and its measured wall time.

The trace (``elastic-trace.json``, written by :func:`write_elastic_trace` for every
``gyre train --elastic`` run and for ``benchmarks/elastic.py --trace-out``) holds the
run's shape (cells, batch, staleness bound, agent slots, the policy and its parameters),
every finished group's calls (new prompt tokens, output tokens, start, queue and service
seconds, the engine that served it) and tool waits, its optimizer steps (groups, cells,
seconds) and its switches (direction, seconds). :func:`validate_elastic` simulates the
same policy on it three ways, as :func:`gyre_env.scheduler.trace.validate_run` does for
the synchronous loop: replaying the measured call times, pricing calls with the cell
model fitted to them, and drawing fresh episodes from distributions fitted to the trace.
Measured: the run's wall time from its start to its last step (``wall_s``), never an
input.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gyre_env.scheduler.config import CellConfig, SimConfig, TrainingConfig, WorkloadConfig
from gyre_env.scheduler.trace import (
    Validation,
    _call_table,
    _fit_calls,
    fit_workload,
    in_flight_at_start,
    simulate_each,
)
from gyre_env.scheduler.workload import Episode

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
    measured_s: float = 0.0

    @property
    def parallel(self) -> int:
        """Agent slots in episodes (what the simulator counts)."""
        return self.agent_slots * self.group_size


def trace_calls(records) -> list[dict]:
    """A traced episode's calls from its proxy records, in call order: ``new`` prompt
    tokens past the cached prefix, ``out`` tokens, ``start`` (``time.time()`` when the
    proxy took the request), the record's ``queue`` / ``engine_queue`` / ``prefill`` /
    ``decode`` / ``total`` seconds and the serving ``replica``."""
    return [
        dict(
            new=max(len(r.prompt_ids) - int(r.prefix_len or 0), 0),
            out=len(r.output_ids),
            start=float(r.created),
            queue=float(r.timings.get("queue", 0.0)),
            engine_queue=float(r.timings.get("engine_queue", 0.0)),
            prefill=float(r.timings.get("prefill", 0.0)),
            decode=float(r.timings.get("decode", 0.0)),
            total=float(r.timings.get("total", 0.0)),
            replica=r.replica,
        )
        for r in sorted(records, key=lambda r: r.call_index)
    ]


def write_elastic_trace(
    folder, *, policy, label: str, cells: int, max_batch_size: int, switch_prior_s: float,
    config, group_size: int, result, groups: list[dict],
) -> Path:  # fmt: skip
    """``folder/elastic-trace.json`` for the elastic run ``result`` (an ``ElasticResult``)
    of ``policy`` under ``config`` (its ``ElasticConfig``): its shape, ``groups`` (every
    finished group: ``index``, ``start``, ``end`` and per episode its ``calls``
    (:func:`trace_calls`) and ``tool_s``, the seconds after each call before the next one
    or the episode's end), its steps and switches, and the measured wall time (kept
    apart, for checking the prediction)."""
    from gyre_env.scheduler.elastic import switch_values

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


def _episode(ep: dict, group_start: float) -> Episode:
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
        i: [_episode(e, g["start"]) for e in g["episodes"]] for i, g in sorted(by_index.items())
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


def fit_elastic_cells(trace: ElasticTrace) -> CellConfig:
    """The run's cells priced from its trace: calls as in ``fit_cells`` (in flight counted
    per engine), steps by :func:`_fit_steps`, switches at their measured mean per
    direction (their log-space spread around it as jitter), the policy's switch-cost prior as the run's.
    Weights are published inside the measured step (no separate sync time); a migrated
    call's KV move is part of the measured switch (no separate transfer time)."""
    prefill_tps, decode_tps, slowdown = _fit_calls(trace.calls)
    tps, dp, overhead = _fit_steps(trace.step_rows)
    # the spread of each direction's switches around their own mean, pooled
    spread = [
        np.log(s) - np.log(v).mean() for v in map(np.array, trace.switches.values()) if len(v) > 1
        for s in v
    ]  # fmt: skip
    jitter = float(np.sqrt(np.mean(np.square(spread)))) if spread else 0.0
    to_t, to_r = (
        float(np.mean(trace.switches[k])) if trace.switches.get(k) else trace.switch_prior_s
        for k in ("TRAINING", "ROLLOUT")
    )
    return CellConfig(
        count=trace.cells,
        max_concurrent=trace.max_batch_size,
        prefill_tokens_per_s=prefill_tps,
        decode_tokens_per_s=decode_tps,
        batch_slowdown=slowdown,
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


def elastic_config(trace: ElasticTrace, *, seed: int = 0) -> SimConfig:
    """A simulation of the traced run: its cells, agent slots, batch, staleness bound and
    decision interval, ending on its number of steps."""
    return SimConfig(
        name=f"replay of {trace.path.parent}",
        seed=seed,
        duration_s=10 * trace.measured_s + 3600.0,
        max_steps=trace.steps,
        decision_interval_s=trace.decision_interval_s,
        resolution_s=min(trace.decision_interval_s, 0.05),
        cells=fit_elastic_cells(trace),
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
    from gyre_env.scheduler.workload import FittedWorkload, TraceWorkload

    trace = load_elastic_trace(path)
    cfg = elastic_config(trace)
    runs = [
        ("replay", cfg, TraceWorkload(trace.groups)),
        ("cell-model", cfg, TraceWorkload(trace.groups, replay_calls=False)),
    ]
    fitted_workload = dataclasses.replace(fit_workload(trace), max_context_tokens=10**9)
    for seed in range(fitted_seeds):
        fitted = dataclasses.replace(cfg, workload=fitted_workload, seed=seed)
        runs.append((f"fitted seed {seed}", fitted, FittedWorkload(fitted.workload, seed)))
    policy = functools.partial(make_policy, trace.policy, trace.policy_params)
    return simulate_each(str(trace.path.parent), runs, policy, trace.measured_s)
