"""Source text to tokens."""

import re
from dataclasses import dataclass

from calc.errors import CalcSyntaxError

KEYWORDS = {"let", "def", "if", "then", "else", "and", "or", "not", "true", "false"}
OPERATORS = [
    "**",
    "//",
    "==",
    "!=",
    "<=",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "<",
    ">",
    "(",
    ")",
    ",",
    "=",
    ";",
]
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Token:
    kind: str
    text: str
    line: int
    col: int


def tokenize(source):
    tokens = []
    line, line_start, i, n = 1, 0, 0, len(source)
    while i < n:
        ch = source[i]
        col = i - line_start + 1
        if ch in " \t\r":
            i += 1
        elif ch == "#":
            while i < n and source[i] != "\n":
                i += 1
        elif ch == "\n":
            tokens.append(Token("NEWLINE", "\n", line, col))
            i += 1
            line, line_start = line + 1, i
        elif m := _NUMBER.match(source, i):
            tokens.append(Token("NUMBER", m.group(), line, col))
            i = m.end()
        elif m := _NAME.match(source, i):
            word = m.group()
            tokens.append(Token("KEYWORD" if word in KEYWORDS else "NAME", word, line, col))
            i = m.end()
        else:
            op = next((o for o in OPERATORS if source.startswith(o, i)), None)
            if op is None:
                raise CalcSyntaxError(f"unexpected character '{ch}'", line, col)
            tokens.append(Token("OP", op, line, col))
            i += len(op)
    tokens.append(Token("EOF", "", line, n - line_start + 1))
    return tokens
