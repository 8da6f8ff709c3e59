"""The `minikv` command line."""

import argparse
import os
import sys

from minikv.persist import load_snapshot
from minikv.session import Session
from minikv.store import Store


def main(argv=None):
    p = argparse.ArgumentParser(prog="minikv")
    p.add_argument("--snapshot")
    p.add_argument("script", nargs="?", default="-")
    args = p.parse_args(argv)
    store = Store()
    if args.snapshot and os.path.exists(args.snapshot):
        try:
            store = load_snapshot(args.snapshot)
        except ValueError:
            print(f"minikv: error: cannot load snapshot {args.snapshot}", file=sys.stderr)
            return 1
    try:
        if args.script == "-":
            lines = sys.stdin.read().splitlines()
        else:
            with open(args.script, encoding="utf-8") as f:
                lines = f.read().splitlines()
    except OSError:
        print(f"minikv: error: cannot read {args.script}", file=sys.stderr)
        return 1
    session = Session(store, args.snapshot)
    for line in lines:
        out = session.run_line(line)
        if out is not None:
            print(out)
    return 0
