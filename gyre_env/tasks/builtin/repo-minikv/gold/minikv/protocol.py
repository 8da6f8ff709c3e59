"""Tokenizing command lines and rendering replies."""


class Status(str):
    """A status reply such as OK."""


class CommandError(Exception):
    """An error reply; the message starts with an error code word."""


class ProtocolError(CommandError):
    pass


_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
_BLANKS = " \t"
_HEX = "0123456789abcdefABCDEF"


def _double_quoted(line, i):
    out = []
    while i < len(line):
        ch = line[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch == "\\" and i + 1 < len(line):
            nxt = line[i + 1]
            digits = line[i + 2 : i + 4]
            if nxt == "x" and len(digits) == 2 and all(c in _HEX for c in digits):
                out.append(chr(int(digits, 16)))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    raise ProtocolError("ERR unbalanced quotes")


def _single_quoted(line, i):
    out = []
    while i < len(line):
        ch = line[i]
        if ch == "'":
            return "".join(out), i + 1
        if ch == "\\" and line[i + 1 : i + 2] == "'":
            out.append("'")
            i += 2
            continue
        out.append(ch)
        i += 1
    raise ProtocolError("ERR unbalanced quotes")


def tokenize(line):
    args = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in _BLANKS:
            i += 1
        if i >= n:
            return args
        if line[i] in "\"'":
            reader = _double_quoted if line[i] == '"' else _single_quoted
            arg, i = reader(line, i + 1)
            if i < n and line[i] not in _BLANKS:
                raise ProtocolError("ERR syntax error in quoted argument")
        else:
            start = i
            while i < n and line[i] not in _BLANKS:
                i += 1
            arg = line[start:i]
        args.append(arg)


def _quote(s):
    out = ['"']
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def format_reply(reply):
    if isinstance(reply, Status):
        return str(reply)
    if isinstance(reply, CommandError):
        return f"(error) {reply}"
    if isinstance(reply, bool):
        return f"(integer) {int(reply)}"
    if isinstance(reply, int):
        return f"(integer) {reply}"
    if reply is None:
        return "(nil)"
    if isinstance(reply, str):
        return _quote(reply)
    if isinstance(reply, list):
        if not reply:
            return "(empty array)"
        width = len(str(len(reply)))
        lines = []
        for index, item in enumerate(reply, start=1):
            prefix = f"{str(index).rjust(width)}) "
            sub = format_reply(item).split("\n")
            lines.append(prefix + sub[0])
            lines.extend(" " * len(prefix) + s for s in sub[1:])
        return "\n".join(lines)
    raise TypeError(f"cannot format {reply!r}")
