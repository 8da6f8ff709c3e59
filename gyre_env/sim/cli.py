"""``gyre simulate CONFIG.toml --out DIR``: every policy on a simulated cluster."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path


def add_commands(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="compare scheduling policies on a simulated cluster",
        description=(
            "Run Gyre's waterlevel policy and its peers (colocated synchronous, static split, "
            "asynchronous with a staleness bound, dynamic resource scheduling) on the cluster "
            "and workload of CONFIG.toml; write simulation.json and report.html to --out."
        ),
    )
    p.add_argument("config", type=Path, help="simulation config (TOML)")
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON and HTML report")
    p.add_argument("--duration", type=float, default=None, help="override duration_s")
    p.add_argument("--no-sweeps", action="store_true", help="skip the [sweep] runs")
    p.set_defaults(func=_simulate)


def _simulate(args) -> int:
    from gyre_env._optional import MissingExtraError
    from gyre_env.config import ConfigError
    from gyre_env.sim.compare import compare
    from gyre_env.sim.config import load_sim_config
    from gyre_env.sim.report import headline, write_report

    try:
        cfg = load_sim_config(args.config)
    except ConfigError as e:
        print(f"gyre simulate: {e}", file=sys.stderr)
        return 2
    if args.duration is not None:
        try:  # replace() checks the config again, as loading it did
            cfg = dataclasses.replace(cfg, duration_s=args.duration)
        except ConfigError as e:
            print(f"gyre simulate: --duration: {e}", file=sys.stderr)
            return 2

    def progress(what: str) -> None:
        print(f"  running {what}", file=sys.stderr, flush=True)

    comp = compare(cfg, sweeps=not args.no_sweeps, progress=progress)
    print(headline(cfg, comp))
    if not any(r.steps for r in comp.results.values()):
        print(
            f"note: no policy finished a training step in {cfg.duration_s / 3600:.2f} simulated"
            " h, so every throughput above is 0: the first batch"
            f" ({cfg.training.groups_per_step} groups of {cfg.workload.group_size} episodes)"
            " takes longer than that. Raise duration_s (or --duration)."
        )
    try:
        json_path, html_path = write_report(cfg, comp, args.out)
    except MissingExtraError as e:  # the simulation is not lost for want of a plot
        print(f"wrote {Path(args.out) / 'simulation.json'}; no report.html: {e}")
        return 0
    print(f"wrote {json_path} and {html_path}")
    return 0
