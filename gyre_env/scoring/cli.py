"""`gyre tasks check`: the gold preflight, graded in sandboxes.

The command sits under `gyre tasks` (``gyre_env.cli`` passes this module the subparsers
that :func:`gyre_env.tasks.cli.add_commands` returns), but lives here: it needs sandboxes
and scoring, which tasks/ does not import.
"""

from __future__ import annotations

import sys
import time

from gyre_env.sandbox import BACKENDS
from gyre_env.tasks.cli import add_suite_args, load_tasks_from_args


def add_commands(tasks_sub) -> None:
    """Register ``check`` on the ``gyre tasks`` subparsers."""
    check = tasks_sub.add_parser(
        "check", help="grade each task's gold solution and an empty workspace in sandboxes"
    )
    add_suite_args(check)
    check.add_argument("--task", action="append", default=[], help="only this task id (repeatable)")
    check.add_argument("--jobs", type=int, default=None, help="tasks checked in parallel")
    check.add_argument(
        "--backend",
        choices=("auto", *BACKENDS),
        default="auto",
        help="sandbox backend, as for episodes (default auto: $GYRE_SANDBOX, else docker, "
        "else bwrap, else local)",
    )
    check.add_argument(
        "--no-gold-ok",
        action="store_true",
        help="accept tasks without a gold solution: only the empty run is checked",
    )
    check.set_defaults(func=_cmd_check)


def _cmd_check(args) -> int:
    from gyre_env.sandbox import choose_backend
    from gyre_env.scoring.preflight import check_tasks

    tasks = load_tasks_from_args(args)
    backend = choose_backend(args.backend)
    start = time.monotonic()
    failed = 0
    results = check_tasks(
        tasks, workers=args.jobs, require_gold=not args.no_gold_ok, backend=backend
    )
    for result in results:
        t = result.task
        gold = (
            f"gold {result.gold.passed}/{t.test_count} passed, {result.gold.collected} collected"
            if result.gold
            else "no gold"
        )
        line = f"{t.id}: {gold}; empty {result.empty.passed}/{t.test_count}"
        if t.fail_to_pass:  # PASS_TO_PASS pass unchanged: the score says more than the count
            line += f" (score {result.empty.score:g})"
        if result.visible is not None:
            line += f"; visible {result.visible.counts.passed}/{result.visible.counts.collected}"
        if result.ok:
            print(f"PASS {line}")
        else:
            failed += 1
            print(f"FAIL {line}: {'; '.join(result.problems)}")
            if result.gold and result.gold.score < 1.0:
                for run in result.gold.commands:
                    print(f"$ {run.command}\n[exit {run.exit_code}]\n{run.output}", file=sys.stderr)
    took = time.monotonic() - start
    print(f"{len(tasks) - failed} passed, {failed} failed in {took:.1f}s (sandbox: {backend})")
    return 1 if failed else 0
