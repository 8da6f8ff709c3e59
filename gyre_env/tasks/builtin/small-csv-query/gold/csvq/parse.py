"""A hand-written RFC 4180 CSV parser and writer."""


class CsvError(ValueError):
    def __init__(self, message, line):
        super().__init__(f"line {line}: {message}")
        self.line = line


def _check_delimiter(delimiter):
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '"\r\n':
        raise ValueError(f"bad delimiter {delimiter!r}")


def parse_csv(text, delimiter=","):
    return _parse(text, delimiter)[0]


def _parse(text, delimiter):
    """Records, and the 1-based line on which each record starts."""
    _check_delimiter(delimiter)
    starts = []
    rows = []
    row = []
    field = []
    i = 0
    n = len(text)
    line = 1
    while i < n:
        if len(starts) == len(rows):
            starts.append(line)
        ch = text[i]
        if not field and ch == '"':
            start_line = line
            i += 1
            while True:
                if i >= n:
                    raise CsvError("unterminated quoted field", start_line)
                ch = text[i]
                if ch == '"':
                    if i + 1 < n and text[i + 1] == '"':
                        field.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                if ch == "\n":
                    line += 1
                field.append(ch)
                i += 1
            if i < n and text[i] not in (delimiter, "\n") and text[i : i + 2] != "\r\n":
                raise CsvError("unexpected character after closing quote", line)
            field.append("")  # marks a quoted (possibly empty) field as started
            continue
        if ch == delimiter:
            row.append("".join(field))
            field = []
            i += 1
        elif ch == "\n" or text[i : i + 2] == "\r\n":
            row.append("".join(field))
            rows.append(row)
            row, field = [], []
            i += 1 if ch == "\n" else 2
            line += 1
        else:
            field.append(ch)
            i += 1
    if field or row:
        row.append("".join(field))
        rows.append(row)
    return rows, starts


def _quote(field, delimiter, alone):
    if any(c in field for c in (delimiter, '"', "\n", "\r")) or (alone and field == ""):
        return '"' + field.replace('"', '""') + '"'
    return field


def write_csv(rows, delimiter=","):
    _check_delimiter(delimiter)
    out = []
    for row in rows:
        alone = len(row) == 1
        out.append(delimiter.join(_quote(f, delimiter, alone) for f in row) + "\n")
    return "".join(out)


class Table:
    def __init__(self, columns, rows):
        self.columns = columns
        self.rows = rows


def read_table(text, delimiter=","):
    records, starts = _parse(text, delimiter)
    if not records:
        raise CsvError("no header", 1)
    header = records[0]
    if len(set(header)) != len(header):
        raise CsvError("duplicate column names", 1)
    rows = []
    for index, record in enumerate(records[1:], start=1):
        if len(record) != len(header):
            raise CsvError(f"expected {len(header)} fields, got {len(record)}", starts[index])
        rows.append(dict(zip(header, record, strict=True)))
    return Table(list(header), rows)
