"""The `csvq` command line."""

import argparse
import json
import sys

from csvq.parse import CsvError, read_table, write_csv
from csvq.query import QueryError, format_table, run_query


def _limit(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _parser():
    p = argparse.ArgumentParser(prog="csvq")
    p.add_argument("file")
    p.add_argument("--where", action="append", default=[])
    p.add_argument("--select")
    p.add_argument("--sort")
    p.add_argument("--desc", action="store_true")
    p.add_argument("--limit", type=_limit)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--delimiter", default=",")
    p.add_argument("--count", action="store_true")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8", newline="") as f:
                text = f.read()
        table = read_table(text, args.delimiter)
        select = args.select.split(",") if args.select else None
        columns, rows = run_query(table, args.where, select, args.sort, args.desc, args.limit)
    except (OSError, CsvError, QueryError) as e:
        print(f"csvq: error: {e}", file=sys.stderr)
        return 1
    if args.count:
        print(len(rows))
    elif args.format == "table":
        sys.stdout.write(format_table(columns, rows))
    elif args.format == "csv":
        body = [columns] + [[r[c] for c in columns] for r in rows]
        sys.stdout.write(write_csv(body, args.delimiter))
    else:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    return 0
