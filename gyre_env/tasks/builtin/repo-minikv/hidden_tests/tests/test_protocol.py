import minikv.protocol as protocol
import pytest


@pytest.mark.parametrize(
    "line,args",
    [
        ("", []),
        ("   \t ", []),
        ("SET k v", ["SET", "k", "v"]),
        ("  get\t\tkey  ", ["get", "key"]),
        ('SET k "hello world"', ["SET", "k", "hello world"]),
        (r'SET k "a\"b\\c\n\t\r"', ["SET", "k", 'a"b\\c\n\t\r']),
        (r'ECHO "\x41\x7a\q"', ["ECHO", "Az" + "q"]),
        (r'ECHO "\xZZ"', ["ECHO", "xZZ"]),
        (r"ECHO 'it\'s \n literal'", ["ECHO", "it's \\n literal"]),
        ('ECHO ab"c', ["ECHO", 'ab"c']),
        ('SET "" x', ["SET", "", "x"]),
        ("ECHO 'a b' \"c d\"", ["ECHO", "a b", "c d"]),
    ],
)
def test_tokenize(line, args):
    assert protocol.tokenize(line) == args


@pytest.mark.parametrize("line", ['SET k "open', "ECHO 'open", r'ECHO "ends with \"'])
def test_tokenize_unbalanced(line):
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.tokenize(line)
    assert str(info.value) == "ERR unbalanced quotes"
    assert isinstance(info.value, protocol.CommandError)


def test_tokenize_text_after_closing_quote():
    with pytest.raises(protocol.ProtocolError, match="^ERR syntax error in quoted argument$"):
        protocol.tokenize('SET "a"b c')


def test_status_is_str():
    assert isinstance(protocol.Status("OK"), str) and protocol.Status("OK") == "OK"


@pytest.mark.parametrize(
    "reply,text",
    [
        (protocol.Status("OK"), "OK"),
        (protocol.CommandError("ERR boom"), "(error) ERR boom"),
        (42, "(integer) 42"),
        (-1, "(integer) -1"),
        (None, "(nil)"),
        ("plain", '"plain"'),
        ('q"b\\n\n\t\r\x01\x7f', r'"q\"b\\n\n\t\r\x01\x7f"'),
        ("héllo", '"héllo"'),
        ([], "(empty array)"),
    ],
)
def test_format_scalars(reply, text):
    assert protocol.format_reply(reply) == text


def test_format_nested_array():
    text = protocol.format_reply(["a", 1, None, [protocol.Status("OK"), "b"]])
    assert text == '1) "a"\n2) (integer) 1\n3) (nil)\n4) 1) OK\n   2) "b"'


def test_format_index_width():
    lines = protocol.format_reply([str(i) for i in range(10)]).split("\n")
    assert lines[0] == ' 1) "0"'
    assert lines[9] == '10) "9"'


def test_format_wide_nested_indent():
    reply = [protocol.Status("x")] * 9 + [["a", "b"]]
    assert protocol.format_reply(reply).split("\n")[-2:] == ['10) 1) "a"', '    2) "b"']
