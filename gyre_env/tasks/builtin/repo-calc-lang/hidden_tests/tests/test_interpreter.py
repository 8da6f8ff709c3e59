from fractions import Fraction

import calc.errors as errors
import calc.interpreter as interpreter
import pytest


def run(source):
    return interpreter.Interpreter().run(source)


def value(source):
    (result,) = run(source)
    return result


@pytest.mark.parametrize(
    "source,expected",
    [
        ("1 + 2 * 3", Fraction(7)),
        ("1/3 + 1/6", Fraction(1, 2)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("7.5 // 2", Fraction(3)),
        ("-7 // 2", Fraction(-4)),
        ("-7 % 3", Fraction(2)),
        ("7.5 % 2", Fraction(3, 2)),
        ("2 ** 10", Fraction(1024)),
        ("(2/3) ** -2", Fraction(9, 4)),
        ("-2 ** 2", Fraction(-4)),
        ("2 ** 3 ** 2", Fraction(512)),
        ("1e-2 * 100", Fraction(1)),
    ],
)
def test_arithmetic_is_exact(source, expected):
    got = value(source)
    assert got == expected and isinstance(got, Fraction)


@pytest.mark.parametrize(
    "source,expected",
    [
        ("1 < 2", True),
        ("2 <= 2", True),
        ("3 > 4", False),
        ("1/2 >= 0.5", True),
        ("1 == 1.0", True),
        ("1 != 2", True),
        ("true == 1", False),
        ("true != 1", True),
        ("true == true", True),
        ("not (1 == 2)", True),
        ("true and false", False),
        ("false or true", True),
    ],
)
def test_comparisons_and_logic(source, expected):
    assert value(source) is expected


def test_short_circuit():
    assert value("false and 1/0 == 1") is False
    assert value("true or undefined_var") is True
    assert value("if true then 1 else 1/0") == 1
    assert value("if 1 > 2 then undefined_var else 5") == 5


def test_let_and_variables():
    interp = interpreter.Interpreter()
    assert interp.run("let x = 2; let y = x * 3; y + 1") == [2, 6, 7]
    assert interp.variables == {"x": 2, "y": 6}
    assert interp.run("x + y") == [8]


def test_def_produces_no_value_and_functions_persist():
    interp = interpreter.Interpreter()
    assert interp.run("def sq(x) = x * x") == []
    assert interp.run("sq(3) + sq(1/2)") == [Fraction(37, 4)]


def test_function_sees_globals_at_call_time_and_params_shadow():
    interp = interpreter.Interpreter()
    results = interp.run("let k = 2; let x = 100; def f(x) = x * k; f(1); let k = 3; f(1)")
    assert results == [2, 100, 2, 3, 3]


def test_recursion_and_forward_reference():
    interp = interpreter.Interpreter()
    interp.run("def fact(n) = if n <= 1 then 1 else n * fact(n - 1)")
    assert interp.run("fact(20)") == [2432902008176640000]
    interp.run("def even(n) = if n == 0 then true else odd(n - 1)")
    interp.run("def odd(n) = if n == 0 then false else even(n - 1)")
    assert interp.run("even(10); odd(7)") == [True, True]


def test_redefinition_replaces_function():
    interp = interpreter.Interpreter()
    assert interp.run("def f() = 1; f(); def f() = 2; f()") == [1, 2]


def test_recursion_depth_limit():
    interp = interpreter.Interpreter()
    definition = "def down(n) = if n == 0 then 0 else down(n - 1)"
    interp.run(definition)
    assert interp.run("down(99)") == [0]
    with pytest.raises(errors.CalcRuntimeError) as info:
        interp.run("down(100)")
    assert info.value.message == "maximum recursion depth exceeded"
    # the 101st call is the recursive one, written inside the definition
    assert (info.value.line, info.value.col) == (1, definition.index("down(n - 1)") + 1)


@pytest.mark.parametrize(
    "source,expected",
    [
        ("abs(-3/4)", Fraction(3, 4)),
        ("min(3, 1/2, 2)", Fraction(1, 2)),
        ("max(-1)", Fraction(-1)),
        ("floor(-7/2)", Fraction(-4)),
        ("ceil(7/2)", Fraction(4)),
        ("round(5/2)", Fraction(2)),
        ("round(7/2)", Fraction(4)),
        ("round(1/3, 2)", Fraction(33, 100)),
        ("round(0.125, 2)", Fraction(3, 25)),
        ("num(6/4)", Fraction(3)),
        ("den(0.25)", Fraction(4)),
    ],
)
def test_builtins(source, expected):
    assert value(source) == expected


@pytest.mark.parametrize(
    "source,col,message",
    [
        ("1 / 0", 3, "division by zero"),
        ("5 // (1 - 1)", 3, "division by zero"),
        ("5 % 0", 3, "division by zero"),
        ("0 ** -1", 3, "division by zero"),
        ("2 ** (1/2)", 3, "exponent must be an integer"),
        ("1 + true", 3, "expected a number, got boolean"),
        ("-false", 1, "expected a number, got boolean"),
        ("true < false", 6, "expected a number, got boolean"),
        ("1 and true", 3, "expected a boolean, got number"),
        ("true and 1", 6, "expected a boolean, got number"),
        ("not 0", 1, "expected a boolean, got number"),
        ("if 1 then 2 else 3", 1, "expected a boolean, got number"),
        ("x + 1", 1, "undefined variable 'x'"),
        ("1 + nope(2)", 5, "undefined function 'nope'"),
        ("abs(true)", 1, "expected a number, got boolean"),
        ("abs(1, 2)", 1, "abs expects 1 argument, got 2"),
        ("min()", 1, "min expects at least 1 argument, got 0"),
        ("round(1, 2, 3)", 1, "round expects 1 or 2 arguments, got 3"),
        ("round(1, 1/2)", 1, "expected an integer"),
    ],
)
def test_runtime_errors(source, col, message):
    with pytest.raises(errors.CalcRuntimeError) as info:
        run(source)
    assert (info.value.message, info.value.line, info.value.col) == (message, 1, col)
    assert str(info.value) == f"1:{col}: {message}"


def test_user_function_arity_error():
    interp = interpreter.Interpreter()
    interp.run("def one(a) = a; def two(a, b) = a")
    with pytest.raises(errors.CalcRuntimeError, match="one expects 1 argument, got 2"):
        interp.run("one(1, 2)")
    with pytest.raises(errors.CalcRuntimeError) as info:
        interp.run("\n  two(1)")
    assert (info.value.line, info.value.col, info.value.message) == (
        2,
        3,
        "two expects 2 arguments, got 1",
    )


def test_cannot_redefine_builtin():
    with pytest.raises(errors.CalcRuntimeError) as info:
        run("1; def abs(x) = x")
    assert (info.value.message, info.value.col) == ("cannot redefine builtin 'abs'", 8)


def test_syntax_error_means_nothing_runs():
    interp = interpreter.Interpreter()
    with pytest.raises(errors.CalcSyntaxError):
        interp.run("let a = 1\nlet b = (")
    assert interp.variables == {}


def test_runtime_error_keeps_earlier_effects():
    interp = interpreter.Interpreter()
    with pytest.raises(errors.CalcRuntimeError):
        interp.run("let a = 1; let b = 1/0; let c = 3")
    assert interp.variables == {"a": 1}


@pytest.mark.parametrize(
    "val,decimals,text",
    [
        (Fraction(3), None, "3"),
        (Fraction(-12), None, "-12"),
        (Fraction(-3, 4), None, "-3/4"),
        (True, None, "true"),
        (False, 2, "false"),
        (Fraction(1, 3), 4, "0.3333"),
        (Fraction(-1, 8), 2, "-0.12"),
        (Fraction(5, 2), 0, "2"),
        (Fraction(7), 2, "7.00"),
        (Fraction(2, 3), 3, "0.667"),
        (Fraction(-1, 1000), 2, "0.00"),
        (Fraction(123456, 100), 1, "1234.6"),
    ],
)
def test_format_value(val, decimals, text):
    assert interpreter.format_value(val, decimals) == text
