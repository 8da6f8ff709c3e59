import csvq.parse as parse
import pytest


@pytest.mark.parametrize(
    "text,rows",
    [
        ("", []),
        ("a,b\n1,2\n", [["a", "b"], ["1", "2"]]),
        ("a,b\r\n1,2", [["a", "b"], ["1", "2"]]),
        ("a\n\nb\n", [["a"], [""], ["b"]]),
        ('"x, y",z\n', [["x, y", "z"]]),
        ('"he said ""hi"""\n', [['he said "hi"']]),
        ('"multi\nline",2\n', [["multi\nline", "2"]]),
        ('a"b, c ,\n', [['a"b', " c ", ""]]),
        ('"",x\n', [["", "x"]]),
        (",\n", [["", ""]]),
    ],
)
def test_parse_csv(text, rows):
    assert parse.parse_csv(text) == rows


def test_parse_other_delimiter():
    assert parse.parse_csv("a;b\n'1';\"2;3\"\n", delimiter=";") == [["a", "b"], ["'1'", "2;3"]]


def test_bad_delimiter():
    for bad in ('"', "\n", ",,", ""):
        with pytest.raises(ValueError):
            parse.parse_csv("a", delimiter=bad)


def test_unterminated_quote_reports_opening_line():
    with pytest.raises(parse.CsvError) as info:
        parse.parse_csv('a,b\n1,"open\nstill open\n')
    assert info.value.line == 2
    assert str(info.value).startswith("line 2: ")


def test_garbage_after_closing_quote():
    with pytest.raises(parse.CsvError) as info:
        parse.parse_csv('a\n"x"y,1\n')
    assert info.value.line == 2


def test_write_csv_quotes_when_needed():
    rows = [["a", "b,c", 'q"q'], ["line\nbreak", "", "x"], [""]]
    assert parse.write_csv(rows) == 'a,"b,c","q""q"\n"line\nbreak",,x\n""\n'


@pytest.mark.parametrize(
    "rows", [[["a", "b"], ["", ""]], [[""], ["x"]], [['"'], ["\r\n", ";"]], [["a;b", "c"]]]
)
def test_round_trip(rows):
    assert parse.parse_csv(parse.write_csv(rows)) == rows
    assert parse.parse_csv(parse.write_csv(rows, ";"), ";") == rows


def test_read_table():
    table = parse.read_table("name,age\nAl,7\nBo,12\n")
    assert isinstance(table, parse.Table)
    assert table.columns == ["name", "age"]
    assert table.rows == [{"name": "Al", "age": "7"}, {"name": "Bo", "age": "12"}]


def test_read_table_errors():
    with pytest.raises(parse.CsvError) as info:
        parse.read_table("")
    assert info.value.line == 1
    with pytest.raises(parse.CsvError) as info:
        parse.read_table("a,a\n1,2\n")
    assert info.value.line == 1


def test_read_table_wrong_field_count_line():
    with pytest.raises(parse.CsvError) as info:
        parse.read_table('a,b\n"1\n1",2\n3\n')
    assert info.value.line == 4
    assert "expected 2 fields, got 1" in str(info.value)
