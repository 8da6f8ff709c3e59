import csvq.parse as parse
import csvq.query as query
import pytest

PEOPLE = parse.read_table("name,age,city\nAl,7,Oslo\nBo,12,Rome\nCy,100,Oslo\nDi,12,Lima\n")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("age>=30", ("age", ">=", "30")),
        (" city = Oslo ", ("city", "=", "Oslo")),
        ("name!=Al", ("name", "!=", "Al")),
        ("name~o", ("name", "~", "o")),
        ("a<b<c", ("a", "<", "b<c")),
    ],
)
def test_parse_condition(text, expected):
    c = query.parse_condition(text)
    assert (c.column, c.op, c.value) == expected


def test_parse_condition_errors():
    for bad in ("age", "=5", "  >3"):
        with pytest.raises(query.QueryError):
            query.parse_condition(bad)


def test_numeric_vs_string_comparison():
    assert query.parse_condition("age>9").matches({"age": "12"})
    assert not query.parse_condition("name>9").matches({"name": "12x"})  # "12x" < "9" as text
    assert query.parse_condition("v<b").matches({"v": "a"})
    assert query.parse_condition("v=1.0").matches({"v": "1"})
    assert not query.parse_condition("v=1.0").matches({"v": "1x"})


def test_contains_is_case_sensitive():
    assert query.parse_condition("city~sl").matches({"city": "Oslo"})
    assert not query.parse_condition("city~OS").matches({"city": "Oslo"})


def test_matches_unknown_column():
    with pytest.raises(query.QueryError):
        query.parse_condition("zip=1").matches({"a": "1"})


def test_where_all_conditions():
    cols, rows = query.run_query(PEOPLE, ["city=Oslo", "age>10"])
    assert cols == ["name", "age", "city"]
    assert [r["name"] for r in rows] == ["Cy"]


def test_sort_numeric_stable_and_desc():
    _, rows = query.run_query(PEOPLE, sort="age")
    assert [r["name"] for r in rows] == ["Al", "Bo", "Di", "Cy"]
    _, rows = query.run_query(PEOPLE, sort="age", descending=True)
    assert [r["name"] for r in rows] == ["Cy", "Bo", "Di", "Al"]


def test_sort_strings_when_not_all_numeric():
    table = parse.read_table("v\n10\n9\nx\n")
    _, rows = query.run_query(table, sort="v")
    assert [r["v"] for r in rows] == ["10", "9", "x"]


def test_select_and_limit():
    cols, rows = query.run_query(PEOPLE, select=["city", "name"], limit=2)
    assert cols == ["city", "name"]
    assert rows == [{"city": "Oslo", "name": "Al"}, {"city": "Rome", "name": "Bo"}]
    assert query.run_query(PEOPLE, limit=0)[1] == []


def test_unknown_columns_raise():
    for kwargs in ({"select": ["nope"]}, {"sort": "nope"}, {"where": ["nope=1"]}):
        with pytest.raises(query.QueryError, match="nope"):
            query.run_query(PEOPLE, **kwargs)


def test_format_table():
    text = query.format_table(["name", "age"], [{"name": "Al", "age": "7"}])
    assert text == "name | age\n-----+----\nAl   | 7\n"


def test_format_table_wide_values_and_trailing_spaces():
    text = query.format_table(["a", "b"], [{"a": "long value", "b": ""}])
    assert text == "a          | b\n-----------+--\nlong value |\n"
