"""Evaluation of parsed programs."""

import math
import sys
from fractions import Fraction

from calc.errors import CalcRuntimeError
from calc.parser import Binary, Bool, Call, Def, If, Let, Name, Number, Unary, parse

MAX_DEPTH = 100
BUILTINS = {"abs", "min", "max", "floor", "ceil", "round", "num", "den"}


def format_value(value, decimals=None):
    if isinstance(value, bool):
        return "true" if value else "false"
    if decimals is None:
        if value.denominator == 1:
            return str(value.numerator)
        return f"{value.numerator}/{value.denominator}"
    scaled = round(value * 10**decimals)  # half to even
    sign = "-" if scaled < 0 else ""
    digits = str(abs(scaled)).rjust(decimals + 1, "0")
    if decimals == 0:
        return sign + digits
    return f"{sign}{digits[:-decimals]}.{digits[-decimals:]}"


def _err(message, token):
    return CalcRuntimeError(message, token.line, token.col)


def _number(value, token):
    if isinstance(value, bool):
        raise _err("expected a number, got boolean", token)
    return value


def _boolean(value, token):
    if not isinstance(value, bool):
        raise _err("expected a boolean, got number", token)
    return value


def _arith(op, a, b, token):
    if op in ("/", "//", "%") and b == 0:
        raise _err("division by zero", token)
    if op == "**":
        if b.denominator != 1:
            raise _err("exponent must be an integer", token)
        if a == 0 and b < 0:
            raise _err("division by zero", token)
        return Fraction(a) ** int(b)
    return {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "/": lambda: a / b,
        "//": lambda: Fraction(a // b),
        "%": lambda: a % b,
        "<": lambda: a < b,
        "<=": lambda: a <= b,
        ">": lambda: a > b,
        ">=": lambda: a >= b,
    }[op]()


class Interpreter:
    def __init__(self):
        self.variables = {}
        self.functions = {}
        self._depth = 0

    def run(self, source):
        statements = parse(source)
        results = []
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20000))
        try:
            for st in statements:
                if isinstance(st, Def):
                    if st.name in BUILTINS:
                        raise _err(f"cannot redefine builtin '{st.name}'", st.token)
                    self.functions[st.name] = st
                elif isinstance(st, Let):
                    value = self.eval(st.expr, {})
                    self.variables[st.name] = value
                    results.append(value)
                else:
                    results.append(self.eval(st, {}))
        finally:
            sys.setrecursionlimit(limit)
        return results

    def eval(self, node, scope):
        if isinstance(node, (Number, Bool)):
            return node.value
        if isinstance(node, Name):
            if node.name in scope:
                return scope[node.name]
            if node.name in self.variables:
                return self.variables[node.name]
            raise _err(f"undefined variable '{node.name}'", node.token)
        if isinstance(node, Unary):
            value = self.eval(node.operand, scope)
            if node.op == "not":
                return not _boolean(value, node.token)
            value = _number(value, node.token)
            return -value if node.op == "neg" else value
        if isinstance(node, Binary):
            return self._binary(node, scope)
        if isinstance(node, If):
            cond = _boolean(self.eval(node.cond, scope), node.token)
            return self.eval(node.then if cond else node.other, scope)
        if isinstance(node, Call):
            return self._call(node, scope)
        raise TypeError(f"cannot evaluate {node!r}")

    def _binary(self, node, scope):
        left = self.eval(node.left, scope)
        if node.op in ("and", "or"):
            if _boolean(left, node.token) == (node.op == "or"):
                return left
            return _boolean(self.eval(node.right, scope), node.token)
        right = self.eval(node.right, scope)
        if node.op in ("==", "!="):
            same = isinstance(left, bool) == isinstance(right, bool) and left == right
            return same if node.op == "==" else not same
        a, b = _number(left, node.token), _number(right, node.token)
        return _arith(node.op, a, b, node.token)

    def _call(self, node, scope):
        if node.name in BUILTINS:
            args = [self.eval(a, scope) for a in node.args]
            return self._builtin(node, args)
        fn = self.functions.get(node.name)
        if fn is None:
            raise _err(f"undefined function '{node.name}'", node.token)
        args = [self.eval(a, scope) for a in node.args]
        if len(args) != len(fn.params):
            noun = "argument" if len(fn.params) == 1 else "arguments"
            raise _err(f"{node.name} expects {len(fn.params)} {noun}, got {len(args)}", node.token)
        if self._depth >= MAX_DEPTH:
            raise _err("maximum recursion depth exceeded", node.token)
        self._depth += 1
        try:
            return self.eval(fn.body, dict(zip(fn.params, args, strict=True)))
        finally:
            self._depth -= 1

    def _builtin(self, node, args):
        name, t = node.name, node.token
        if name in ("min", "max"):
            if not args:
                raise _err(f"{name} expects at least 1 argument, got 0", t)
        elif name == "round":
            if len(args) not in (1, 2):
                raise _err(f"round expects 1 or 2 arguments, got {len(args)}", t)
        elif len(args) != 1:
            raise _err(f"{name} expects 1 argument, got {len(args)}", t)
        nums = [_number(a, t) for a in args]
        if name == "round":
            if len(nums) == 2:
                if nums[1].denominator != 1:
                    raise _err("expected an integer", t)
                return Fraction(round(nums[0], int(nums[1])))
            return Fraction(round(nums[0]))
        x = nums[0]
        return {
            "abs": lambda: abs(x),
            "min": lambda: min(nums),
            "max": lambda: max(nums),
            "floor": lambda: Fraction(math.floor(x)),
            "ceil": lambda: Fraction(math.ceil(x)),
            "num": lambda: Fraction(x.numerator),
            "den": lambda: Fraction(x.denominator),
        }[name]()
