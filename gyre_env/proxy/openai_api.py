"""OpenAI ``/v1/chat/completions``: request parsing, responses and SSE chunks."""

from __future__ import annotations

import json
import time
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

_ROLES = {"system", "developer", "user", "assistant", "tool"}


def parse_request(body: dict, memo: ConversionMemo | None = None) -> ChatRequest:
    """Check an OpenAI chat request and convert it to a :class:`ChatRequest`; ``memo``
    (the session's) lets a request that repeats the last one's messages convert only the
    new ones."""
    model = body.get("model", "")
    expect(model, (str,), "model", "a string")
    raw_messages = body.get("messages")
    if raw_messages is None:
        raise RequestError("messages: required", param="messages")
    expect(raw_messages, (list,), "messages", "an array of messages")
    if not raw_messages:
        raise RequestError("messages: must not be empty", param="messages")
    messages = convert_messages(raw_messages, _one_message, memo)
    n = opt_int(body, "n", lo=1)
    if n not in (None, 1):
        raise RequestError("n: only n=1 is supported", param="n")
    tools = _tools(body.get("tools"))
    parse_tools = _tool_choice(body.get("tool_choice"), tools)
    max_tokens = opt_int(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = opt_int(body, "max_tokens", lo=1)
    stream_options = opt_object(body, "stream_options") or {}
    fmt = opt_object(body, "response_format")
    if fmt is not None and fmt.get("type") not in (None, "text"):
        raise RequestError(
            f"response_format: type {fmt.get('type')!r} is not supported", param="response_format"
        )
    return ChatRequest(
        api="openai",
        model=model,
        messages=messages,
        tools=tools if parse_tools else None,
        parse_tools=parse_tools and bool(tools),
        max_tokens=max_tokens,
        temperature=opt_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=opt_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=opt_int(body, "top_k", lo=-1) or -1,
        min_p=opt_number(body, "min_p", 0.0, 0.0, 0.999),
        seed=opt_int(body, "seed", lo=-(2**63)),
        stop=stop_list(body.get("stop"), "stop"),
        stream=opt_bool(body, "stream"),
        include_usage=opt_bool(stream_options, "include_usage"),
    )


def _one_message(m: object, k: int) -> list[dict]:
    return [_message(m, k)]


def _message(m: object, k: int) -> dict:
    # runs once per message of every request: error paths build their messages lazily
    if type(m) is not dict:
        expect(m, (dict,), f"messages[{k}]", "an object")
    role = m.get("role")
    if role not in _ROLES:
        raise RequestError(
            f"messages[{k}].role: expected one of {sorted(_ROLES)}, got {role!r}",
            param=f"messages[{k}].role",
        )
    content = m.get("content")
    if type(content) is str:
        text = content
    else:
        text = "" if content is None else text_of_parts(content, f"messages[{k}].content")
    if role == "user":
        return {"role": role, "content": text}
    where = f"messages[{k}]"
    if role == "developer":
        role = "system"
    out: dict = {"role": role, "content": text}
    if role == "tool":
        call_id = m.get("tool_call_id")
        expect(call_id, (str,), f"{where}.tool_call_id", "a string")
        out["tool_call_id"] = call_id
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
    return out


def _tool_calls(calls: object, where: str) -> list[dict]:
    expect(calls, (list,), where, "an array")
    out = []
    for k, call in enumerate(calls):
        expect(call, (dict,), f"{where}[{k}]", "an object")
        fn = call.get("function")
        expect(fn, (dict,), f"{where}[{k}].function", "an object")
        expect(fn.get("name"), (str,), f"{where}[{k}].function.name", "a string")
        args = fn.get("arguments", "{}")
        expect(args, (str, dict), f"{where}[{k}].function.arguments", "a JSON string")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass  # rendered as the client sent it
        out.append(
            {
                "id": call.get("id") or "",
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    return out


def _tools(tools: object) -> list[dict] | None:
    if tools is None:
        return None
    expect(tools, (list,), "tools", "an array of tools")
    for k, tool in enumerate(tools):
        expect(tool, (dict,), f"tools[{k}]", "an object")
        if tool.get("type", "function") != "function":
            raise RequestError(
                f"tools[{k}].type: only 'function' tools are supported", param=f"tools[{k}].type"
            )
        fn = tool.get("function")
        expect(fn, (dict,), f"tools[{k}].function", "an object")
        expect(fn.get("name"), (str,), f"tools[{k}].function.name", "a string")
        if fn.get("parameters") is not None:
            expect(fn["parameters"], (dict,), f"tools[{k}].function.parameters", "an object")
    return tools or None


def _tool_choice(choice: object, tools: list[dict] | None) -> bool:
    """Whether tools are offered. ``required`` and a named function are accepted but not
    enforced (no constrained decoding): the model may still answer in text."""
    if choice is None or choice in ("auto", "required"):
        return True
    if choice == "none":
        return False
    expect(choice, (dict,), "tool_choice", "'none', 'auto', 'required' or an object")
    name = (choice.get("function") or {}).get("name")
    names = {t["function"]["name"] for t in tools or []}
    if name not in names:
        raise RequestError(f"tool_choice: no tool named {name!r} in tools", param="tool_choice")
    return True


def error_body(err: RequestError) -> dict:
    kind = "invalid_request_error" if err.status < 500 else "server_error"
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def _tool_call_json(call: ToolCall, index: int | None = None) -> dict:
    out = {
        "id": f"call_{call.id}",
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        },
    }
    if index is not None:
        out["index"] = index
    return out


def completion(
    req: ChatRequest, text: str, calls: list[ToolCall], finish: str, usage: tuple[int, int]
) -> dict:
    """A complete ``chat.completion`` object."""
    message: dict = {"role": "assistant", "content": text if (text or not calls) else None}
    if calls:
        message["tool_calls"] = [_tool_call_json(c) for c in calls]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(usage),
    }


def _usage(usage: tuple[int, int]) -> dict:
    return {
        "prompt_tokens": usage[0],
        "completion_tokens": usage[1],
        "total_tokens": usage[0] + usage[1],
    }


class ChunkWriter:
    """Formats one streamed completion as SSE ``data:`` lines."""

    def __init__(self, req: ChatRequest):
        self.req = req
        self._head = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": req.model,
        }
        self._calls = 0

    def _chunk(self, delta: dict, finish: str | None = None) -> bytes:
        data = {
            **self._head,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return b"data: " + json_bytes(data) + b"\n\n"

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def ping(self) -> bytes:
        return b": ping\n\n"

    def text(self, text: str) -> bytes:
        return self._chunk({"content": text})

    def tool_call(self, call: ToolCall) -> bytes:
        self._calls += 1
        return self._chunk({"tool_calls": [_tool_call_json(call, self._calls - 1)]})

    def finish(self, finish: str, usage: tuple[int, int]) -> bytes:
        out = self._chunk({}, finish)
        if self.req.include_usage:
            data = {**self._head, "choices": [], "usage": _usage(usage)}
            out += b"data: " + json_bytes(data) + b"\n\n"
        return out + b"data: [DONE]\n\n"

    def error(self, err: RequestError) -> bytes:
        return b"data: " + json_bytes(error_body(err)) + b"\n\n"


def finish_reason(finish: str, calls: list[ToolCall]) -> str:
    if calls and finish == "stop":
        return "tool_calls"
    return "length" if finish == "length" else "stop"
