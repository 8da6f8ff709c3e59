"""Predicted vs measured wall time of real runs: held out from the fit (enforced), or each
run from its own inputs.

    python benchmarks/simulator_validation.py --fit RUN_DIR [...] --predict RUN_DIR [...]
    python benchmarks/simulator_validation.py RUN_DIR [RUN_DIR ...]

**Held out** (``--fit`` / ``--predict``, elastic trace folders): the cells' costs (calls
by tokens and batch, optimizer steps by tokens and cells, switches per direction) are
fitted on the ``--fit`` runs only; each ``--predict`` run (none of them fitted: another
policy, another tool delay, another load) is simulated with the policy it ran, its shape
and its agents' work (tokens of each call, each tool wait), every call, step and switch
priced by that fit, against its measured wall time. The exit status is 1 when a held-out
run's |error| passes ``--tolerance`` (default 15%), 2 on bad input.

**Each run from its own inputs** (positional folders): a ``gyre train`` run folder's
synchronous RL iterations with the colocated policy, or an elastic run (``gyre train
--elastic`` or ``benchmarks/elastic.py --trace-out``, both write ``elastic-trace.json``)
with the policy it ran; each three ways: replaying the measured call times, pricing
calls with the cell model fitted to them, drawing fresh episodes from distributions
fitted to the trace. A check of the model's shape, not a prediction: printed, not
enforced.

Both print each run's per-group factor (:func:`gyre_env.sim.trace.group_factor`): how
much of an episode's turns, tokens and tool time its group shares (a group's episodes
are one task), which episodes drawn one by one do not reproduce.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gyre_env.sim.trace import (
    TRACE_FILE,
    fit_elastic_cells,
    group_factor,
    load_elastic_trace,
    load_run,
    validate_elastic,
    validate_held_out,
    validate_run,
)

HEADER = (
    f"{'run':<24}{'mode':<16}{'policy':<13}{'covers':>15}{'predicted s':>13}"
    f"{'measured s':>12}{'error':>9}"
)


def _row(v) -> str:
    return (
        f"{v.folder[-23:]:<24}{v.mode:<16}{v.policy:<13}{f'{v.count} {v.unit}':>15}"
        f"{v.predicted_s:>13.1f}{v.measured_s:>12.1f}{100 * v.error:>8.1f}%"
    )


def _factors(folder: str) -> str:
    here = Path(folder)
    trace = load_elastic_trace(here) if (here / TRACE_FILE).is_file() else load_run(here)
    f = group_factor(trace.groups)
    return f"{folder[-23:]:<24}" + "".join(f"{k:>9} {v:5.2f}" for k, v in f.items())


def _costs(c) -> str:
    """The fitted costs a prediction prices every call, step and switch with."""
    d, s = c.decode_tokens_per_s, c.batch_slowdown
    calls = (
        f"one host's cores (an output token (E + {s:.3f} (n - E)) / {d:.0f} s with n calls "
        f"on E busy engines; a call starting holds the others {1e3 * c.host_call_s:.1f} ms)"
        if c.shared_host
        else f"engines of their own (an output token (1 + {s:.3f} (n - 1)) / {d:.0f} s with "
        "n calls on its engine)"
    )
    return (
        f"calls on {calls}; prefill {c.prefill_tokens_per_s:.0f} tokens/s; steps "
        f"{c.train_tokens_per_s:.0f} tokens/s a cell, {c.dp_efficiency:.2f} efficiency on "
        f"more, {c.step_overhead_s:.2f} s overhead; switches {c.switch_to_training_s:.2f} s "
        f"to training, {c.switch_to_rollout_s:.2f} s back"
    )


def held_out(parser, args) -> int:
    for folder in args.fit + args.predict:
        if not (Path(folder) / TRACE_FILE).is_file():
            parser.error(f"{folder}: not an elastic trace folder (no {TRACE_FILE})")
    overlap = {str(Path(f).resolve()) for f in args.fit} & {
        str(Path(f).resolve()) for f in args.predict
    }
    if overlap:
        parser.error(f"runs both fitted and predicted: {', '.join(sorted(overlap))}")
    try:
        fits = [load_elastic_trace(f) for f in args.fit]
        rows = validate_held_out(fits, args.predict)
    except (OSError, ValueError, KeyError) as e:
        parser.error(f"cannot be read as simulator input ({e})")
    print(f"fitted on: {', '.join(args.fit)}")
    print(f"fitted cells: {_costs(fit_elastic_cells(fits[0], fits))}")
    print(HEADER)
    for v in rows:
        print(_row(v), flush=True)
    print("per-group factor (intra-group correlation, log space):")
    for folder in args.fit + args.predict:
        print("  " + _factors(folder))
    worst = max(abs(v.error) for v in rows)
    ok = worst <= args.tolerance
    print(
        f"held-out worst |error| {100 * worst:.1f}% (target <= {100 * args.tolerance:.0f}%): "
        + ("met" if ok else "MISSED")
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="gyre train run folders, or elastic trace folders")
    parser.add_argument("--fit", nargs="+", default=[], help="elastic runs to fit the cells on")
    parser.add_argument("--predict", nargs="+", default=[], help="elastic runs to predict")
    parser.add_argument("--fitted-seeds", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args(argv)
    if bool(args.fit) != bool(args.predict):
        parser.error("--fit and --predict go together")
    if args.fit and args.runs:
        parser.error("either --fit/--predict (held out) or run folders (each its own fit)")
    if args.fit:
        return held_out(parser, args)
    if not args.runs:
        parser.error("no runs: give run folders, or --fit and --predict")
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
    print(HEADER)
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
            print(_row(v), flush=True)
    print("per-group factor (intra-group correlation, log space):")
    for folder in args.runs:
        print("  " + _factors(folder))
    print(
        f"worst |error| {100 * worst:.1f}% (each run from its own inputs: printed, not "
        f"enforced; held out: --fit / --predict)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
