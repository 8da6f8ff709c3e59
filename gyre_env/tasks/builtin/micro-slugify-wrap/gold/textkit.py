"""URL slugs and greedy word wrapping."""

import re
import unicodedata


def slugify(text, sep="-", max_length=None):
    if not isinstance(text, str):
        raise TypeError("text must be a str")
    if not isinstance(sep, str) or not sep:
        raise ValueError("sep must be a non-empty str")
    if max_length is not None and (
        not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1
    ):
        raise ValueError("max_length must be an int >= 1")
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", sep, ascii_text.lower())
    slug = _strip(slug, sep)
    if max_length is not None and len(slug) > max_length:
        slug = slug[:max_length]
        while slug and slug[-1] in sep:
            slug = slug[:-1]
    return slug


def _strip(s, sep):
    while s.startswith(sep):
        s = s[len(sep) :]
    while s.endswith(sep):
        s = s[: -len(sep)]
    return s


def wrap(text, width):
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError("width must be an int >= 1")
    pieces = []
    for word in text.split():
        pieces.extend(word[i : i + width] for i in range(0, len(word), width))
    lines = []
    for piece in pieces:
        if lines and len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    return "\n".join(lines)
