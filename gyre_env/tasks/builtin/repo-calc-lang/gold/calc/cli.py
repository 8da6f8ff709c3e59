"""The `calc` command line."""

import argparse
import sys

from calc.errors import CalcError
from calc.interpreter import Interpreter, format_value


def _decimals(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def main(argv=None):
    p = argparse.ArgumentParser(prog="calc")
    p.add_argument("-e", dest="sources", action="append", default=[])
    p.add_argument("--decimal", type=_decimals)
    p.add_argument("file", nargs="?")
    args = p.parse_args(argv)
    if args.sources:
        lines = args.sources
    elif args.file:
        try:
            with open(args.file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError:
            print(f"calc: error: cannot read {args.file}", file=sys.stderr)
            return 2
    else:
        lines = sys.stdin.read().splitlines()
    interp = Interpreter()
    status = 0
    for number, line in enumerate(lines, start=1):
        try:
            values = interp.run(line)
        except CalcError as e:
            print(f"error: {number}:{e.col}: {e.message}", file=sys.stderr)
            status = 1
            continue
        for v in values:
            print(format_value(v, args.decimal))
    return status
