"""``gyre train CONFIG.toml`` / ``gyre train --preset cpu-demo``."""

from __future__ import annotations

import argparse
import sys


def add_commands(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a model: SFT warm start, then GRPO/PPO on packed token trees",
        description=__doc__,
    )
    p.add_argument("config", nargs="?", help="a TOML config file (see gyre_env/train/config.py)")
    p.add_argument("--preset", help="a shipped config instead of a file (cpu-demo)")
    p.add_argument("--seed", type=int, help="override seed")
    p.add_argument("--out", help="run folder (default runs/<name>)")
    p.add_argument("--iterations", type=int, help="override schedule.iterations")
    p.add_argument("--backend", choices=("torch", "megatron"), help="override the training backend")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any field, e.g. --set rollout.group_size=4 (repeatable)",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--elastic",
        action="store_true",
        help="RL on elastic cells that switch between rollout and training at runtime "
        "(overrides elastic.enabled)",
    )
    p.add_argument(
        "--cells", type=int, help="cells for --elastic (overrides elastic.cells, default 2)"
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="--elastic: the cells' trainers as Ray actors in one placement group; 'auto' "
        "joins the running cluster (else starts a local one), 'local', or host:port "
        "(needs pip install 'gyre-env[ray]'; overrides elastic.ray)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from gyre_env._optional import MissingExtraError
    from gyre_env.train.config import ConfigError, load_config

    overrides = list(args.set)
    for key, value in (("seed", args.seed), ("schedule.iterations", args.iterations)):
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.backend is not None:
        overrides.append(f"backend={args.backend!r}")
    if args.out is not None:
        overrides.append(f"out={args.out!r}")
    if args.no_progress:
        overrides.append("logging.progress=false")
    if args.elastic:
        overrides.append("elastic.enabled=true")
    if args.cells is not None:
        overrides.append(f"elastic.cells={args.cells}")
    if args.ray is not None:
        overrides.append(f"elastic.ray={args.ray!r}")
    try:
        cfg = load_config(args.config, preset=args.preset, overrides=overrides)
        if cfg.elastic.enabled:
            from gyre_env.train.elastic import train_elastic

            elastic = cfg.elastic
            result = train_elastic(cfg, elastic.cells, elastic.ray, resume=args.resume)
            return 130 if result is None else 0
        from gyre_env.train.loop import train

        summary = train(cfg, resume=args.resume)
    except (ConfigError, MissingExtraError) as e:
        print(f"gyre train: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:  # trainers.steps.NonFiniteStepError: the run diverged
        print(
            f"gyre train: {e}\n(the checkpoint under {cfg.out_dir / 'checkpoints'} holds the last "
            "weights saved before it)",
            file=sys.stderr,
        )
        return 1
    return 130 if summary.interrupted else 0
