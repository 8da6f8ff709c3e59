"""Predicted vs measured wall time of real runs (issue 12's validation).

    python benchmarks/simulator_validation.py RUN_DIR [RUN_DIR ...]

A ``gyre train`` run folder: its synchronous RL iterations are simulated from the run's
own inputs (per call and per tool timings, optimizer step times, the run's shape) with
the colocated synchronous policy, the one ``gyre train`` really runs. A ``gyre train
--elastic`` run folder or a folder of ``benchmarks/elastic.py --trace-out`` (both hold
``elastic-trace.json``): the elastic run on real cells is simulated with the policy it
ran (colocated, static split or waterlevel) from its calls, tool waits, steps and
switches. Each three ways: replaying the measured call times, pricing calls with the
cell model fitted to them, and drawing fresh episodes from distributions fitted to the
trace. Measured: the iterations' wall time from metrics.jsonl
(held-out evaluations between iterations excluded), or the elastic run's start to its
last step. Prints every pair.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gyre_env.sim.trace import TRACE_FILE, validate_elastic, validate_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="gyre train run folders, or elastic trace folders")
    parser.add_argument("--fitted-seeds", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args(argv)
    for folder in args.runs:  # every folder checked before any work
        here = Path(folder)
        if (here / "elastic.json").is_file() and not (here / TRACE_FILE).is_file():
            parser.error(
                f"{folder}: a gyre train --elastic run without {TRACE_FILE} (a resumed "
                "run, or one from before runs wrote it, has none)"
            )
        if not (here / TRACE_FILE).is_file() and not (here / "config.json").is_file():
            parser.error(
                f"{folder}: neither a gyre train run folder (no config.json) nor an elastic "
                f"trace folder (no {TRACE_FILE}; gyre train --elastic and "
                "benchmarks/elastic.py --trace-out write them)"
            )
    print(
        f"{'run':<24}{'mode':<16}{'policy':<13}{'covers':>15}{'predicted s':>13}"
        f"{'measured s':>12}{'error':>9}"
    )
    worst = 0.0
    for folder in args.runs:
        validate = validate_elastic if (Path(folder) / TRACE_FILE).is_file() else validate_run
        try:
            rows = validate(folder, args.fitted_seeds)
        except (OSError, ValueError, KeyError) as e:
            why = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            parser.error(f"{folder}: cannot be read as simulator input ({why})")
        for v in rows:
            worst = max(worst, abs(v.error))
            print(
                f"{folder[-24:]:<24}{v.mode:<16}{v.policy:<13}{f'{v.count} {v.unit}':>15}"
                f"{v.predicted_s:>13.1f}{v.measured_s:>12.1f}{100 * v.error:>8.1f}%",
                flush=True,
            )
    print(f"worst |error| {100 * worst:.1f}% (target <= {100 * args.tolerance:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
