import calc.errors as errors
import calc.lexer as lexer
import pytest


def kinds_texts(source):
    return [(t.kind, t.text) for t in lexer.tokenize(source)]


def test_simple_expression():
    assert kinds_texts("1 + x") == [("NUMBER", "1"), ("OP", "+"), ("NAME", "x"), ("EOF", "")]


@pytest.mark.parametrize("text", ["42", "1.5", "2.5e-3", "7E2", "0.0", "3e+4"])
def test_numbers(text):
    assert kinds_texts(text)[0] == ("NUMBER", text)


def test_incomplete_exponent_starts_a_name():
    assert kinds_texts("2e")[:2] == [("NUMBER", "2"), ("NAME", "e")]
    assert kinds_texts("2e+")[:3] == [("NUMBER", "2"), ("NAME", "e"), ("OP", "+")]


def test_longest_operator_match():
    ops = [t.text for t in lexer.tokenize("** // == != <= >= * / = < > % ; ,")][:-1]
    assert ops == ["**", "//", "==", "!=", "<=", ">=", "*", "/", "=", "<", ">", "%", ";", ","]


def test_keywords_vs_names():
    toks = kinds_texts("let lettuce if_ not true false_")
    assert toks[:6] == [
        ("KEYWORD", "let"),
        ("NAME", "lettuce"),
        ("NAME", "if_"),
        ("KEYWORD", "not"),
        ("KEYWORD", "true"),
        ("NAME", "false_"),
    ]


def test_positions_newlines_and_comments():
    toks = lexer.tokenize("a = 1 # note\n  bb\r\n")
    assert [(t.kind, t.line, t.col) for t in toks] == [
        ("NAME", 1, 1),
        ("OP", 1, 3),
        ("NUMBER", 1, 5),
        ("NEWLINE", 1, 13),
        ("NAME", 2, 3),
        ("NEWLINE", 2, 6),
        ("EOF", 3, 1),
    ]


def test_eof_position():
    assert (lexer.tokenize("")[0].line, lexer.tokenize("")[0].col) == (1, 1)
    eof = lexer.tokenize("ab\ncde")[-1]
    assert (eof.kind, eof.line, eof.col) == ("EOF", 2, 4)


def test_unexpected_character():
    with pytest.raises(errors.CalcSyntaxError) as info:
        lexer.tokenize("1 +\n  $x")
    err = info.value
    assert (err.message, err.line, err.col) == ("unexpected character '$'", 2, 3)
    assert str(err) == "2:3: unexpected character '$'"
    assert isinstance(err, errors.CalcError)


def test_lone_dot_is_not_part_of_number():
    with pytest.raises(errors.CalcSyntaxError, match="unexpected character '.'"):
        lexer.tokenize("1.")
