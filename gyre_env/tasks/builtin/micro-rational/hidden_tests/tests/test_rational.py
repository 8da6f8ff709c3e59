import pytest
from rational import Rational as R


def test_normalization():
    r = R(2, -4)
    assert (r.numerator, r.denominator) == (-1, 2)
    z = R(0, 5)
    assert (z.numerator, z.denominator) == (0, 1)


def test_constructor_errors():
    with pytest.raises(ZeroDivisionError):
        R(1, 0)
    with pytest.raises(TypeError):
        R(1.5, 2)
    with pytest.raises(TypeError):
        R(True, 2)


def test_read_only():
    r = R(1, 2)
    with pytest.raises(AttributeError):
        r.numerator = 3


@pytest.mark.parametrize(
    "text,expected", [("3/4", R(3, 4)), (" -6 / 8 ", R(-3, 4)), ("+5", R(5)), ("10/5", R(2))]
)
def test_parse(text, expected):
    assert R.parse(text) == expected


def test_parse_errors():
    for bad in ("", "1/", "a/b", "1/-2", "1.5", "1/2/3"):
        with pytest.raises(ValueError):
            R.parse(bad)
    with pytest.raises(ZeroDivisionError):
        R.parse("1/0")


def test_arithmetic_with_ints_both_sides():
    assert R(1, 2) + R(1, 3) == R(5, 6)
    assert 1 - R(1, 4) == R(3, 4)
    assert R(2, 3) * 3 == 2
    assert 2 / R(4) == R(1, 2)
    assert R(3, 4) - R(3, 4) == 0


def test_division_by_zero_and_bad_types():
    with pytest.raises(ZeroDivisionError):
        R(1, 2) / 0
    with pytest.raises(ZeroDivisionError):
        1 / R(0)
    with pytest.raises(TypeError):
        R(1, 2) + 0.5
    with pytest.raises(TypeError):
        "x" * R(1, 2)


def test_powers():
    assert R(2, 3) ** 2 == R(4, 9)
    assert R(2, 3) ** -2 == R(9, 4)
    assert R(-1, 2) ** -1 == R(-2)
    assert R(5, 7) ** 0 == 1
    with pytest.raises(ZeroDivisionError):
        R(0) ** -1


def test_comparisons_and_hash():
    assert R(1, 3) < R(1, 2) <= R(2, 4)
    assert R(5, 2) > 2 and R(2) >= 2
    assert hash(R(6, 3)) == hash(2)
    assert {R(1, 2): "half"}[R(2, 4)] == "half"


def test_conversions():
    assert float(R(1, 4)) == 0.25
    assert int(R(-7, 2)) == -3 and int(R(7, 2)) == 3
    assert not R(0) and R(1, 9)
    assert -R(1, 2) == R(-1, 2) and abs(R(-3, 4)) == R(3, 4)


def test_str_and_repr():
    assert str(R(-3, 6)) == "-1/2"
    assert str(R(4, 2)) == "2"
    assert repr(R(-3, 6)) == "Rational(-1, 2)"
