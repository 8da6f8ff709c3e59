"""Parsing a session's request bodies incrementally: the repeated messages are not parsed again.

An agent's next call sends its whole conversation again plus a few new messages; at 128k
tokens the body is ~0.5 MB and parsing it costs more than everything else the proxy does
for the call. :class:`BodyMemo` keeps the session's last large body and the byte offset
right after its last message. When a new body starts with exactly those bytes (one
``memcmp``), the top-level members before ``messages`` and the earlier messages are the
previous parse's objects, and only the rest of the body is parsed.

Exactness: JSON is parsed left to right and a value's meaning does not depend on what
follows it, so identical leading bytes that end right after an array element parse to
identical members and elements. The rest (new elements, then the members after the array)
is checked and parsed by the same parser (orjson); anything unusual (a duplicate
``messages`` member, a trailing comma, invalid UTF-8, bad JSON) falls back to parsing the
whole body, which also produces the error message.
"""

from __future__ import annotations

import json
import re

try:
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
MIN_BYTES = 64 * 1024
"""Smaller bodies are parsed whole: they are cheap, and locating their messages is not."""


class BodyMemo:
    """One session's last large request body (see the module docstring)."""

    __slots__ = ("body", "cut", "head", "messages")

    def __init__(self) -> None:
        self.body = b""
        self.cut = 0
        """Bytes of ``body`` up to and including its last message (0: nothing to reuse)."""
        self.head: dict = {}
        """The top-level members before ``messages``."""
        self.messages: list = []

    def loads(self, raw: bytes) -> object:
        """``raw`` parsed as JSON (raises ValueError like ``orjson.loads``)."""
        if self.cut and len(raw) > self.cut and raw.startswith(memoryview(self.body)[: self.cut]):
            body = self._extend(raw)
            if body is not None:
                return body
        body = _loads(raw)
        self._remember(raw, body)
        return body

    def _extend(self, raw: bytes) -> dict | None:
        """The body from the remembered prefix and a parse of the rest, or None."""
        try:
            tail = raw[self.cut :].decode()
            ends, close = _elements(tail, 0)
            new = _loads("[" + tail[tail.index(",") + 1 : ends[-1]] + "]") if ends else []
            after = _members(tail, close + 1)
        except ValueError:  # includes UnicodeDecodeError and orjson's JSONDecodeError
            return None
        if len(new) != len(ends) or "messages" in after:
            return None
        messages = self.messages + new
        body = {**self.head, "messages": messages, **after}
        if ends:
            self._keep(raw, self.cut + len(tail[: ends[-1]].encode()), self.head, messages)
        else:
            self.body = raw
        return body

    def _remember(self, raw: bytes, body: object) -> None:
        """Locate the messages of a body parsed whole, to extend it next time."""
        self.cut = 0
        if len(raw) < MIN_BYTES or not isinstance(body, dict):
            return
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return
        try:
            text = raw.decode()
            keys, end = _messages_end(text)
        except ValueError:
            return
        if end is None or len(set(keys)) != len(keys):  # duplicate members: parse whole
            return
        head = {k: body[k] for k in keys[: keys.index("messages")]}
        cut = end if text.isascii() else len(text[:end].encode())
        self._keep(raw, cut, head, messages)

    def _keep(self, raw: bytes, cut: int, head: dict, messages: list) -> None:
        self.body, self.cut, self.head, self.messages = raw, cut, head, messages


def _ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()


def _elements(text: str, i: int) -> tuple[list[int], int]:
    """Ends of the array elements that follow ``i`` (each after a comma) and the index of
    the closing ``]``; ValueError if the text is not that."""
    ends = []
    i = _ws(text, i)
    while text[i : i + 1] == ",":
        _, i = _DECODER.raw_decode(text, _ws(text, i + 1))
        ends.append(i)
        i = _ws(text, i)
    if text[i : i + 1] != "]":
        raise ValueError("expected the end of the messages array")
    return ends, i


def _members(text: str, i: int) -> dict:
    """The object members after the messages array (``, "k": v ... }``)."""
    i = _ws(text, i)
    if text[i : i + 1] == "}":
        rest = "{" + text[i:]
    elif text[i : i + 1] == ",":
        rest = "{" + text[i + 1 :]
    else:
        raise ValueError("expected the rest of the request object")
    after = _loads(rest)
    if not isinstance(after, dict):
        raise ValueError("expected an object")
    return after


def _messages_end(text: str) -> tuple[list[str], int | None]:
    """The top-level keys of a JSON object in order, and the index right after the last
    element of its ``messages`` array (None if it has none or is empty)."""
    i = _ws(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("not an object")
    keys: list[str] = []
    end = None
    i = _ws(text, i + 1)
    while text[i : i + 1] == '"':
        key, i = _DECODER.raw_decode(text, i)
        keys.append(key)
        i = _ws(text, i)
        if text[i : i + 1] != ":":
            raise ValueError("expected ':'")
        i = _ws(text, i + 1)
        if key == "messages" and text[i : i + 1] == "[":
            i, end = _array_end(text, i)
        else:
            _, i = _DECODER.raw_decode(text, i)
        i = _ws(text, i)
        if text[i : i + 1] != ",":
            break
        i = _ws(text, i + 1)
    return keys, end


def _array_end(text: str, i: int) -> tuple[int, int | None]:
    """For the array starting at ``i``: the index after it and right after its last element."""
    j = _ws(text, i + 1)
    if text[j : j + 1] == "]":
        return j + 1, None
    _, j = _DECODER.raw_decode(text, j)
    ends, close = _elements(text, j)
    return close + 1, (ends[-1] if ends else j)
