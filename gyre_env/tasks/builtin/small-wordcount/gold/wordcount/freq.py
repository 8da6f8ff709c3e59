"""Word frequencies."""

import re
from collections import Counter

_WORD = re.compile(r"[a-z0-9']+")


def words_of(text):
    words = (m.strip("'") for m in _WORD.findall(text.lower()))
    return [w for w in words if w]


def top_words(text, n, stopwords=()):
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError("n must be an int >= 0")
    stop = {s.lower() for s in stopwords}
    counts = Counter(w for w in words_of(text) if w not in stop)
    return sorted(counts.items(), key=lambda p: (-p[1], p[0]))[:n]
