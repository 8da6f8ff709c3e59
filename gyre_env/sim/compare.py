"""Every enabled policy on one config, the split policies at their best ``k``, and sweeps.

``compare(cfg)`` is what ``gyre simulate`` runs: each enabled policy on the config's cluster
and workload (the static split and the asynchronous policy once per ``k`` of their sweep,
the best by trained tokens kept), then each sweep value of ``[sweep]`` for every policy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from gyre_env.scheduler.peers import (
    AsyncStalenessPolicy,
    ColocatedSyncPolicy,
    DynamicResourcePolicy,
    StaticSplitPolicy,
)
from gyre_env.scheduler.policy import WaterlevelPolicy
from gyre_env.sim.config import SimConfig
from gyre_env.sim.simulator import SimResult, simulate
from gyre_env.sim.workload import make_workload

SPLIT_POLICIES = ("static_split", "async")


@dataclass
class Comparison:
    """Results of one ``compare`` call."""

    results: dict[str, SimResult]
    """Per policy, its run (the split policies: at their best k)."""
    k_sweeps: dict[str, list[tuple[int, SimResult]]] = field(default_factory=dict)
    sweeps: dict[str, list[tuple[float, dict[str, SimResult]]]] = field(default_factory=dict)
    bound: SimResult | None = None
    """:func:`bound_run`: the workload with the cells out of the way."""

    def best_peer(self) -> str | None:
        peers = [n for n in self.results if n != "waterlevel"]
        return max(peers, key=lambda n: self.results[n].trained_tokens, default=None)

    def waterlevel_ratio(self) -> float | None:
        """Waterlevel's trained tokens over the best peer's."""
        best = self.best_peer()
        if "waterlevel" not in self.results or best is None:
            return None
        base = self.results[best].trained_tokens
        return self.results["waterlevel"].trained_tokens / base if base else None

    def ceiling(self) -> float | None:
        """The idle-free ceiling: the largest idle-free throughput of any policy's run
        (:meth:`SimResult.idle_free_tokens_per_hour`) over the best peer's throughput.
        About the most any policy could gain over the best peer on this workload (an
        estimate, not a bound: a policy that drops fewer stale samples or batches its calls
        better spends less cell time per trained token)."""
        best = self.best_peer()
        if best is None or not self.results[best].tokens_per_hour:
            return None
        top = max(r.idle_free_tokens_per_hour() for r in self.results.values())
        return top / self.results[best].tokens_per_hour

    def bound_ceiling(self) -> float | None:
        """:func:`bound_run`'s finished tokens per hour over the best peer's trained ones:
        what the workload, its agent slots and the staleness bound leave to gain by any
        use of the cells."""
        best = self.best_peer()
        if self.bound is None or best is None or not self.results[best].tokens_per_hour:
            return None
        return self.bound.finished_tokens_per_hour / self.results[best].tokens_per_hour


def policy_factories(cfg: SimConfig) -> dict[str, Callable[..., object]]:
    """Constructors of the enabled policies; the split ones take ``k``."""
    p = cfg.policies
    out: dict[str, Callable[..., object]] = {}
    if p.colocated.enabled:
        out["colocated"] = ColocatedSyncPolicy
    if p.static_split.enabled:
        out["static_split"] = lambda k: StaticSplitPolicy(rollout_cells=k)
    if p.async_staleness.enabled:
        out["async"] = lambda k: AsyncStalenessPolicy(rollout_cells=k)
    if p.dynamic.enabled:
        d = p.dynamic
        out["dynamic"] = lambda: DynamicResourcePolicy(
            queue_threshold=d.queue_threshold,
            switch_prior_s=d.switch_prior_s,
            initial_rollout_fraction=d.initial_rollout_fraction,
        )
    if p.waterlevel.enabled:
        w = p.waterlevel
        # every [policies.waterlevel] setting is the policy's field of the same name
        out["waterlevel"] = lambda: WaterlevelPolicy(
            **{f.name: getattr(w, f.name) for f in fields(w) if f.name != "enabled"}
        )
    return out


FREE_CELLS_SCALE = 10


def free_cells(cfg: SimConfig, scale: int = FREE_CELLS_SCALE) -> SimConfig:
    """``cfg`` with its cells out of the way: ``scale`` x as many (a call shares its cell
    with a tenth of the others; cells that shared one host's cores get one each), training
    ``100 x scale`` times as fast with no step overhead, no weight publish and switches
    that cost nothing. What is left is what no
    use of the cells can change: the workload (turns, tool times, a call's own latency),
    the agent slots, the batch per trainer version and the staleness bound."""
    v = copy.deepcopy(cfg)
    v.gantt_max_segments = 0
    c = v.cells
    c.count *= scale
    c.shared_host = False  # more cells on one host would add no cores
    c.train_tokens_per_s *= 100.0 * scale
    c.step_overhead_s = 0.0
    c.weight_sync_s = 0.0
    c.switch_to_training_s = c.switch_to_rollout_s = 1e-3
    c.switch_prior_s = 1e-3
    return v


def bound_run(cfg: SimConfig, workload=None) -> SimResult:
    """The asynchronous policy (a fixed split: no decision to get wrong) on
    :func:`free_cells`, nine cells in ten serving. Its groups finish as fast as the
    workload lets them and its trainer's version moves as fast as batches come, so the
    bound admits the most it can at every moment. The tokens of the groups that reached a
    step (``SimResult.finished_tokens_per_hour``: trained, or lost to the staleness bound,
    which a trainer this fast does to long groups that a slower one would keep) are the
    staleness-bound ceiling: a policy that trains one batch per trainer version, as every
    peer does, trains no more from the real cells however it schedules them. A policy
    that trains more than one batch for a version (the waterlevel's grown steps) changes
    what the bound admits and can pass it."""
    free = free_cells(cfg)
    return simulate(free, AsyncStalenessPolicy(rollout_cells=free.cells.count * 9 // 10), workload)


def k_grid(n: int, given: list[int], points: int = 8) -> list[int]:
    """The ``k`` values to sweep: ``given``, or up to ``points`` even steps over 1..n-1."""
    if given:
        return sorted({k for k in given if 1 <= k < n} or {max(1, n - 1)})
    if n < 2:
        return [1]
    step = max(1, round((n - 1) / points))
    return sorted({*range(1, n, step), n - 1})


def sweep_best(cfg: SimConfig, make, ks: list[int], workload=None) -> list[tuple[int, SimResult]]:
    """``make(k)`` run for each ``k``; sorted best first (most trained tokens, then fewer
    rollout cells)."""
    runs = [(k, simulate(cfg, make(k), workload)) for k in ks]
    return sorted(runs, key=lambda kr: (-kr[1].trained_tokens, kr[0]))


def compare(
    cfg: SimConfig, *, sweeps: bool = True, bound: bool = True, progress=None
) -> Comparison:
    """Every enabled policy on ``cfg``; then ``cfg.sweep``'s sweeps when ``sweeps``, and
    :func:`bound_run` when ``bound``."""
    workload = make_workload(cfg.workload, cfg.seed)
    factories = policy_factories(cfg)
    results: dict[str, SimResult] = {}
    k_sweeps: dict[str, list[tuple[int, SimResult]]] = {}
    given = {
        "static_split": cfg.policies.static_split.rollout_cells,
        "async": cfg.policies.async_staleness.rollout_cells,
    }
    for name, make in factories.items():
        if progress:
            progress(name)
        if name in SPLIT_POLICIES:
            runs = sweep_best(cfg, make, k_grid(cfg.cells.count, given[name]), workload)
            k_sweeps[name] = sorted(runs, key=lambda kr: kr[0])
            results[name] = runs[0][1]
        else:
            results[name] = simulate(cfg, make(), workload)
    out = Comparison(results=results, k_sweeps=k_sweeps)
    if bound:
        if progress:
            progress("staleness-bound ceiling")
        out.bound = bound_run(cfg, workload)
    if sweeps:
        out.sweeps = run_sweeps(cfg, factories, results, progress)
    return out


def _variant(cfg: SimConfig, what: str, value: float) -> SimConfig:
    v = copy.deepcopy(cfg)
    if cfg.sweep.duration_s is not None:
        v.duration_s = cfg.sweep.duration_s
    v.gantt_max_segments = 0
    if what == "tool_tail_fraction":
        v.workload.tool_s.tail_fraction = float(value)
    elif what == "cells":
        v.cells.count = int(value)
    elif what == "switch_cost_scale":
        v.cells.switch_to_training_s *= value
        v.cells.switch_to_rollout_s *= value
    else:
        raise ValueError(f"unknown sweep {what!r}")
    return v


def run_sweeps(cfg: SimConfig, factories, results, progress=None):
    """Each sweep value of ``cfg.sweep`` for every policy (split policies at their best
    ``k``'s share of the cluster)."""
    out: dict[str, list[tuple[float, dict[str, SimResult]]]] = {}
    for what in ("tool_tail_fraction", "cells", "switch_cost_scale"):
        values = getattr(cfg.sweep, what)
        if not values:
            continue
        rows = []
        for value in values:
            if progress:
                progress(f"sweep {what}={value}")
            v = _variant(cfg, what, value)
            workload = make_workload(v.workload, v.seed)
            row = {}
            for name, make in factories.items():
                if name in SPLIT_POLICIES:
                    share = results[name].params["rollout_cells"] / cfg.cells.count
                    k = max(1, min(v.cells.count - 1, round(share * v.cells.count)))
                    row[name] = simulate(v, make(k), workload)
                else:
                    row[name] = simulate(v, make(), workload)
            rows.append((value, row))
        out[what] = rows
    return out
