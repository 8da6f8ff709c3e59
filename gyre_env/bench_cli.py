"""``gyre bench``: the command line of :mod:`gyre_env.bench` (imports stay light here)."""

from __future__ import annotations

import argparse

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
    """``python -m gyre_env.bench_cli ...``: the same as ``gyre bench ...``."""
    p = argparse.ArgumentParser(prog="gyre bench", description=DESCRIPTION)
    add_arguments(p)
    args = p.parse_args(argv)
    return args.func(args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("env_id", nargs="?", default="Gyre/NL2Repo-v0", help="Gymnasium env id")
    p.add_argument(
        "--agent",
        default="langgraph",
        help="langgraph | claude-code | scripted (gold solutions, or --script) | gold | "
        "'<shell command>' run in the sandbox with its base URL set",
    )
    p.add_argument(
        "--tasks",
        default="micro",
        help="'all', tiers (micro,small,repo) and/or task ids, comma-separated",
    )
    p.add_argument("--suite", default="builtin", help="task suite name or folder")
    p.add_argument("--parallel", type=int, default=4, help="episodes at once")
    p.add_argument("--repeats", type=int, default=1, help="episodes per task")
    p.add_argument(
        "--model",
        default=None,
        help="local HF model folder for the embedded engine (default: tiny); "
        "with --base-url, the upstream model name",
    )
    p.add_argument(
        "--base-url",
        default=None,
        help="forward model calls to this OpenAI/Anthropic-compatible API through the "
        "proxy (key from $GYRE_UPSTREAM_API_KEY)",
    )
    p.add_argument(
        "--api", default="openai", choices=("openai", "anthropic"), help="the API of --base-url"
    )
    p.add_argument("--script", default=None, help="JSON list of tool calls for --agent scripted")
    p.add_argument("--out", default="bench-out", help="output folder")
    p.add_argument(
        "--store",
        default=None,
        help="also write calls and outcomes to this trajectory store (SQLite file)",
    )
    p.add_argument("--run", default="", help="run name in the store (default: the --out name)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds per episode")
    p.add_argument("--max-retries", type=int, default=2, help="retries of infra_error episodes")
    p.add_argument("--max-steps", type=int, default=None, help="agent step budget")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        help="tokens per model call (LangGraph; Claude Code via CLAUDE_CODE_MAX_OUTPUT_TOKENS)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    import json
    import logging
    import signal

    from gyre_env.bench import BenchConfig, run_bench

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = BenchConfig(
        env_id=args.env_id,
        agent=args.agent,
        tasks=args.tasks,
        suite=args.suite,
        repeats=args.repeats,
        parallel=args.parallel,
        model=args.model,
        base_url=args.base_url,
        api=args.api,
        script=args.script,
        out_dir=args.out,
        store=args.store,
        run=args.run,
        time_limit_s=args.time_limit,
        max_retries=args.max_retries,
        max_steps=args.max_steps,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        progress=not args.no_progress,
    )

    def on_term(signum, frame):  # leave through the normal path: sandboxes get closed
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        run = run_bench(cfg)
    except KeyboardInterrupt:
        print("gyre bench: interrupted; running episodes were cancelled")
        return 130
    if args.json:
        print(json.dumps(run.summary, indent=1))
    bad = run.summary["outcomes"].get("infra_error", 0)
    return 1 if bad else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
