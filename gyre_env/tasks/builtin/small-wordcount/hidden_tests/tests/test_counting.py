import pytest
import wordcount.counting as counting
import wordcount.freq as freq


def test_counts_defaults_and_fields():
    c = counting.Counts()
    assert (c.lines, c.words, c.chars, c.bytes, c.max_line_length) == (0, 0, 0, 0, 0)


def test_counts_add():
    a = counting.Counts(lines=1, words=2, chars=3, bytes=4, max_line_length=9)
    b = counting.Counts(lines=10, words=20, chars=30, bytes=40, max_line_length=5)
    assert a + b == counting.Counts(lines=11, words=22, chars=33, bytes=44, max_line_length=9)


@pytest.mark.parametrize(
    "data,expected",
    [
        (b"", (0, 0, 0, 0, 0)),
        (b"one two\nthree\n", (2, 3, 14, 14, 7)),
        (b"no newline", (0, 2, 10, 10, 10)),
        (b"  spaced\t\tout \r\n\x0bx\x0c", (1, 3, 19, 19, 15)),
        ("héllo wörld\n".encode(), (1, 2, 12, 14, 11)),
        (b"bad \xff\xfe bytes\n", (1, 3, 13, 13, 12)),
        (b"\n\n\n", (3, 0, 3, 3, 0)),
    ],
)
def test_count_bytes(data, expected):
    c = counting.count_bytes(data)
    assert (c.lines, c.words, c.chars, c.bytes, c.max_line_length) == expected


def test_words_of():
    assert freq.words_of("Don't STOP 'quoted' 42x ''") == ["don't", "stop", "quoted", "42x"]
    assert freq.words_of("café-au-lait, one.two") == ["caf", "au", "lait", "one", "two"]


def test_top_words_order_and_ties():
    text = "b a b\nc b a d"
    assert freq.top_words(text, 2) == [("b", 3), ("a", 2)]
    assert freq.top_words(text, 10) == [("b", 3), ("a", 2), ("c", 1), ("d", 1)]
    assert freq.top_words(text, 0) == []


def test_top_words_stopwords_lowercased():
    assert freq.top_words("The cat the hat THE end", 2, stopwords=["The"]) == [
        ("cat", 1),
        ("end", 1),
    ]


def test_top_words_bad_n():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            freq.top_words("a", bad)
