"""Simulator speed at scale: 1,000 cells and 10,000 concurrent episodes (issue 12 asks
for 24 simulated hours in <= 60 s).

    python benchmarks/simulator_scale.py [--hours 24] [--policy waterlevel]

The NL2Repo-shaped workload of ``examples/simulate_nl2repo.toml`` on ``--cells`` cells
with ``--episodes`` agent slots; prints simulated hours, events, wall seconds and events/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gyre_env.sim.compare import policy_factories
from gyre_env.sim.config import load_sim_config
from gyre_env.sim.simulator import simulate

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "simulate_nl2repo.toml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=10000)
    parser.add_argument("--policy", default="waterlevel")
    args = parser.parse_args(argv)
    cfg = load_sim_config(EXAMPLE)
    cfg.duration_s = args.hours * 3600
    cfg.cells.count = args.cells
    cfg.workload.max_concurrent_episodes = args.episodes
    cfg.training.groups_per_step = max(1, args.episodes // 64)
    cfg.gantt_max_segments = 0
    make = policy_factories(cfg)[args.policy]
    policy = make(round(args.cells * 0.75)) if args.policy in ("static_split", "async") else make()
    r = simulate(cfg, policy)
    print(
        f"{args.policy}: {args.cells} cells, {args.episodes} agent slots, {args.hours:g} "
        f"simulated h: {r.events} events in {r.wall_s:.1f} s ({r.events / r.wall_s:,.0f} "
        f"events/s), {r.steps} steps, {r.trained_samples} samples"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
