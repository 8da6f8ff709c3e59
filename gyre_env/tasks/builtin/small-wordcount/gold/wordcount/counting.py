"""Line, word, character and byte counts."""

from dataclasses import dataclass


@dataclass
class Counts:
    lines: int = 0
    words: int = 0
    chars: int = 0
    bytes: int = 0
    max_line_length: int = 0

    def __add__(self, other):
        return Counts(
            lines=self.lines + other.lines,
            words=self.words + other.words,
            chars=self.chars + other.chars,
            bytes=self.bytes + other.bytes,
            max_line_length=max(self.max_line_length, other.max_line_length),
        )


def count_bytes(data):
    text = data.decode("utf-8", errors="replace")
    return Counts(
        lines=data.count(b"\n"),
        words=len(data.split()),
        chars=len(text),
        bytes=len(data),
        max_line_length=max((len(line) for line in text.split("\n")), default=0),
    )
