"""Choosing RL settings without the held-out tasks: RL variants on the validation split.

Per seed, one ``gyre train --preset P`` run with ``tasks.eval_split = "validation"``
(SFT and RL on nano's ``fit`` split, evaluated on ``validation``, both cut from the
train split; the held-out tasks are neither trained nor evaluated), then every other
variant's RL branched from that run's SFT checkpoint (same weights, gold data, RNG and
task draws), so that variants differ only in their RL settings. Each model (the SFT
checkpoint and every variant's result) is then measured with ``--eval-attempts``
sampled attempts per validation task, with its standard error over tasks.

    python benchmarks/train_validation.py --seeds 1 3 \\
        --variant pass='algorithm.sample.reward="pass"' \\
        --variant neg25=algorithm.sample.negative_scale=0.25

The first variant is always ``base`` (the preset as shipped). A variant is
``NAME=KEY=VALUE[;KEY=VALUE...]`` in ``--set`` syntax. Finished runs and measurements
under ``--out`` are reused, so more variants or seeds can be added to a folder later.
Prints a table of validation pass rates (variant - SFT per seed) and writes
``validation.json``. About 12 minutes per variant and seed on 2 cores (SFT 4 more).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from train_cpu import _measure


def _variant(text: str) -> tuple[str, list[str]]:
    name, sep, sets = text.partition("=")
    if not sep or not name or not sets:
        raise argparse.ArgumentTypeError(f"expected NAME=KEY=VALUE[;KEY=VALUE...], got {text!r}")
    return name, [s for s in sets.split(";") if s]


def run_variant(args, seed: int, name: str, sets: list[str], first: Path | None) -> Path:
    """Train one variant (``first``: the seed's base run, whose SFT checkpoint it
    branches from; None trains SFT too) unless its folder already holds a model."""
    from gyre_env.train import load_config, train

    out = Path(args.out) / f"seed{seed}-{name}"
    if (out / "model").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(
        preset=args.preset, overrides=[*_base(args, seed), *sets, f"out={str(out)!r}"]
    )
    if first is None:
        summary = train(cfg)
    else:
        out.mkdir(parents=True)
        shutil.copytree(first / "checkpoint-sft", out / "checkpoints")
        for f in ("store.db", "metrics.jsonl"):
            shutil.copy(first / f, out / f)
        summary = train(cfg, resume=True)
    if summary.interrupted:
        raise KeyboardInterrupt(f"stopped in {out}")
    return out


def _base(args, seed: int) -> list[str]:
    sets = ['tasks.eval_split="validation"', f"seed={seed}", "logging.tensorboard=false"]
    return sets + (["logging.progress=false"] if args.no_progress else []) + args.set


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--out", default="runs/train-validation")
    p.add_argument("--variant", type=_variant, action="append", default=[], metavar="NAME=SETS")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="every run")
    p.add_argument("--eval-attempts", type=int, default=4, metavar="N")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--table-only", action="store_true", help="run nothing: print the table")
    args = p.parse_args(argv)
    variants = dict([("base", []), *args.variant])
    if len(variants) != len(args.variant) + 1:
        p.error("variant names must be distinct and not 'base'")
    out = Path(args.out)
    path = out / "validation.json"
    results = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    for seed in [] if args.table_only else args.seeds:
        first = None
        for name, sets in variants.items():
            print(f"== seed {seed} {name}", file=sys.stderr, flush=True)
            run = run_variant(args, seed, name, sets, first)
            first = first or run
            models = {name: run / "model", **({"sft": run / "model-sft"} if name == "base" else {})}
            for key, model in models.items():
                mine = results.setdefault(str(seed), {})
                if key not in mine:
                    base = [*_base(args, seed), *sets]
                    mine[key] = _measure(args, base, model, out / f"seed{seed}-measure-{key}")
                    out.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(results, indent=1), encoding="utf-8")
    _table(results, ["sft", *variants], args)
    return 0


def _table(results: dict, keys: list[str], args) -> None:
    print(
        f"\nvalidation nano pass rate (preset {args.preset}; {args.eval_attempts} sampled "
        "attempts per task; +- standard error over tasks)"
    )
    print("seed " + "".join(f"{k:>16}" for k in keys))
    gains = {k: [] for k in keys[1:]}
    for seed in map(str, args.seeds):
        r = results.get(seed, {})
        cells = [f"{r[k]['pass_rate']:.3f}+-{r[k]['stderr']:.3f}" if k in r else "-" for k in keys]
        print(f"{seed:>4} " + "".join(f"{c:>16}" for c in cells))
        for k in keys[1:]:
            if k in r and "sft" in r:
                gains[k].append(r[k]["pass_rate"] - r["sft"]["pass_rate"])
    for k, g in gains.items():
        if g:
            print(f"{k:>8} - sft: mean {np.mean(g):+.3f}  min {np.min(g):+.3f} ({len(g)} seeds)")


if __name__ == "__main__":
    sys.exit(main())
