import pytest
from textkit import slugify, wrap


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Hello, World!", "hello-world"),
        ("Café au lait", "cafe-au-lait"),
        ("  --Already--slugged--  ", "already-slugged"),
        ("日本 Tokyo 2024", "tokyo-2024"),
        ("!!!", ""),
    ],
)
def test_slugify_examples(text, expected):
    assert slugify(text) == expected


def test_slugify_custom_sep():
    assert slugify("  Crème brûlée  ", sep="_") == "creme_brulee"
    assert slugify("a b c", sep="--") == "a--b--c"


def test_slugify_max_length_strips_trailing_sep():
    assert slugify("one two three", max_length=8) == "one-two"
    assert slugify("one two three", max_length=3) == "one"
    assert slugify("abc", max_length=10) == "abc"


def test_slugify_errors():
    with pytest.raises(TypeError):
        slugify(42)
    with pytest.raises(ValueError):
        slugify("x", sep="")
    with pytest.raises(ValueError):
        slugify("x", max_length=0)


def test_wrap_greedy():
    assert wrap("the quick brown fox", 10) == "the quick\nbrown fox"
    assert wrap("a b c d", 3) == "a b\nc d"


def test_wrap_exact_width_fits():
    assert wrap("abc def", 7) == "abc def"
    assert wrap("abc def", 6) == "abc\ndef"


def test_wrap_long_words_are_split():
    assert wrap("abcdefgh ij", 3) == "abc\ndef\ngh\nij"
    assert wrap("x abcdef", 4) == "x\nabcd\nef"


def test_wrap_collapses_whitespace_and_empty():
    assert wrap("  one\n\ttwo   three  ", 80) == "one two three"
    assert wrap("   \n ", 5) == ""


def test_wrap_bad_width():
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError):
            wrap("abc", bad)
