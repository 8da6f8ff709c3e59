import minikv.globmatch as globmatch
import pytest


@pytest.mark.parametrize(
    "pattern,text,expected",
    [
        ("*", "", True),
        ("*", "anything", True),
        ("user:*", "user:42", True),
        ("user:*", "users:42", False),
        ("h?llo", "hello", True),
        ("h?llo", "hllo", False),
        ("h[ae]llo", "hallo", True),
        ("h[ae]llo", "hillo", False),
        ("h[^e]llo", "hallo", True),
        ("h[^e]llo", "hello", False),
        ("key[0-9]", "key7", True),
        ("key[0-9]", "keyx", False),
        ("a\\*b", "a*b", True),
        ("a\\*b", "axb", False),
        ("[a", "[a", True),
        ("*a*b*c*", "xxaxxbxxc", True),
        ("*a*b*c*", "xxaxxcxxb", False),
        ("ABC", "abc", False),
        ("[\\]]", "]", True),
    ],
)
def test_glob_match(pattern, text, expected):
    assert globmatch.glob_match(pattern, text) is expected
