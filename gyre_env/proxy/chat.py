"""The API-independent chat request, its errors, and field checks shared by both APIs.

Requests are checked by hand, field by field, so that a wrong type is a 400 that names the
field (``messages[2].content: expected a string or a list of blocks, got int``) in the
API's own error shape, and so that a 128k-token body costs one JSON parse, not a model
validation pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


class RequestError(ValueError):
    """A bad request: becomes an HTTP error in the API's own shape."""

    def __init__(
        self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


@dataclass(kw_only=True)
class ChatRequest:
    """A chat call in internal form (see :mod:`gyre_env.proxy.render` for messages)."""

    api: str
    """``openai``, ``anthropic`` or ``responses``: decides the response shape."""
    model: str
    messages: list[dict]
    tools: list[dict] | None = None
    """OpenAI function-tool schemas (Anthropic tools are converted)."""
    parse_tools: bool = True
    """False when tool_choice is none: tools are not offered and output is plain text."""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    """SGLang's and vLLM's ``min_p`` extension (not in OpenAI's or Anthropic's API)."""
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    """OpenAI ``stream_options.include_usage``: a last chunk carries usage."""


def type_name(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def expect(value: object, kinds: tuple, where: str, what: str) -> None:
    """Raise RequestError unless ``value`` is one of ``kinds`` (bool is not a number)."""
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        raise RequestError(f"{where}: expected {what}, got {type_name(value)}", param=where)


def opt_number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    expect(value, (int, float), key, "a number")
    if not lo <= value <= hi:
        raise RequestError(f"{key}: must be between {lo:g} and {hi:g}, got {value}", param=key)
    return float(value)


def opt_int(body: dict, key: str, lo: int = 0) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    expect(value, (int,), key, "an integer")
    if value < lo:
        raise RequestError(f"{key}: must be at least {lo}, got {value}", param=key)
    return value


def opt_bool(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    expect(value, (bool,), key, "a boolean")
    return value


def opt_object(body: dict, key: str) -> dict | None:
    value = body.get(key)
    if value is not None:
        expect(value, (dict,), key, "an object")
    return value


def stop_list(value: object, key: str, *, allow_string: bool = True) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) and allow_string:
        return [value]
    expect(
        value,
        (list,),
        key,
        "a string or an array of strings" if allow_string else "an array of strings",
    )
    for k, item in enumerate(value):
        expect(item, (str,), f"{key}[{k}]", "a string")
    return list(value)


def text_of_parts(parts: object, where: str, allowed: tuple[str, ...] = ("text",)) -> str:
    """Join a string or a list of ``{"type": "text", "text": ...}`` parts into one string."""
    if isinstance(parts, str):
        return parts
    expect(parts, (list,), where, "a string or an array of content parts")
    out = []
    for k, part in enumerate(parts):
        expect(part, (dict,), f"{where}[{k}]", "an object")
        kind = part.get("type")
        if kind not in allowed:
            raise RequestError(
                f"{where}[{k}].type: unsupported content type {kind!r}", param=f"{where}[{k}].type"
            )
        text = part.get("text")
        expect(text, (str,), f"{where}[{k}].text", "a string")
        out.append(text)
    return "\n".join(out)


try:  # orjson serializes several times faster; the stdlib is the fallback
    from orjson import dumps as json_bytes
except ImportError:  # pragma: no cover - depends on the environment
    import json

    def json_bytes(obj) -> bytes:
        """Compact UTF-8 JSON of ``obj``."""
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


Converter = Callable[[object, int], list[dict]]
"""Converts raw message ``k`` of a request into internal messages (raises RequestError)."""


class ConversionMemo:
    """One session's last requests (``keep`` conversations): raw messages and what they
    converted to.

    An agent's next call repeats all earlier messages and adds a few. When a request's raw
    messages start with exactly the stored ones, their converted messages are reused (the
    same objects, which also lets :class:`~gyre_env.proxy.sessions.Session` reuse their
    keys by identity) and only the new ones are converted, so parsing costs one C-level
    comparison of the old messages rather than Python work per message. Two conversations
    are kept so that a side call (a sub-agent, a title request) does not evict the main one.

    Exactness: ``==`` on JSON values is exact for strings, null, lists and objects (key
    order aside, which message keys ignore too) but loose for numbers and booleans
    (``1 == 1.0 == True``). Stored messages holding any number or boolean are therefore
    also compared as serialized bytes, so an edited message is never taken as repeated.
    """

    __slots__ = ("entries", "keep")

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.entries: list[tuple[list, list[dict], list[int], list[int]]] = []
        """Most recent first: (raw messages, converted messages, ``ends``, ``loose``);
        ``ends[j]`` is how many converted messages ``raw[: j + 1]`` gave, ``loose`` the
        indices of raw messages holding numbers or booleans."""

    def convert(self, raw: list, one: Converter) -> list[dict]:
        """The converted messages of ``raw`` (a new list), remembering them for next time."""
        n, out, ends, loose, old_raw = 0, [], [], [], []
        for entry in self.entries:
            n = _repeated(entry, raw)
            if n:
                self.entries.remove(entry)
                old_raw, old_out, old_ends, old_loose = entry
                out, ends, loose = old_out[: old_ends[n - 1]], old_ends[:n], list(old_loose)
                break
        for k in range(n, len(raw)):
            out += one(raw[k], k)
            ends.append(len(out))
            if _has_scalars(raw[k]):
                loose.append(k)
        self.entries.insert(0, (old_raw + raw[n:] if n else raw, list(out), ends, loose))
        del self.entries[self.keep :]
        return out


def _repeated(entry: tuple, raw: list) -> int:
    """How many leading raw messages are the entry's (all of them, or 0)."""
    stored, _, _, loose = entry
    n = len(stored)
    if not n or len(raw) < n or raw[:n] != stored:
        return 0
    for j in loose:
        if raw[j] is not stored[j] and json_bytes(raw[j]) != json_bytes(stored[j]):
            return 0
    return n


def convert_messages(raw: list, one: Converter, memo: ConversionMemo | None) -> list[dict]:
    """``one`` applied to every raw message in order (through ``memo`` when given)."""
    if memo is not None:
        return memo.convert(raw, one)
    out: list[dict] = []
    for k, m in enumerate(raw):
        out += one(m, k)
    return out


def _has_scalars(value: object) -> bool:
    """Whether a JSON value holds a number or boolean anywhere."""
    kind = type(value)
    if kind is str or value is None:
        return False
    if kind is dict:
        return any(_has_scalars(v) for v in value.values())
    if kind is list:
        return any(_has_scalars(v) for v in value)
    return True
