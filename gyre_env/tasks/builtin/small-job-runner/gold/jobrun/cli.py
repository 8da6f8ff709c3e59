"""The `jobrun` command line."""

import argparse
import sys

from jobrun.runner import run_commands


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _parser():
    p = argparse.ArgumentParser(prog="jobrun")
    p.add_argument("-j", type=_positive_int, default=4)
    p.add_argument("--timeout", type=_positive_float)
    p.add_argument("--fail-fast", action="store_true")
    p.add_argument("--show-output", action="store_true")
    p.add_argument("file")
    return p


def _label(result):
    if result.status == "failed":
        return f"[exit {result.returncode}]"
    return f"[{result.status}]"


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
    except OSError:
        print(f"jobrun: error: cannot read {args.file}", file=sys.stderr)
        return 2
    commands = [ln.strip() for ln in text.splitlines()]
    commands = [c for c in commands if c and not c.startswith("#")]
    results = run_commands(commands, args.j, args.timeout, args.fail_fast)
    for r in results:
        print(f"{_label(r)} {r.command}")
        if args.show_output and r.stdout:
            for line in r.stdout.splitlines():
                print(f"    {line}")
    n = {s: sum(r.status == s for r in results) for s in ("ok", "failed", "timeout", "skipped")}
    print(f"{n['ok']} ok, {n['failed']} failed, {n['timeout']} timed out, {n['skipped']} skipped")
    return 0 if n["ok"] == len(results) else 1
