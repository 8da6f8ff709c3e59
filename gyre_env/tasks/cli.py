"""`gyre tasks list` and `gyre tasks show`, and the helpers every `--suite` command shares.

`gyre tasks check` (the gold preflight) needs sandboxes, so it is registered by
:mod:`gyre_env.scoring.cli` on the subparsers ``add_commands`` returns: a task is data,
and tasks/ imports no sandbox or scoring."""

from __future__ import annotations

import argparse


def add_commands(sub):
    """Register ``gyre tasks ...`` on the ``gyre`` command's subparsers; returns the
    ``gyre tasks`` subparsers, for subcommands other folders add (``check``)."""
    tasks = sub.add_parser("tasks", help="list and check task suites")
    tsub = tasks.add_subparsers(dest="tasks_command", required=True)

    ls = tsub.add_parser("list", help="one line per task: id, tier, domain, tests, spec words")
    add_suite_args(ls)
    ls.set_defaults(func=_cmd_list)

    show = tsub.add_parser("show", help="print a task's metadata and spec")
    add_suite_args(show)
    show.add_argument("task", help="task id")
    show.set_defaults(func=_cmd_show)
    return tsub


def add_suite_args(p: argparse.ArgumentParser) -> None:
    """``--suite``, ``--tier`` and ``-o``: which tasks a command loads."""
    p.add_argument("--suite", default="builtin", help="suite name or folder (default: builtin)")
    p.add_argument("--tier", choices=("micro", "small", "repo"), help="only tasks of this tier")
    add_option_arg(p)


def add_option_arg(p) -> None:
    """``-o KEY=VALUE`` (repeatable): keyword arguments for a suite loader."""
    p.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the suite loader, e.g. -o checkout=PATH -o tests=PATH",
    )


def load_tasks_from_args(args, prog: str = "gyre tasks") -> list:
    """The tasks ``--suite``/``-o``/``--task``/``--tier`` select; bad input exits naming it."""
    from gyre_env.tasks.registry import UnknownNameError, get_task, load_suite
    from gyre_env.tasks.task import TaskFormatError

    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{prog}: --option needs KEY=VALUE, got {item!r}")
        options[key] = value
    try:
        tasks = load_suite(args.suite, **options)
        if getattr(args, "task", None):
            wanted = [args.task] if isinstance(args.task, str) else args.task
            by_id = {t.id: t for t in tasks}
            # get_task only for a missing id: it raises with a did-you-mean hint
            tasks = [by_id.get(i) or get_task(i, args.suite, **options) for i in wanted]
    except (UnknownNameError, TaskFormatError, TypeError, ValueError) as e:  # bad -o values too
        raise SystemExit(f"{prog}: error: {e}") from e
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
    tasks = load_tasks_from_args(args)
    rows = [["id", "tier", "domain", "tests", "spec words"]]
    rows += [[t.id, t.tier, t.domain, str(t.test_count), str(t.spec_words)] for t in tasks]
    print(format_table(rows, right=(3, 4)))
    print(f"{len(tasks)} tasks, {sum(t.test_count for t in tasks)} tests")
    return 0


def _cmd_show(args) -> int:
    (task,) = load_tasks_from_args(args)
    fields = {
        "id": task.id,
        "title": task.title,
        "tier": task.tier,
        "domain": task.domain,
        "tests": task.test_count,
        "spec words": task.spec_words,
        "image": task.image,
        "test commands": " ; ".join(task.test_commands),
        "hidden tests": ", ".join(task.hidden_test_paths),
        "visible tests": ", ".join(task.visible_test_paths) or "-",
        "limits": f"{task.max_steps} steps, {task.wall_clock_s:.0f}s",
        "gold": str(task.gold_dir) if task.gold_dir else "-",
        "source": task.source,
    }
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        print(f"{key.ljust(width)}  {value}")
    print()
    print(task.spec.rstrip())
    return 0
