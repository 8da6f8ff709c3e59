"""The `wordcount` command line."""

import argparse
import sys

from wordcount.counting import Counts, count_bytes
from wordcount.freq import top_words

_FIELDS = [("lines", "l"), ("words", "w"), ("chars", "m"), ("bytes", "c"), ("max_line_length", "L")]


def _nonnegative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _parser():
    p = argparse.ArgumentParser(prog="wordcount")
    for field, flag in _FIELDS:
        p.add_argument(f"-{flag}", dest=field, action="store_true")
    p.add_argument("--top", type=_nonnegative)
    p.add_argument("--stop")
    p.add_argument("files", nargs="*")
    return p


def _read_all(names):
    """[(name, data or None)]; None marks an unreadable file (already reported)."""
    out = []
    for name in names or [None]:
        if name in (None, "-"):
            out.append((name, sys.stdin.buffer.read()))
            continue
        try:
            with open(name, "rb") as f:
                out.append((name, f.read()))
        except OSError:
            print(f"wordcount: {name}: cannot read", file=sys.stderr)
            out.append((name, None))
    return out


def _print_counts(args, inputs):
    fields = [f for f, _ in _FIELDS if getattr(args, f)] or ["lines", "words", "bytes"]
    rows = [(name, count_bytes(data)) for name, data in inputs if data is not None]
    if len(args.files) > 1:
        total = Counts()
        for _, c in rows:
            total = total + c
        rows.append(("total", total))
    numbers = [getattr(c, f) for _, c in rows for f in fields]
    width = max([1] + [len(str(n)) for n in numbers])
    for name, c in rows:
        line = " ".join(str(getattr(c, f)).rjust(width) for f in fields)
        print(line if name is None else f"{line} {name}")


def _print_top(args, inputs):
    status = 0
    stop = []
    if args.stop:
        try:
            with open(args.stop, encoding="utf-8") as f:
                stop = [w.strip() for w in f if w.strip()]
        except OSError:
            print(f"wordcount: {args.stop}: cannot read", file=sys.stderr)
            status = 1
    text = "\n".join(d.decode("utf-8", errors="replace") for _, d in inputs if d is not None)
    pairs = top_words(text, args.top, stop)
    width = max([1] + [len(str(c)) for _, c in pairs])
    for word, count in pairs:
        print(f"{str(count).rjust(width)} {word}")
    return status


def main(argv=None):
    args = _parser().parse_args(argv)
    inputs = _read_all(args.files)
    status = 1 if any(d is None for _, d in inputs) else 0
    if args.top is not None:
        return max(status, _print_top(args, inputs))
    _print_counts(args, inputs)
    return status
