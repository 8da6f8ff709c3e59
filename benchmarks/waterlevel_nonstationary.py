"""Waterlevel vs the best sweep-tuned peer on loads whose demand changes (issue 37's figures).

    python benchmarks/waterlevel_nonstationary.py [CONFIG.toml ...] [--hours 6 24]
        [--seeds 0 1 2] [--peers async static_split colocated dynamic] [--jobs 1]
        [--cache FILE] [--waterlevel NAME=VALUE ...]

For every config (default: the stationary NL2Repo example and the four non-stationary
ones: curriculum, growing episodes with a burst of short tasks, bursts of short tasks,
a slow sandbox pool), horizon and seed: the waterlevel policy with the settings every
workload shares (``[policies.waterlevel]`` of the config: the examples leave them at
the policy's defaults), and each peer, the split ones (async, static split) once per
``k`` of the config's grid, the best kept. One row per run: each policy's trained tokens
per hour, idle share of cell time, samples past the staleness bound
(every output token stale: nothing learned from them), and the ratio of waterlevel's
to the best peer's. ``ceiling``: the largest idle-free throughput of any run (trained
tokens per busy cell-second, as if no cell idled or switched) over the best peer's: about
the most any policy could gain there (an estimate, not a bound: a policy that drops fewer
stale samples spends less cell time per trained token). ``bound``: the staleness-bound
ceiling over the best peer, the tokens the asynchronous policy's groups bring to a step
(trained or lost to the staleness bound) with the cells out of the way
(``gyre_env.sim.compare.bound_run``: ten times the cells, training and switches free):
what one batch per trainer version reaches whatever is done with the cells. Where it is
below the target, no scheduling of the cells meets it; only steps that take more than one
batch per version (the waterlevel's grown steps) can pass it.

Per config: the ratio of the summed tokens over the seeds at each horizon, the smallest
per-seed ratio, and the target it is held to (1.2x on a non-stationary load: one with
workload phases; 1.0x on a stationary one, where the ceiling leaves little room).
Benchmarks print, they do not fail: the exit status is 0 whatever the ratios.

``--cache FILE`` keeps every peer run's numbers (keyed by the config file's contents,
horizon, seed, policy and k) so that a rerun after a change to the waterlevel policy
reruns only it; waterlevel is never cached. Runs are independent: ``--jobs 2`` runs two
at a time (each a process); a line on stderr as each run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEFAULT_CONFIGS = [
    EXAMPLES / f"simulate_nl2repo{suffix}.toml"
    for suffix in ("", "_curriculum", "_growing", "_bursts", "_slow_tools")
]
PEERS = ("async", "static_split", "colocated", "dynamic")
BOUND = "bound"
"""The staleness-bound ceiling's run (``gyre_env.sim.compare.bound_run``), not a peer."""
TARGET_CHANGING, TARGET_STATIONARY = 1.2, 1.0


def run_one(job: tuple) -> dict:
    """One simulated run: ``(config path, hours, seed, policy, k or None)``; for the
    waterlevel, ``k`` is its ``--waterlevel`` settings (pairs of name and value) or None."""
    from gyre_env.sim.compare import bound_run, policy_factories
    from gyre_env.sim.config import load_sim_config
    from gyre_env.sim.simulator import simulate

    path, hours, seed, name, k = job
    cfg = load_sim_config(path)
    cfg.duration_s, cfg.seed, cfg.gantt_max_segments = hours * 3600.0, seed, 0
    if name == "waterlevel":  # k: its settings, not a split
        for key, value in k or ():
            setattr(cfg.policies.waterlevel, key, value)
        k = None
    if name == BOUND:
        r = bound_run(cfg)
    else:
        make = policy_factories(cfg)[name]
        r = simulate(cfg, make(k) if k is not None else make())
    return {
        "tokens_per_hour": r.tokens_per_hour,
        "idle": r.idle_fraction(),
        "dropped": r.dropped_stale,
        "steps": r.steps,
        "idle_free": r.idle_free_tokens_per_hour(),
        "finished": r.finished_tokens_per_hour,
    }


def _key(digest: str, hours: float, seed: int, name: str, k) -> str:
    return f"{digest}|{hours:g}|{seed}|{name}|{k}"


def waterlevel_settings(pairs: list[str]) -> tuple | None:
    """``--waterlevel NAME=VALUE`` pairs (each value read as TOML, as ``gyre train --set``
    reads one), checked as a ``[policies.waterlevel]`` table is."""
    import tomllib

    from gyre_env.config import ConfigError, from_dict
    from gyre_env.sim.config import WaterlevelParams

    table = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep:
            raise SystemExit(f"--waterlevel {pair!r}: expected NAME=VALUE")
        try:
            table[name] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            table[name] = raw  # from_dict names the field and the type it wants
    if "enabled" in table:
        raise SystemExit("--waterlevel enabled: the benchmark always runs the waterlevel")
    try:
        params = from_dict(WaterlevelParams, table, "policies.waterlevel")
    except ConfigError as e:
        raise SystemExit(f"--waterlevel: {e}") from None
    return tuple((name, getattr(params, name)) for name in table) or None


def plan(
    configs: list[Path],
    hours: list[float],
    seeds: list[int],
    peers: list[str],
    waterlevel: tuple | None = None,
):
    """Every run to make, and each config's file digest (the cache key)."""
    from gyre_env.sim.compare import SPLIT_POLICIES, k_grid, policy_factories
    from gyre_env.sim.config import load_sim_config

    jobs, digests, stationary = [], {}, {}
    for path in configs:
        cfg = load_sim_config(path)
        digests[str(path)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
        stationary[str(path)] = not cfg.workload.phases
        enabled = policy_factories(cfg)
        if "waterlevel" not in enabled:
            raise SystemExit(f"{path}: the waterlevel policy is disabled in [policies]")
        given = {
            "async": cfg.policies.async_staleness.rollout_cells,
            "static_split": cfg.policies.static_split.rollout_cells,
        }
        for h in hours:
            for seed in seeds:
                jobs.append((str(path), h, seed, "waterlevel", waterlevel))
                jobs.append((str(path), h, seed, BOUND, None))
                for name in peers:
                    if name not in enabled:
                        continue
                    if name in SPLIT_POLICIES:
                        for k in k_grid(cfg.cells.count, given[name]):
                            jobs.append((str(path), h, seed, name, k))
                    else:
                        jobs.append((str(path), h, seed, name, None))
    return jobs, digests, stationary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", type=Path, default=DEFAULT_CONFIGS)
    parser.add_argument("--hours", type=float, nargs="+", default=[6.0, 24.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (processes)")
    parser.add_argument("--cache", type=Path, default=None, help="peer results kept here")
    parser.add_argument(
        "--waterlevel",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a [policies.waterlevel] setting for every workload (repeatable)",
    )
    args = parser.parse_args(argv)
    for path in args.configs:
        if not path.is_file():
            parser.error(f"no config file at {path}")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    settings = waterlevel_settings(args.waterlevel)
    jobs, digests, stationary = plan(args.configs, args.hours, args.seeds, args.peers, settings)
    cache = json.loads(args.cache.read_text()) if args.cache and args.cache.is_file() else {}
    keys = [_key(digests[j[0]], *j[1:]) for j in jobs]
    todo = [
        j for j, key in zip(jobs, keys, strict=True) if j[3] == "waterlevel" or key not in cache
    ]
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} from the cache", file=sys.stderr, flush=True)
    done = _run_all(todo, args.jobs)
    results = dict(cache)
    for j, r in zip(todo, done, strict=True):
        results[_key(digests[j[0]], *j[1:])] = r
    if args.cache:
        args.cache.write_text(
            json.dumps({k: v for k, v in results.items() if "|waterlevel|" not in k})
        )
    report(args, jobs, keys, results, stationary)
    return 0


def _run_all(todo: list, jobs: int) -> list[dict]:
    """``run_one`` of every job, ``jobs`` at a time, in order, with a progress line on
    stderr as each ends (a full run is hundreds of simulations)."""
    start, out = time.monotonic(), [None] * len(todo)
    with contextlib.ExitStack() as stack:
        if jobs > 1:
            pool = stack.enter_context(ProcessPoolExecutor(jobs))
            pending = {pool.submit(run_one, j): i for i, j in enumerate(todo)}
            finished = (f for f in as_completed(pending))
            results = ((pending[f], f.result()) for f in finished)
        else:
            results = ((i, run_one(j)) for i, j in enumerate(todo))
        for n, (i, r) in enumerate(results, 1):
            out[i] = r
            path, h, seed, name, k = todo[i]
            print(
                f"[{n}/{len(todo)} {time.monotonic() - start:6.0f}s] {Path(path).stem} {h:g} h "
                f"seed {seed} {name}{'' if k is None else f' k={k}'}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
    return out


def report(args, jobs, keys, results, stationary) -> None:
    by: dict[tuple, list[tuple[str, object, dict]]] = {}
    for (path, h, seed, name, k), key in zip(jobs, keys, strict=True):
        by.setdefault((path, h, seed), []).append((name, k, results[key]))
    print(
        f"{'workload':<24}{'h':>4}{'seed':>5}{'waterlevel':>11}{'idle':>6}{'drop':>6}"
        f"{'best peer':>16}{'Mtok/h':>8}{'idle':>6}{'drop':>6}{'ratio':>7}{'ceiling':>8}"
        f"{'bound':>7}"
    )
    summary: dict[tuple, list[tuple[float, float, float]]] = {}  # waterlevel, peer, bound
    for (path, h, seed), runs in by.items():
        wl = next(r for n, _, r in runs if n == "waterlevel")
        bound = next(r for n, _, r in runs if n == BOUND)
        peers = [(n, k, r) for n, k, r in runs if n not in ("waterlevel", BOUND)]
        name, k, best = max(peers, key=lambda p: p[2]["tokens_per_hour"])
        ceiling = max(r["idle_free"] for n, _, r in runs if n != BOUND)
        ceiling /= best["tokens_per_hour"]
        ratio = wl["tokens_per_hour"] / best["tokens_per_hour"]
        summary.setdefault((path, h), []).append(
            (wl["tokens_per_hour"], best["tokens_per_hour"], bound["finished"])
        )
        label = f"{name}" + (f" k={k}" if k is not None else "")
        print(
            f"{Path(path).stem.removeprefix('simulate_'):<24}{h:>4g}{seed:>5}"
            f"{wl['tokens_per_hour'] / 1e6:>11.2f}{wl['idle']:>6.3f}{wl['dropped']:>6}"
            f"{label:>16}{best['tokens_per_hour'] / 1e6:>8.2f}{best['idle']:>6.3f}"
            f"{best['dropped']:>6}{ratio:>7.3f}{ceiling:>8.3f}"
            f"{bound['finished'] / best['tokens_per_hour']:>7.3f}",
            flush=True,
        )
    print(f"\nover seeds {' '.join(map(str, args.seeds))} (ratio of summed tokens; min per seed):")
    for (path, h), pairs in summary.items():
        wls, bests, bounds = zip(*pairs, strict=True)
        ratio, bound = sum(wls) / sum(bests), sum(bounds) / sum(bests)
        low = min(w / b for w, b in zip(wls, bests, strict=True))
        target = TARGET_STATIONARY if stationary[path] else TARGET_CHANGING
        kind = "stationary" if stationary[path] else "changing"
        missed = sum(w / b < target for w, b in zip(wls, bests, strict=True))
        verdict = (
            "meets it on every seed"
            if not missed
            else f"misses it on {missed} of {len(pairs)} seeds"
        )
        print(
            f"  {Path(path).stem.removeprefix('simulate_'):<24}{h:>4g} h  {ratio:.3f}x "
            f"(min {low:.3f}x)  {kind}: target {target:.1f}x, {verdict}; "
            f"staleness-bound ceiling {bound:.3f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
