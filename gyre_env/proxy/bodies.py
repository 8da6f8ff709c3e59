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
    """One session's last large request bodies (see the module docstring). Two are kept so
    that a side call (a sub-agent, a title request) does not evict the main conversation;
    bodies under :data:`MIN_BYTES` are parsed whole and evict nothing."""

    __slots__ = ("entries", "keep")

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.entries: list[tuple[bytes, int, dict, list]] = []
        """Most recent first: (body, cut, head, messages). ``cut``: bytes of ``body`` up
        to and including its last message; ``head``: its top-level members before
        ``messages``; ``messages``: its parsed messages."""

    def loads(self, raw: bytes) -> object:
        """``raw`` parsed as JSON (raises ValueError like ``orjson.loads``)."""
        for entry in self.entries:
            stored, cut = entry[0], entry[1]
            if len(raw) > cut and raw.startswith(memoryview(stored)[:cut]):
                body = self._extend(entry, raw)
                if body is not None:
                    return body
        body = _loads(raw)
        entry = _locate(raw, body)
        if entry is not None:
            self._keep(entry)
        return body

    def _extend(self, entry: tuple, raw: bytes) -> dict | None:
        """The body from an entry's prefix and a parse of the rest, or None."""
        _, cut, head, messages = entry
        try:
            tail = raw[cut:].decode()
            ends, close = _elements(tail, 0)
            new = _loads("[" + tail[tail.index(",") + 1 : ends[-1]] + "]") if ends else []
            after = _members(tail, close + 1)
        except ValueError:  # includes UnicodeDecodeError and orjson's JSONDecodeError
            return None
        if len(new) != len(ends) or "messages" in after:
            return None
        if new:
            messages = messages + new
            cut += len(tail[: ends[-1]].encode())
        self.entries.remove(entry)
        self._keep((raw, cut, head, messages))
        return {**head, "messages": messages, **after}

    def _keep(self, entry: tuple) -> None:
        self.entries.insert(0, entry)
        del self.entries[self.keep :]


def _locate(raw: bytes, body: object) -> tuple | None:
    """An entry for a large body parsed whole (None if it has no messages to extend)."""
    if len(raw) < MIN_BYTES or not isinstance(body, dict):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    try:
        text = raw.decode()
        keys, end = _messages_end(text)
    except ValueError:
        return None
    if end is None or len(set(keys)) != len(keys):  # duplicate members: parse whole
        return None
    head = {k: body[k] for k in keys[: keys.index("messages")]}
    cut = end if text.isascii() else len(text[:end].encode())
    return raw, cut, head, messages


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
