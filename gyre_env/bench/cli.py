"""``gyre bench``: the command line of :mod:`gyre_env.bench` (imports stay light here).

Every flag is a ``BenchConfig`` field and takes its default from it.
"""

from __future__ import annotations

import argparse
import dataclasses

from gyre_env.bench.config import BenchConfig

_D = BenchConfig()
# flag dest -> BenchConfig field, where the names differ
_FIELD = {"out": "out_dir", "time_limit": "time_limit_s"}

DESCRIPTION = (
    "Run an agent over a task suite through Gyre's proxy (default model: the embedded tiny "
    "model, expect scores near 0) and report scores and where time went."
)


def add_commands(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="run an agent over tasks; print a table, write JSON results and an HTML report",
        description=DESCRIPTION,
    )
    add_arguments(p)


def main(argv: list[str] | None = None) -> int:
    """``python -m gyre_env.bench ...``: the same as ``gyre bench ...``."""
    p = argparse.ArgumentParser(prog="gyre bench", description=DESCRIPTION)
    add_arguments(p)
    args = p.parse_args(argv)
    return args.func(args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("env_id", nargs="?", default=_D.env_id, help="Gymnasium env id")
    p.add_argument(
        "--agent",
        default=_D.agent,
        help="langgraph | mini-swe-agent | claude-code | codex | scripted (gold solutions, or --script) | gold | "
        "'<shell command>' run in the sandbox with its base URL set",
    )
    p.add_argument(
        "--tasks",
        default=_D.tasks,
        help="'all', tiers (micro,small,repo) and/or task ids, comma-separated",
    )
    p.add_argument("--suite", default=_D.suite, help="task suite name or folder")
    p.add_argument("--parallel", type=int, default=_D.parallel, help="episodes at once")
    p.add_argument("--repeats", type=int, default=_D.repeats, help="episodes per task")
    p.add_argument(
        "--model",
        default=_D.model,
        help="local HF model folder for the embedded engine (default: tiny); "
        "with --base-url, the upstream model name",
    )
    p.add_argument(
        "--base-url",
        default=_D.base_url,
        help="forward model calls to this OpenAI/Anthropic-compatible API through the "
        "proxy (key from $GYRE_UPSTREAM_API_KEY)",
    )
    p.add_argument(
        "--api", default=_D.api, choices=("openai", "anthropic"), help="the API of --base-url"
    )
    p.add_argument(
        "--script", default=_D.script, help="JSON list of tool calls for --agent scripted"
    )
    p.add_argument("--out", default=_D.out_dir, help="output folder")
    p.add_argument(
        "--store",
        default=_D.store,
        help="also write calls and outcomes to this trajectory store (SQLite file)",
    )
    p.add_argument("--run", default=_D.run, help="run name in the store (default: the --out name)")
    p.add_argument("--time-limit", type=float, default=_D.time_limit_s, help="seconds per episode")
    p.add_argument(
        "--max-retries", type=int, default=_D.max_retries, help="retries of infra_error episodes"
    )
    p.add_argument("--max-steps", type=int, default=_D.max_steps, help="agent step budget")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=_D.max_new_tokens,
        help="tokens per model call (LangGraph, mini-swe-agent; Claude Code via CLAUDE_CODE_MAX_OUTPUT_TOKENS)",
    )
    p.add_argument("--seed", type=int, default=_D.seed)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    p.set_defaults(func=_bench)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The ``BenchConfig`` the parsed flags describe (every field that has a flag)."""
    values = {"progress": not args.no_progress}
    for f in dataclasses.fields(BenchConfig):
        dest = next((d for d, name in _FIELD.items() if name == f.name), f.name)
        if hasattr(args, dest) and f.name != "progress":
            values[f.name] = getattr(args, dest)
    return BenchConfig(**values)


def _bench(args: argparse.Namespace) -> int:
    import json
    import logging
    import signal
    import sys

    from gyre_env._optional import MissingExtraError
    from gyre_env.bench.run import run_bench
    from gyre_env.sandbox import SandboxError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = config_from_args(args)

    def on_term(signum, frame):  # leave through the normal path: sandboxes get closed
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        run = run_bench(cfg)
    except MissingExtraError as e:  # an agent whose package is not installed
        print(f"gyre bench: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:  # an agent CLI that is not installed: says how
        print(f"gyre bench: {e}")
        return 2
    except KeyboardInterrupt:
        print("gyre bench: interrupted; running episodes were cancelled")
        return 130
    except SandboxError as e:  # the sandboxes, checked before any work
        print(f"gyre bench: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(run.summary, indent=1))
    bad = run.summary["outcomes"].get("infra_error", 0)
    return 1 if bad else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
