import pytest
import textkit


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
    assert textkit.slugify(text) == expected


def test_slugify_custom_sep():
    assert textkit.slugify("  Crème brûlée  ", sep="_") == "creme_brulee"
    assert textkit.slugify("a b c", sep="--") == "a--b--c"


def test_slugify_max_length_strips_trailing_sep():
    assert textkit.slugify("one two three", max_length=8) == "one-two"
    assert textkit.slugify("one two three", max_length=3) == "one"
    assert textkit.slugify("abc", max_length=10) == "abc"


def test_slugify_errors():
    with pytest.raises(TypeError):
        textkit.slugify(42)
    with pytest.raises(ValueError):
        textkit.slugify("x", sep="")
    with pytest.raises(ValueError):
        textkit.slugify("x", max_length=0)


def test_wrap_greedy():
    assert textkit.wrap("the quick brown fox", 10) == "the quick\nbrown fox"
    assert textkit.wrap("a b c d", 3) == "a b\nc d"


def test_wrap_exact_width_fits():
    assert textkit.wrap("abc def", 7) == "abc def"
    assert textkit.wrap("abc def", 6) == "abc\ndef"


def test_wrap_long_words_are_split():
    assert textkit.wrap("abcdefgh ij", 3) == "abc\ndef\ngh\nij"
    assert textkit.wrap("x abcdef", 4) == "x\nabcd\nef"


def test_wrap_collapses_whitespace_and_empty():
    assert textkit.wrap("  one\n\ttwo   three  ", 80) == "one two three"
    assert textkit.wrap("   \n ", 5) == ""


def test_wrap_bad_width():
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError):
            textkit.wrap("abc", bad)
