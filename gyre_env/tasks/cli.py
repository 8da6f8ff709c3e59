"""`gyre tasks list` and `gyre tasks check` (the gold preflight)."""

from __future__ import annotations

import argparse
import sys
import time


def add_commands(sub) -> None:
    """Register ``gyre tasks ...`` on the ``gyre`` command's subparsers."""
    tasks = sub.add_parser("tasks", help="list and check task suites")
    tsub = tasks.add_subparsers(dest="tasks_command", required=True)

    ls = tsub.add_parser("list", help="one line per task: id, tier, domain, tests, spec words")
    _suite_args(ls)
    ls.set_defaults(func=_cmd_list)

    check = tsub.add_parser(
        "check", help="run each task's gold solution and an empty workspace through its tests"
    )
    _suite_args(check)
    check.add_argument("--task", action="append", default=[], help="only this task id (repeatable)")
    check.add_argument("--jobs", type=int, default=None, help="tasks checked in parallel")
    check.set_defaults(func=_cmd_check)


def _suite_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default="builtin", help="suite name or folder (default: builtin)")
    p.add_argument("--tier", choices=("micro", "small", "repo"), help="only tasks of this tier")
    p.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the suite loader, e.g. -o checkout=PATH -o tests=PATH",
    )


def _load(args) -> list:
    from gyre_env.tasks.registry import UnknownNameError, get_task, load_suite
    from gyre_env.tasks.task import TaskFormatError

    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"gyre tasks: --option needs KEY=VALUE, got {item!r}")
        options[key] = value
    try:
        tasks = load_suite(args.suite, **options)
        if getattr(args, "task", None):
            tasks = [get_task(t, args.suite, **options) for t in args.task]
    except (UnknownNameError, TaskFormatError, TypeError) as e:
        raise SystemExit(f"gyre tasks: error: {e}") from e
    if args.tier:
        tasks = [t for t in tasks if t.tier == args.tier]
    return tasks


def format_table(rows: list[list[str]], right: tuple[int, ...] = ()) -> str:
    """Columns separated by two spaces; column indices in ``right`` are right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _cmd_list(args) -> int:
    tasks = _load(args)
    rows = [["id", "tier", "domain", "tests", "spec words"]]
    rows += [[t.id, t.tier, t.domain, str(t.test_count), str(t.spec_words)] for t in tasks]
    print(format_table(rows, right=(3, 4)))
    print(f"{len(tasks)} tasks, {sum(t.test_count for t in tasks)} tests")
    return 0


def _cmd_check(args) -> int:
    from gyre_env.tasks.check import check_tasks

    tasks = _load(args)
    start = time.monotonic()
    failed = 0
    for result in check_tasks(tasks, workers=args.jobs):
        t = result.task
        gold = (
            f"gold {result.gold.passed}/{t.test_count} passed, {result.gold.collected} collected"
            if result.gold
            else "no gold"
        )
        line = f"{t.id}: {gold}; empty {result.empty.passed}/{t.test_count}"
        if result.visible is not None:
            line += f"; visible {result.visible.passed}/{result.visible.collected}"
        if result.ok:
            print(f"PASS {line}")
        else:
            failed += 1
            print(f"FAIL {line}: {'; '.join(result.problems)}")
            if result.gold and result.gold.score < 1.0:
                print(result.gold.log, file=sys.stderr)
    took = time.monotonic() - start
    print(f"{len(tasks) - failed} passed, {failed} failed in {took:.1f}s")
    return 1 if failed else 0
