"""Chat rendering, incremental detokenization and tool-call parsing.

The proxy owns tokenization: messages and tools become token ids through the model's own
chat template (``apply_chat_template`` with tools), and generated ids become text, OpenAI
``tool_calls`` and Anthropic ``tool_use`` blocks here. Messages are in one internal form
(OpenAI-like dicts: ``role`` system/user/assistant/tool, ``content`` a string,
``tool_calls`` with ``arguments`` as a dict, ``tool_call_id``); both APIs convert into it.

Prefix reuse needs only the *new* messages rendered: :meth:`ChatRenderer.render_delta`
renders them after a constant-size probe (leading system message, a placeholder user turn
and the assistant reply they follow) and keeps the difference, so its cost does not grow
with the conversation.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

_SENTINEL = "\u2063GYRE-SENTINEL\u2063"
_PROBE_USER = {"role": "user", "content": "."}


class TemplateError(ValueError):
    """The chat template could not render the messages (e.g. a role it does not know)."""


@dataclass(kw_only=True)
class ToolCall:
    """One parsed tool call; ``arguments`` is the decoded JSON object."""

    name: str
    arguments: dict
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])


class ChatRenderer:
    """Renders internal messages to text/ids with a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer, *, stop_token_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        if stop_token_ids is None:
            stop_token_ids = sorted(
                {
                    i
                    for i in (tokenizer.eos_token_id, _token_id(tokenizer, "<|im_end|>"))
                    if i is not None
                }
            )
        self.stop_token_ids = list(stop_token_ids)
        self._stop_set = frozenset(self.stop_token_ids)
        self._closing: str | None = None
        self._template_vars: dict = {}
        self._template = self._compile_direct()
        self._pieces = _PieceCache.for_tokenizer(tokenizer, self._encode_raw)

    # -- text <-> ids ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens parsed and nothing added (no BOS)."""
        if self._pieces is not None:
            return self._pieces.encode(text)
        return self._encode_raw(text)

    def _encode_raw(self, text: str) -> list[int]:
        if self._backend is not None:
            if len(text) > 8192:  # encode_batch releases the GIL: the event loop keeps running
                return self._backend.encode_batch([text], add_special_tokens=False)[0].ids
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` including special tokens (no cleanup of spaces)."""
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def is_stop(self, token_id: int) -> bool:
        return token_id in self._stop_set

    # -- rendering --------------------------------------------------------------------------
    def render(
        self, messages: list[dict], tools: list[dict] | None, *, generation_prompt: bool = True
    ) -> str:
        """The full prompt text of a conversation."""
        try:
            if self._template is not None:
                return self._template.render(
                    messages=messages,
                    tools=tools or None,
                    documents=None,
                    add_generation_prompt=generation_prompt,
                    **self._template_vars,
                )
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                tokenize=False,
                add_generation_prompt=generation_prompt,
            )
        except Exception as e:  # jinja raises many types; all mean "cannot render this"
            raise TemplateError(f"the chat template cannot render these messages: {e}") from e

    def _compile_direct(self):
        """The tokenizer's template compiled once and rendered directly: ``apply_chat_template``
        deep-copies every message first, which costs more than the render. Used only if it
        renders a probe conversation exactly as ``apply_chat_template`` does."""
        template = getattr(self.tokenizer, "chat_template", None)
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            if not isinstance(template, str):
                return None
            compiled = _compile_jinja_template(template)
        except Exception:  # another transformers version: keep the public path
            return None
        self._template_vars = dict(getattr(self.tokenizer, "special_tokens_map", {}) or {})
        fn = {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}
        call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
        probe = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u \u00e9"},
            {"role": "assistant", "content": "a", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "1", "content": "r"},
            {"role": "user", "content": "v"},
        ]
        for tools in ([{"type": "function", "function": fn}], None):
            for gen in (True, False):
                try:
                    want = self.tokenizer.apply_chat_template(
                        probe, tools=tools, tokenize=False, add_generation_prompt=gen
                    )
                    got = compiled.render(
                        messages=probe,
                        tools=tools,
                        documents=None,
                        add_generation_prompt=gen,
                        **self._template_vars,
                    )
                except Exception:
                    return None
                if got != want:
                    return None
        return compiled

    def render_delta(
        self, head: list[dict], reply: dict, new: list[dict], tools: list[dict] | None
    ) -> str:
        """Text the template renders for ``new`` messages (plus the next generation prompt)
        when they follow the assistant ``reply``. ``head`` is the conversation's leading
        system message(s), included because templates put tools and system text there.

        Cost depends on ``head``, ``reply`` and ``new`` only, never on the turns before.
        """
        probe = [*head, _PROBE_USER, reply]
        base = self.render(probe, tools, generation_prompt=False)
        full = self.render(probe + new, tools, generation_prompt=True)
        if not full.startswith(base):
            raise TemplateError("the chat template is not prefix-stable for these messages")
        return full[len(base) :]

    def turn_closing(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
        if self._closing is None:
            text = self.render(
                [_PROBE_USER, {"role": "assistant", "content": _SENTINEL}],
                None,
                generation_prompt=False,
            )
            self._closing = text[text.rindex(_SENTINEL) + len(_SENTINEL) :]
        return self._closing

    def closing_after(self, output_ids: list[int]) -> str:
        """Text to add after a generation so the next prompt continues a finished turn.

        The sampled ids are kept as they are. If the last one is a stop token that begins
        the template's turn closing (``<|im_end|>`` then ``\\n``), only the rest of the
        closing is added; otherwise (length limit, stop string) the whole closing is.
        """
        closing = self.turn_closing()
        if output_ids and self.is_stop(output_ids[-1]):
            last = self.decode(output_ids[-1:])
            if last and closing.startswith(last):
                return closing[len(last) :]
        return closing


class _PieceCache:
    """Encodes text piece by piece, cutting before each special token, with the pieces'
    ids cached (least recently used dropped past ``max_chars``).

    A special token ends a tokenizer segment, so the ids of the pieces, joined, are the
    ids of the whole; :meth:`for_tokenizer` checks that on a probe and returns None where
    it does not hold. Chat prompts repeat whole turns across sessions (Claude Code's ~30k
    tokens of system prompt and tools, a task's instructions), which are then tokenized
    once, not at the start of every episode.
    """

    def __init__(self, split: re.Pattern, encode_raw, max_chars: int):
        self._split = split
        self._encode_raw = encode_raw
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # prompts may be built in worker threads
        self.max_chars = max_chars

    @classmethod
    def for_tokenizer(
        cls, tokenizer, encode_raw, max_chars: int = 32_000_000
    ) -> _PieceCache | None:
        specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
        if not specials:
            return None
        split = re.compile(
            "(?=" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")"
        )
        cache = cls(split, encode_raw, max_chars)
        probe = "".join(f"{t}x y\n\u00e9 {t}{t}  z" for t in specials) + " tail"
        if cache.encode(probe) != list(encode_raw(probe)):
            return None
        cache._cache.clear()
        cache._chars = 0
        return cache

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        for piece in self._split.split(text):
            if not piece:
                continue
            with self._lock:
                ids = cache.get(piece)
                if ids is not None:
                    cache.move_to_end(piece)
            if ids is None:
                ids = tuple(self._encode_raw(piece))
                with self._lock:
                    if piece not in cache:
                        cache[piece] = ids
                        self._chars += len(piece)
                    while self._chars > self.max_chars and cache:
                        self._chars -= len(cache.popitem(last=False)[0])
            out += ids
        return out


def _token_id(tokenizer, token: str) -> int | None:
    vocab = tokenizer.get_vocab()
    return vocab.get(token)


class IncrementalDecoder:
    """Turns streamed ids into text, holding back bytes of a split multi-byte character.

    Stop-token ids are not shown as text. Decodes a short window (not the whole output) on
    each push, so the cost per token stays constant.
    """

    def __init__(self, renderer: ChatRenderer):
        self._r = renderer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, ids: list[int]) -> str:
        self._ids.extend(i for i in ids if not self._r.is_stop(i))
        if len(self._ids) == self._read:
            return ""
        prefix_text = self._r.decode(self._ids[self._prefix : self._read])
        new_text = self._r.decode(self._ids[self._prefix :])
        if new_text.endswith("\ufffd") and len(self._ids) - self._read < 4:
            return ""  # an incomplete UTF-8 sequence: wait for its next byte
        delta = new_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        return delta

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character decodes as U+FFFD)."""
        if len(self._ids) == self._read:
            return ""
        prefix_text = self._r.decode(self._ids[self._prefix : self._read])
        new_text = self._r.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]


class StopStringMatcher:
    """Finds the first stop string in streamed text; holds back a possible partial match."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._buf = ""
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Text safe to emit; after a match, the text before it and nothing more."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        self._buf += text
        hits = [(i, s) for s in self.stops if (i := self._buf.find(s)) >= 0]
        if hits:
            pos, self.matched = min(hits)
            out, self._buf = self._buf[:pos], ""
            return out
        cut = max(0, len(self._buf) - self._hold)
        out, self._buf = self._buf[:cut], self._buf[cut:]
        return out

    def flush(self) -> str:
        out, self._buf = self._buf, ""
        return "" if self.matched is not None else out


class ToolCallParser:
    """Splits streamed text into text pieces and tool calls.

    A call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; ``arguments``
    may also be a JSON string holding an object. A block that is not valid JSON of that
    shape, or never closed, comes back as plain text: never an error.
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        open_tag: str = "<tool_call>",
        close_tag: str = "</tool_call>",
    ):
        self.enabled = enabled
        self.open_tag, self.close_tag = open_tag, close_tag
        self._buf = ""
        self._in_call = False

    def push(self, text: str) -> list[str | ToolCall]:
        if not self.enabled:
            return [text] if text else []
        self._buf += text
        out: list[str | ToolCall] = []
        while True:
            if self._in_call:
                end = self._buf.find(self.close_tag)
                if end < 0:
                    return out
                body = self._buf[:end]
                raw = self.open_tag + body + self.close_tag
                self._buf = self._buf[end + len(self.close_tag) :]
                self._in_call = False
                call = parse_tool_call(body)
                out.append(call if call is not None else raw)
                continue
            start = self._buf.find(self.open_tag)
            if start >= 0:
                if start:
                    out.append(self._buf[:start])
                self._buf = self._buf[start + len(self.open_tag) :]
                self._in_call = True
                continue
            keep = _partial_suffix(self._buf, self.open_tag)
            if len(self._buf) > keep:
                out.append(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
            return out

    def flush(self) -> list[str | ToolCall]:
        rest = (self.open_tag if self._in_call else "") + self._buf
        self._buf, self._in_call = "", False
        return [rest] if rest else []


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_tool_call(body: str) -> ToolCall | None:
    """Parse the JSON inside one tool-call block, or None if it is not a valid call."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(name=data["name"], arguments=args)


def split_output(pieces: list[str | ToolCall]) -> tuple[str, list[ToolCall]]:
    """Join parsed pieces into (text content, tool calls)."""
    text = "".join(p for p in pieces if isinstance(p, str))
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    return text.strip() if calls else text, calls


_WS = re.compile(r"\s+")


def reply_key(content: str, tool_calls: list[tuple[str, dict]]) -> tuple:
    """Identity of an assistant reply for prefix matching: text without whitespace, calls
    as (name, canonical JSON arguments). Clients reformat whitespace and re-serialize JSON."""
    calls = tuple((n, json.dumps(a, sort_keys=True, ensure_ascii=False)) for n, a in tool_calls)
    return (_WS.sub("", content or ""), calls)
