"""Anthropic ``/v1/messages``: request parsing, responses and SSE events.

Accepts what Claude Code sends (see ``shared/reference/claude-code-wire.md``): ``system``
as a string or text blocks, ``role: "system"`` messages mid-conversation, ``tool_result``
content as a string or blocks, ``thinking`` blocks, ``cache_control`` on blocks, and
top-level ``thinking`` / ``context_management`` / ``output_config`` / ``metadata`` (checked
to be objects, otherwise not used). Server-side tools (a ``type`` and no
``input_schema``) cannot run here and are not offered to the model.
"""

from __future__ import annotations

import json
import uuid

from gyre_env.proxy.chat import (
    ChatRequest,
    ConversionMemo,
    RequestError,
    convert_messages,
    expect,
    json_bytes,
    opt_bool,
    opt_int,
    opt_number,
    opt_object,
    stop_list,
    text_of_parts,
)
from gyre_env.proxy.render import ToolCall

_IGNORED_OBJECTS = ("thinking", "context_management", "output_config", "metadata")


def parse_request(body: dict, memo: ConversionMemo | None = None) -> ChatRequest:
    """Check an Anthropic messages request and convert it to a :class:`ChatRequest`;
    ``memo`` (the session's) lets a request that repeats the last one's system prompt and
    messages convert only the new ones."""
    model = body.get("model", "")
    expect(model, (str,), "model", "a string")
    max_tokens = opt_int(body, "max_tokens", lo=1)
    if max_tokens is None:
        raise RequestError("max_tokens: required", param="max_tokens")
    raw = body.get("messages")
    if raw is None:
        raise RequestError("messages: required", param="messages")
    expect(raw, (list,), "messages", "an array of messages")
    if not raw:
        raise RequestError("messages: must not be empty", param="messages")
    for key in _IGNORED_OBJECTS:
        opt_object(body, key)
    # the system prompt converts as element 0, so the memo reuses it like a message
    messages = convert_messages([body.get("system"), *raw], _system_or_message, memo)
    tools = _tools(body.get("tools"))
    choice = opt_object(body, "tool_choice") or {}
    parse_tools = choice.get("type") != "none"
    if choice.get("type") == "tool" and choice.get("name") not in {
        t["function"]["name"] for t in tools or []
    }:
        raise RequestError(
            f"tool_choice: no tool named {choice.get('name')!r} in tools", param="tool_choice"
        )
    return ChatRequest(
        api="anthropic",
        model=model,
        messages=messages,
        tools=tools if parse_tools else None,
        parse_tools=parse_tools and bool(tools),
        max_tokens=max_tokens,
        temperature=opt_number(body, "temperature", 1.0, 0.0, 1.0),
        top_p=opt_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=opt_int(body, "top_k", lo=0) or -1,
        min_p=opt_number(body, "min_p", 0.0, 0.0, 0.999),
        stop=stop_list(body.get("stop_sequences"), "stop_sequences", allow_string=False),
        stream=opt_bool(body, "stream"),
    )


def _system_or_message(m: object, k: int) -> list[dict]:
    if k:
        return _message(m, k - 1)
    text = "" if m is None else text_of_parts(m, "system")
    return [{"role": "system", "content": text}] if text else []


def _message(m: object, k: int) -> list[dict]:
    if type(m) is not dict:
        expect(m, (dict,), f"messages[{k}]", "an object")
    role = m.get("role")
    content = m.get("content")
    if type(content) is str and role in ("user", "assistant", "system"):
        return [{"role": role, "content": content}]  # the common case, kept cheap
    where = f"messages[{k}]"
    if role not in ("user", "assistant", "system"):
        raise RequestError(
            f"{where}.role: expected user, assistant or system, got {role!r}", param=f"{where}.role"
        )
    expect(content, (list,), f"{where}.content", "a string or an array of content blocks")
    if role == "assistant":
        return [_assistant(content, where)]
    if role == "system":
        return [{"role": "system", "content": text_of_parts(content, f"{where}.content")}]
    out: list[dict] = []
    texts: list[str] = []
    for k, block in enumerate(content):
        at = f"{where}.content[{k}]"
        expect(block, (dict,), at, "an object")
        kind = block.get("type")
        if kind == "text":
            expect(block.get("text"), (str,), f"{at}.text", "a string")
            texts.append(block["text"])
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, at))
        else:
            raise RequestError(
                f"{at}.type: unsupported content block type {kind!r}", param=f"{at}.type"
            )
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_result(block: dict, at: str) -> dict:
    use_id = block.get("tool_use_id")
    expect(use_id, (str,), f"{at}.tool_use_id", "a string")
    content = block.get("content", "")
    text = "" if content is None else text_of_parts(content, f"{at}.content", ("text", "image"))
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": use_id, "content": text}


def _assistant(content: list, where: str) -> dict:
    texts, calls, thinking = [], [], []
    for k, block in enumerate(content):
        at = f"{where}.content[{k}]"
        expect(block, (dict,), at, "an object")
        kind = block.get("type")
        if kind == "text":
            expect(block.get("text"), (str,), f"{at}.text", "a string")
            texts.append(block["text"])
        elif kind == "tool_use":
            expect(block.get("name"), (str,), f"{at}.name", "a string")
            args = block.get("input", {})
            expect(args, (dict,), f"{at}.input", "an object")
            call = {"name": block["name"], "arguments": args}
            calls.append({"id": block.get("id") or "", "type": "function", "function": call})
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block.get("thinking") or "")
        else:
            raise RequestError(
                f"{at}.type: unsupported content block type {kind!r}", param=f"{at}.type"
            )
    out: dict = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if any(thinking):
        out["reasoning_content"] = "\n".join(thinking)
    return out


def _tools(tools: object) -> list[dict] | None:
    if tools is None:
        return None
    expect(tools, (list,), "tools", "an array of tools")
    out = []
    for k, tool in enumerate(tools):
        expect(tool, (dict,), f"tools[{k}]", "an object")
        if "input_schema" not in tool and tool.get("type") not in (None, "custom"):
            continue  # a server-side tool (web search, ...): nothing here can run it
        expect(tool.get("name"), (str,), f"tools[{k}].name", "a string")
        schema = tool.get("input_schema", {"type": "object", "properties": {}})
        expect(schema, (dict,), f"tools[{k}].input_schema", "an object")
        fn = {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": schema,
        }
        out.append({"type": "function", "function": fn})
    return out or None


def error_body(err: RequestError) -> dict:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "request_too_large",
        503: "overloaded_error",
    }.get(err.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def stop_reason(finish: str, calls: list[ToolCall], stop_sequence: str | None) -> str:
    if stop_sequence is not None:
        return "stop_sequence"
    if calls and finish == "stop":
        return "tool_use"
    return "max_tokens" if finish == "length" else "end_turn"


def _usage(usage: tuple[int, int]) -> dict:
    return {
        "input_tokens": usage[0],
        "output_tokens": usage[1],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message(
    req: ChatRequest,
    pieces: list[str | ToolCall],
    finish: str,
    stop_seq: str | None,
    usage: tuple[int, int],
) -> dict:
    """A complete ``message`` object; text and tool_use blocks in the order generated."""
    content: list[dict] = []
    for piece in pieces:
        if isinstance(piece, ToolCall):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{piece.id}",
                    "name": piece.name,
                    "input": piece.arguments,
                }
            )
        elif content and content[-1]["type"] == "text":
            content[-1]["text"] += piece
        else:
            content.append({"type": "text", "text": piece})
    content = [b for b in content if b["type"] != "text" or b["text"].strip()] or [
        {"type": "text", "text": ""}
    ]
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": stop_reason(finish, calls, stop_seq),
        "stop_sequence": stop_seq,
        "usage": _usage(usage),
    }


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: ".encode() + json_bytes(data) + b"\n\n"


class EventWriter:
    """Formats one streamed message as Anthropic SSE events."""

    def __init__(self, req: ChatRequest):
        self.req = req
        self._index = -1
        self._open: str | None = None
        self._calls = 0

    def start(self, prompt_tokens: int) -> bytes:
        msg = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": self.req.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage((prompt_tokens, 0)),
        }
        return _event("message_start", {"type": "message_start", "message": msg})

    def ping(self) -> bytes:
        return _event("ping", {"type": "ping"})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def text(self, text: str) -> bytes:
        out = b""
        if self._open != "text":
            out += self._close()
            self._index += 1
            self._open = "text"
            out += _event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": self._index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
        delta = {"type": "text_delta", "text": text}
        return out + _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )

    def tool_call(self, call: ToolCall) -> bytes:
        self._calls += 1
        out = self._close()
        self._index += 1
        block = {"type": "tool_use", "id": f"toolu_{call.id}", "name": call.name, "input": {}}
        out += _event(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )
        delta = {
            "type": "input_json_delta",
            "partial_json": json.dumps(call.arguments, ensure_ascii=False),
        }
        out += _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )
        self._open = "tool_use"
        return out + self._close()

    def finish(self, finish: str, stop_seq: str | None, usage: tuple[int, int]) -> bytes:
        out = b"" if self._index >= 0 else self.text("")
        out += self._close()
        calls = [None] * self._calls
        delta = {"stop_reason": stop_reason(finish, calls, stop_seq), "stop_sequence": stop_seq}
        out += _event(
            "message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(usage)}
        )
        return out + _event("message_stop", {"type": "message_stop"})

    def error(self, err: RequestError) -> bytes:
        return _event("error", error_body(err))
