"""Filter, sort, select and format table rows."""

OPERATORS = ("<=", ">=", "!=", "=", "<", ">", "~")
_OP_CHARS = "=!<>~"


class QueryError(ValueError):
    pass


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


class Condition:
    def __init__(self, column, op, value):
        self.column = column
        self.op = op
        self.value = value

    def matches(self, row):
        if self.column not in row:
            raise QueryError(f"unknown column {self.column!r}")
        cell = row[self.column]
        if self.op == "~":
            return self.value in cell
        a, b = _number(cell), _number(self.value)
        if a is None or b is None:
            a, b = cell, self.value
        return {
            "=": a == b,
            "!=": a != b,
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
        }[self.op]


def parse_condition(text):
    pos = next((i for i, ch in enumerate(text) if ch in _OP_CHARS), None)
    if pos is None:
        raise QueryError(f"no operator in condition {text!r}")
    column = text[:pos].strip()
    if not column:
        raise QueryError(f"no column in condition {text!r}")
    op = next((o for o in OPERATORS if text.startswith(o, pos)), None)
    if op is None:
        raise QueryError(f"bad operator in condition {text!r}")
    return Condition(column, op, text[pos + len(op) :].strip())


def run_query(table, where=(), select=None, sort=None, descending=False, limit=None):
    conditions = [parse_condition(w) for w in where]
    for c in conditions:
        if c.column not in table.columns:
            raise QueryError(f"unknown column {c.column!r}")
    rows = [r for r in table.rows if all(c.matches(r) for c in conditions)]
    if sort is not None:
        if sort not in table.columns:
            raise QueryError(f"unknown column {sort!r}")
        numbers = [_number(r[sort]) for r in rows]
        if all(v is not None for v in numbers):
            keyed = sorted(
                zip(numbers, range(len(rows)), strict=True), key=lambda p: p[0], reverse=descending
            )
            rows = [rows[i] for _, i in keyed]
        else:
            rows = sorted(rows, key=lambda r: r[sort], reverse=descending)
    if limit is not None:
        rows = rows[:limit]
    columns = list(table.columns) if select is None else list(select)
    for c in columns:
        if c not in table.columns:
            raise QueryError(f"unknown column {c!r}")
    return columns, [{c: r[c] for c in columns} for r in rows]


def format_table(columns, rows):
    widths = [max([len(c)] + [len(r[c]) for r in rows]) for c in columns]
    lines = [" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    for r in rows:
        lines.append(" | ".join(r[c].ljust(w) for c, w in zip(columns, widths, strict=True)))
    return "".join(line.rstrip() + "\n" for line in lines)
