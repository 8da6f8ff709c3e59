"""Each policy's throughput and busy fraction, and the waterlevel policy's ratio to the best
peer, at several horizons and seeds (issue 12's figures, not tuned on one config).

    python benchmarks/simulator_policies.py CONFIG.toml [--hours 6 24] [--seeds 0 1 2]

For every (hours, seed): ``compare`` without sweeps (the split policies at their best
``k`` of the config's sweep), one table row per policy (stale: episodes all of whose
output was past the staleness bound when trained), then the ratio. ``idle-free``: the policy's throughput had its cells
never idled or switched, at the cell time per trained token it ran at (throughput / busy
fraction); the largest of them over the best peer's throughput is roughly the most any
policy could gain on that workload, a ceiling for the ratio (an estimate, not a bound: a
policy that batches better would spend less cell time per token). The staleness-bound
ceiling is the tokens the asynchronous policy's groups bring to a step (trained, or
lost to the staleness bound) with the cells out of the way
(``gyre_env.sim.compare.bound_run``: ten times the cells, training and switches free):
what one batch per trainer version reaches on that workload whatever is done with the
cells.
"""

from __future__ import annotations

import argparse
import sys

from gyre_env.sim.compare import compare
from gyre_env.sim.config import load_sim_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument(
        "--hours", type=float, nargs="+", default=None, help="default: the config's"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    base = load_sim_config(args.config)
    for hours in args.hours or [base.duration_s / 3600.0]:
        for seed in args.seeds:
            cfg = load_sim_config(args.config)
            cfg.duration_s, cfg.seed, cfg.gantt_max_segments = hours * 3600.0, seed, 0
            comp = compare(cfg, sweeps=False)
            print(f"== {cfg.name}: {hours:g} h, seed {seed}")
            print(f"{'policy':<14}{'k':>4}{'Mtok/h':>9}{'samples/h':>11}{'busy R':>8}"
                  f"{'busy T':>8}{'idle':>7}{'steps':>6}{'stale':>7}{'idle-free':>10}")  # fmt: skip
            for name, r in comp.results.items():
                b, k = r.busy_fraction(), r.params.get("rollout_cells", "")
                free = r.idle_free_tokens_per_hour()
                print(
                    f"{name:<14}{k:>4}{r.tokens_per_hour / 1e6:>9.2f}{r.samples_per_hour:>11.1f}"
                    f"{b['rollout']:>8.3f}{b['training']:>8.3f}{r.idle_fraction():>7.3f}"
                    f"{r.steps:>6}{r.dropped_stale:>7}{free / 1e6:>10.2f}"
                )
            ratio = comp.waterlevel_ratio()
            if ratio is not None:
                print(
                    f"waterlevel / best peer ({comp.best_peer()}): {ratio:.3f}; "
                    f"idle-free ceiling / best peer: {comp.ceiling():.3f}; "
                    f"staleness-bound ceiling / best peer: {comp.bound_ceiling():.3f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
