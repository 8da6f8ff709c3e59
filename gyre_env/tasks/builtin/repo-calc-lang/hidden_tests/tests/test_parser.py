import calc.errors as errors
import calc.parser as parser
import pytest


def tree(source):
    return [parser.dump(s) for s in parser.parse(source)]


@pytest.mark.parametrize(
    "source,expected",
    [
        ("1 + 2 * 3", "(+ 1 (* 2 3))"),
        ("(1 + 2) * 3", "(* (+ 1 2) 3)"),
        ("1 - 2 - 3", "(- (- 1 2) 3)"),
        ("8 / 4 / 2", "(/ (/ 8 4) 2)"),
        ("7 // 2 % 3", "(% (// 7 2) 3)"),
        ("2 ** 3 ** 2", "(** 2 (** 3 2))"),
        ("-2 ** 2", "(neg (** 2 2))"),
        ("2 ** -1", "(** 2 (neg 1))"),
        ("- - +x", "(neg (neg (pos x)))"),
        ("-a * b", "(* (neg a) b)"),
        ("1.5", "3/2"),
        ("2.50", "5/2"),
        ("1e3", "1000"),
        ("2.5e-3", "1/400"),
        ("a < b + 1", "(< a (+ b 1))"),
        ("a != b", "(!= a b)"),
        ("not a == b", "(not (== a b))"),
        ("not not x", "(not (not x))"),
        ("a or b and c", "(or a (and b c))"),
        ("a and b or c and d", "(or (and a b) (and c d))"),
        ("not a and b", "(and (not a) b)"),
        ("if a then 1 else 2 + 3", "(if a 1 (+ 2 3))"),
        ("1 + (if c then 2 else 3)", "(+ 1 (if c 2 3))"),
        ("if a then if b then 1 else 2 else 3", "(if a (if b 1 2) 3)"),
        ("f()", "(call f)"),
        ("max(1, 2 * x, g(y))", "(call max 1 (* 2 x) (call g y))"),
        ("true or false", "(or true false)"),
    ],
)
def test_expressions(source, expected):
    assert tree(source) == [expected]


def test_statements_and_separators():
    source = "let x = 1 + 2\n\n;; def f(a, b) = a * b; def k() = 7\nf(x, 2)\n"
    assert tree(source) == [
        "(let x (+ 1 2))",
        "(def f (a b) (* a b))",
        "(def k () 7)",
        "(call f x 2)",
    ]


def test_empty_program():
    assert tree("\n; # only a comment\n") == []


@pytest.mark.parametrize(
    "source,line,col,message",
    [
        ("1 +", 1, 4, "unexpected end of input"),
        ("let 5 = 1", 1, 5, "unexpected '5'"),
        ("(1 + 2\n3", 1, 7, "unexpected end of line"),
        ("1 2", 1, 3, "unexpected '2'"),
        ("a < b < c", 1, 7, "unexpected '<'"),
        ("if a then 1", 1, 12, "unexpected end of input"),
        ("def f(x, x) = 1", 1, 10, "duplicate parameter 'x'"),
        ("def f(x,) = 1", 1, 9, "unexpected ')'"),
        ("f(1,, 2)", 1, 5, "unexpected ','"),
        ("x = 1", 1, 3, "unexpected '='"),
        ("let = 3", 1, 5, "unexpected '='"),
        ("1 +\n2", 1, 4, "unexpected end of line"),
        ("then", 1, 1, "unexpected 'then'"),
    ],
)
def test_syntax_errors(source, line, col, message):
    with pytest.raises(errors.CalcSyntaxError) as info:
        parser.parse(source)
    assert (info.value.line, info.value.col, info.value.message) == (line, col, message)
