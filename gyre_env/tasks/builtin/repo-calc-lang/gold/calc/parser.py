"""Tokens to syntax trees; `dump` renders a tree as an S-expression."""

from dataclasses import dataclass
from fractions import Fraction

from calc.errors import CalcSyntaxError
from calc.lexer import Token, tokenize


@dataclass
class Number:
    value: Fraction
    token: Token


@dataclass
class Bool:
    value: bool
    token: Token


@dataclass
class Name:
    name: str
    token: Token


@dataclass
class Unary:
    op: str  # "neg", "pos", "not"
    operand: object
    token: Token


@dataclass
class Binary:
    op: str
    left: object
    right: object
    token: Token


@dataclass
class If:
    cond: object
    then: object
    other: object
    token: Token


@dataclass
class Call:
    name: str
    args: list
    token: Token


@dataclass
class Let:
    name: str
    expr: object
    token: Token


@dataclass
class Def:
    name: str
    params: list
    body: object
    token: Token


COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


class _Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.i = 0

    @property
    def tok(self):
        return self.tokens[self.i]

    def is_(self, kind, text=None):
        t = self.tok
        return t.kind == kind and (text is None or t.text == text)

    def take(self):
        t = self.tok
        self.i += 1
        return t

    def fail(self, t=None):
        t = t or self.tok
        if t.kind == "NEWLINE":
            msg = "unexpected end of line"
        elif t.kind == "EOF":
            msg = "unexpected end of input"
        else:
            msg = f"unexpected '{t.text}'"
        raise CalcSyntaxError(msg, t.line, t.col)

    def expect(self, kind, text=None):
        if not self.is_(kind, text):
            self.fail()
        return self.take()

    # ------------------------------------------------------------ statements
    def program(self):
        statements = []
        while not self.is_("EOF"):
            if self.is_("NEWLINE") or self.is_("OP", ";"):
                self.take()
                continue
            statements.append(self.statement())
            if not (self.is_("NEWLINE") or self.is_("OP", ";") or self.is_("EOF")):
                self.fail()
        return statements

    def statement(self):
        if self.is_("KEYWORD", "let"):
            self.take()
            name = self.expect("NAME")
            self.expect("OP", "=")
            return Let(name.text, self.expression(), name)
        if self.is_("KEYWORD", "def"):
            self.take()
            name = self.expect("NAME")
            self.expect("OP", "(")
            params = []
            if not self.is_("OP", ")"):
                while True:
                    p = self.expect("NAME")
                    if p.text in params:
                        raise CalcSyntaxError(f"duplicate parameter '{p.text}'", p.line, p.col)
                    params.append(p.text)
                    if not self.is_("OP", ","):
                        break
                    self.take()
            self.expect("OP", ")")
            self.expect("OP", "=")
            return Def(name.text, params, self.expression(), name)
        return self.expression()

    # ----------------------------------------------------------- expressions
    def expression(self):
        if self.is_("KEYWORD", "if"):
            t = self.take()
            cond = self.expression()
            self.expect("KEYWORD", "then")
            then = self.expression()
            self.expect("KEYWORD", "else")
            return If(cond, then, self.expression(), t)
        return self.or_expr()

    def or_expr(self):
        left = self.and_expr()
        while self.is_("KEYWORD", "or"):
            t = self.take()
            left = Binary("or", left, self.and_expr(), t)
        return left

    def and_expr(self):
        left = self.not_expr()
        while self.is_("KEYWORD", "and"):
            t = self.take()
            left = Binary("and", left, self.not_expr(), t)
        return left

    def not_expr(self):
        if self.is_("KEYWORD", "not"):
            t = self.take()
            return Unary("not", self.not_expr(), t)
        return self.comparison()

    def comparison(self):
        left = self.additive()
        if self.tok.kind == "OP" and self.tok.text in COMPARISONS:
            t = self.take()
            left = Binary(t.text, left, self.additive(), t)
            if self.tok.kind == "OP" and self.tok.text in COMPARISONS:
                self.fail()
        return left

    def additive(self):
        left = self.term()
        while self.tok.kind == "OP" and self.tok.text in ("+", "-"):
            t = self.take()
            left = Binary(t.text, left, self.term(), t)
        return left

    def term(self):
        left = self.unary()
        while self.tok.kind == "OP" and self.tok.text in ("*", "/", "//", "%"):
            t = self.take()
            left = Binary(t.text, left, self.unary(), t)
        return left

    def unary(self):
        if self.tok.kind == "OP" and self.tok.text in ("-", "+"):
            t = self.take()
            return Unary("neg" if t.text == "-" else "pos", self.unary(), t)
        return self.power()

    def power(self):
        base = self.primary()
        if self.is_("OP", "**"):
            t = self.take()
            return Binary("**", base, self.unary(), t)
        return base

    def primary(self):
        t = self.tok
        if t.kind == "NUMBER":
            self.take()
            return Number(Fraction(t.text), t)
        if t.kind == "KEYWORD" and t.text in ("true", "false"):
            self.take()
            return Bool(t.text == "true", t)
        if t.kind == "NAME":
            self.take()
            if not self.is_("OP", "("):
                return Name(t.text, t)
            self.take()
            args = []
            if not self.is_("OP", ")"):
                args.append(self.expression())
                while self.is_("OP", ","):
                    self.take()
                    args.append(self.expression())
            self.expect("OP", ")")
            return Call(t.text, args, t)
        if self.is_("OP", "("):
            self.take()
            inner = self.expression()
            self.expect("OP", ")")
            return inner
        self.fail()


def parse(source):
    return _Parser(tokenize(source)).program()


def format_number(value):
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


def dump(node):
    if isinstance(node, Number):
        return format_number(node.value)
    if isinstance(node, Bool):
        return "true" if node.value else "false"
    if isinstance(node, Name):
        return node.name
    if isinstance(node, Unary):
        return f"({node.op} {dump(node.operand)})"
    if isinstance(node, Binary):
        return f"({node.op} {dump(node.left)} {dump(node.right)})"
    if isinstance(node, If):
        return f"(if {dump(node.cond)} {dump(node.then)} {dump(node.other)})"
    if isinstance(node, Call):
        return "(call " + " ".join([node.name] + [dump(a) for a in node.args]) + ")"
    if isinstance(node, Let):
        return f"(let {node.name} {dump(node.expr)})"
    if isinstance(node, Def):
        return f"(def {node.name} ({' '.join(node.params)}) {dump(node.body)})"
    raise TypeError(f"not a node: {node!r}")
