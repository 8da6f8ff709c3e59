import iniparse
import pytest

EXAMPLE = """
; a comment
[server]
Host = example.org
port=8080
motd = "  hi  "
"""


def test_example():
    assert iniparse.parse_ini(EXAMPLE) == {
        "server": {"host": "example.org", "port": "8080", "motd": "  hi  "}
    }


def test_comments_blank_and_crlf():
    text = "# top\r\n[a]\r\n\r\n  ; indented comment\r\nx = 1\r\n"
    assert iniparse.parse_ini(text) == {"a": {"x": "1"}}


def test_value_keeps_semicolon_and_first_equals_splits():
    assert iniparse.parse_ini("[s]\nurl = a=b ; c\n") == {"s": {"url": "a=b ; c"}}


def test_reopened_section_and_empty_section():
    text = "[a]\nx=1\n[empty]\n[a]\ny=2\n"
    result = iniparse.parse_ini(text)
    assert result == {"a": {"x": "1", "y": "2"}, "empty": {}}
    assert list(result) == ["a", "empty"]


def test_section_names_case_sensitive_keys_lowercased():
    assert iniparse.parse_ini("[A]\nK=1\n[a]\nk=2\n") == {"A": {"k": "1"}, "a": {"k": "2"}}


def test_quotes_only_when_both_ends():
    assert iniparse.parse_ini('[s]\na = "x\nb = ""\nc = "\n') == {
        "s": {"a": '"x', "b": "", "c": '"'}
    }


@pytest.mark.parametrize(
    "text,lineno",
    [
        ("x = 1\n", 1),
        ("[s]\n\n[]\n", 3),
        ("[s]\nk=1\nK = 2\n", 3),
        ("[s]\njust words\n", 2),
        ("[s]\n = value\n", 2),
        ("[broken\n", 1),
    ],
)
def test_errors_carry_line_numbers(text, lineno):
    with pytest.raises(iniparse.IniError) as info:
        iniparse.parse_ini(text)
    assert info.value.lineno == lineno
    assert f"line {lineno}" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_dump_and_round_trip():
    data = {"b": {"k": "v", "pad": " x ", "empty": ""}, "a": {}}
    text = iniparse.dump_ini(data)
    assert text == '[b]\nk = v\npad = " x "\nempty = ""\n\n[a]\n'
    assert iniparse.parse_ini(text) == data
