import pytest
import roman


@pytest.mark.parametrize("n,text", [(1, "I"), (4, "IV"), (1994, "MCMXCIV"), (3999, "MMMCMXCIX")])
def test_to_roman(n, text):
    assert roman.to_roman(n) == text


def test_to_roman_errors():
    for bad in (0, 4000, -5):
        with pytest.raises(ValueError):
            roman.to_roman(bad)
    for bad in (2.0, "3", True):
        with pytest.raises(TypeError):
            roman.to_roman(bad)


def test_from_roman_accepts_and_strips():
    assert roman.from_roman("  XLII\n") == 42
    assert roman.from_roman("CDXLIV") == 444


def test_from_roman_rejects_non_canonical():
    for bad in ("", "IIII", "VV", "IC", "IIX", "XM", "MMMM", "xiv", "X1", "IL"):
        with pytest.raises(ValueError):
            roman.from_roman(bad)
    with pytest.raises(TypeError):
        roman.from_roman(10)


def test_round_trip_every_number():
    assert all(roman.from_roman(roman.to_roman(n)) == n for n in range(1, 4000))


def test_roman_range():
    assert roman.roman_range("VIII", "XI") == ["VIII", "IX", "X", "XI"]
    assert roman.roman_range("X", "IX") == []
    with pytest.raises(ValueError):
        roman.roman_range("IIII", "X")


def test_roman_range_single():
    assert roman.roman_range("MM", "MM") == ["MM"]
