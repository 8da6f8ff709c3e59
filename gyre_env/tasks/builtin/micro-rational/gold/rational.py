"""Exact rational numbers."""

import math
import re

_PARSE = re.compile(r"^\s*([+-]?\d+)\s*(?:/\s*(\d+))?\s*$")


class Rational:
    __slots__ = ("_n", "_d")

    def __init__(self, numerator, denominator=1):
        for v in (numerator, denominator):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"expected int, got {v!r}")
        if denominator == 0:
            raise ZeroDivisionError("zero denominator")
        if denominator < 0:
            numerator, denominator = -numerator, -denominator
        g = math.gcd(numerator, denominator)
        self._n = numerator // g
        self._d = denominator // g

    @classmethod
    def parse(cls, s):
        m = _PARSE.match(s)
        if not m:
            raise ValueError(f"not a rational: {s!r}")
        return cls(int(m.group(1)), int(m.group(2) or 1))

    @property
    def numerator(self):
        return self._n

    @property
    def denominator(self):
        return self._d

    @staticmethod
    def _coerce(other):
        if isinstance(other, Rational):
            return other
        if isinstance(other, int) and not isinstance(other, bool):
            return Rational(other)
        return None

    def __add__(self, other):
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        return Rational(self._n * o._d + o._n * self._d, self._d * o._d)

    __radd__ = __add__

    def __sub__(self, other):
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        return Rational(self._n * o._d - o._n * self._d, self._d * o._d)

    def __rsub__(self, other):
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        return o - self

    def __mul__(self, other):
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        return Rational(self._n * o._n, self._d * o._d)

    __rmul__ = __mul__

    def __truediv__(self, other):
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        if o._n == 0:
            raise ZeroDivisionError("division by zero")
        return Rational(self._n * o._d, self._d * o._n)

    def __rtruediv__(self, other):
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        return o / self

    def __neg__(self):
        return Rational(-self._n, self._d)

    def __abs__(self):
        return Rational(abs(self._n), self._d)

    def __pow__(self, n):
        if not isinstance(n, int) or isinstance(n, bool):
            return NotImplemented
        if n >= 0:
            return Rational(self._n**n, self._d**n)
        if self._n == 0:
            raise ZeroDivisionError("zero to a negative power")
        return Rational(self._d**-n, self._n**-n)

    def __eq__(self, other):
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        return self._n == o._n and self._d == o._d

    def _cmp(self, other):
        o = self._coerce(other)
        if o is None:
            return None
        return self._n * o._d - o._n * self._d

    def __lt__(self, other):
        c = self._cmp(other)
        return NotImplemented if c is None else c < 0

    def __le__(self, other):
        c = self._cmp(other)
        return NotImplemented if c is None else c <= 0

    def __gt__(self, other):
        c = self._cmp(other)
        return NotImplemented if c is None else c > 0

    def __ge__(self, other):
        c = self._cmp(other)
        return NotImplemented if c is None else c >= 0

    def __hash__(self):
        if self._d == 1:
            return hash(self._n)
        return hash((self._n, self._d))

    def __float__(self):
        return self._n / self._d

    def __int__(self):
        q = abs(self._n) // self._d
        return q if self._n >= 0 else -q

    def __bool__(self):
        return self._n != 0

    def __str__(self):
        return str(self._n) if self._d == 1 else f"{self._n}/{self._d}"

    def __repr__(self):
        return f"Rational({self._n}, {self._d})"
