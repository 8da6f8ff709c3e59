"""The `todo` command line."""

import argparse
import datetime
import os
import sys

from todo.store import PRIORITIES, TodoError, TodoStore


def _parser():
    p = argparse.ArgumentParser(prog="todo")
    p.add_argument("--file", default=None)
    p.add_argument("--today", default=None)
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add")
    add.add_argument("title")
    add.add_argument("--priority", choices=PRIORITIES, default="normal")
    add.add_argument("--due")
    add.add_argument("--tag", action="append", default=[])
    ls = sub.add_parser("list")
    which = ls.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_const", dest="status", const="all")
    which.add_argument("--done", action="store_const", dest="status", const="done")
    ls.add_argument("--tag")
    ls.add_argument("--sort", choices=("id", "priority", "due"), default="id")
    for name in ("done", "reopen", "rm"):
        sub.add_parser(name).add_argument("id", type=int)
    edit = sub.add_parser("edit")
    edit.add_argument("id", type=int)
    edit.add_argument("--title")
    edit.add_argument("--priority", choices=PRIORITIES)
    due = edit.add_mutually_exclusive_group()
    due.add_argument("--due")
    due.add_argument("--no-due", action="store_true")
    sub.add_parser("stats")
    return p


def format_item(item):
    line = f"{item['id']:>3} [{'x' if item['done'] else ' '}] {item['priority'][0].upper()} "
    line += item["title"]
    if item["due"]:
        line += f" due:{item['due']}"
    line += "".join(f" +{t}" for t in item["tags"])
    return line


def _run(args, store):
    if args.command == "add":
        item = store.add(args.title, args.priority, args.due, args.tag)
        print(f"Added #{item['id']}: {item['title']}")
    elif args.command == "list":
        items = store.list(args.status or "open", args.tag, args.sort)
        for item in items:
            print(format_item(item))
        if not items:
            print("No items.")
    elif args.command == "done":
        store.complete(args.id)
        print(f"Completed #{args.id}.")
    elif args.command == "reopen":
        store.reopen(args.id)
        print(f"Reopened #{args.id}.")
    elif args.command == "rm":
        store.remove(args.id)
        print(f"Removed #{args.id}.")
    elif args.command == "edit":
        kwargs = {"title": args.title, "priority": args.priority}
        if args.no_due:
            kwargs["due"] = None
        elif args.due is not None:
            kwargs["due"] = args.due
        store.edit(args.id, **kwargs)
        print(f"Updated #{args.id}.")
    elif args.command == "stats":
        today = datetime.date.fromisoformat(args.today) if args.today else datetime.date.today()
        n_open = len(store.list("open"))
        n_done = len(store.list("done"))
        print(f"open: {n_open}, done: {n_done}, overdue: {len(store.overdue(today))}")


def main(argv=None):
    args = _parser().parse_args(argv)
    path = args.file or os.environ.get("TODO_FILE") or "todo.json"
    try:
        _run(args, TodoStore(path))
    except (TodoError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
