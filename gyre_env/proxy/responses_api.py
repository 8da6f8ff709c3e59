"""OpenAI ``/v1/responses``: request parsing, prior responses, the Response object and its
typed SSE events.

Input items become the internal messages of :mod:`gyre_env.proxy.render`: ``message``
(any role; ``developer`` is ``system``), ``function_call`` and ``reasoning`` items join the
assistant turn they belong to (a response's text, reasoning and calls are one turn of the
chat template), ``function_call_output`` is a ``tool`` message, and ``item_reference`` is
an output item of an earlier stored response of the session. Any other item type is a 400
that names it. ``instructions`` is a leading system message; as in OpenAI's API it is not
carried over by ``previous_response_id``.

A response is stored in its session (unless ``store`` is false, as Codex sends it) as the
conversation it ends: the messages without instructions plus its reply, which is exactly
the assistant message the session's prefix matching expects, so a call continuing it by
``previous_response_id`` reuses the earlier prompt and output ids like any other.

Tools: ``function`` tools, and the functions of ``namespace`` tools (called by their own
name; the call names its namespace). Hosted tools (``web_search``, ``file_search``, ...)
and freeform ``custom`` tools cannot be run as functions here and are not offered to the
model; any other tool type is a 400.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

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
    text_of_parts,
)
from gyre_env.proxy.openai_api import error_body  # the same error shape as Chat Completions
from gyre_env.proxy.render import ToolCall

__all__ = ["ResponseLog", "ResponseWriter", "ResponsesRequest", "error_body", "parse_request"]

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_NOT_OFFERED = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer",
        "computer_use_preview",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "custom",
    }
)
"""Tool types that are not plain functions: hosted tools and freeform ``custom`` tools."""
_UNSUPPORTED = ("background", "conversation", "prompt")
"""Request fields whose features this proxy does not have (a 400 when set)."""
KEEP_RESPONSES = 256
"""Stored responses per session (oldest dropped first)."""


@dataclass(kw_only=True)
class ResponsesRequest(ChatRequest):
    """A Responses call: the chat request plus what its Response object and storage need."""

    conversation: list[dict] = field(default_factory=list)
    """Messages without the instructions: what a later ``previous_response_id`` continues."""
    store: bool = True
    """Keep the response in the session (``previous_response_id``, ``GET``)."""
    namespaces: dict[str, str] = field(default_factory=dict)
    """Function name -> its namespace, for functions offered inside a ``namespace`` tool."""
    echo: dict = field(default_factory=dict)
    """Request fields repeated in the Response object."""


@dataclass
class StoredResponse:
    """A finished response as later calls see it."""

    conversation: list[dict]
    """Its messages without instructions, then its reply (an assistant message)."""
    items: dict[str, dict]
    """Its output items by id (for ``item_reference``)."""
    response: dict = field(default_factory=dict)
    """The Response object (``GET /v1/responses/{id}``)."""


class ResponseLog:
    """One session's stored responses, by id (the newest :data:`KEEP_RESPONSES`)."""

    __slots__ = ("entries", "keep")

    def __init__(self, keep: int = KEEP_RESPONSES) -> None:
        self.keep = keep
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def add(self, response_id: str, stored: StoredResponse) -> None:
        self.entries[response_id] = stored
        while len(self.entries) > self.keep:
            self.entries.popitem(last=False)

    def get(self, response_id: str, param: str | None = "previous_response_id") -> StoredResponse:
        """The stored response ``response_id``; a 400 naming ``param`` when there is none
        (404 when ``param`` is None: a lookup by URL)."""
        stored = self.entries.get(response_id)
        if stored is None:
            where = f"{param}: " if param else ""
            raise RequestError(
                f"{where}no response {response_id!r} in this session (the proxy keeps the "
                f"last {self.keep} responses of a session, and none sent with store=false)",
                param=param,
                status=400 if param else 404,
                code="previous_response_not_found" if param else "response_not_found",
            )
        return stored

    def item(self, item_id: str, where: str) -> dict:
        for stored in reversed(self.entries.values()):
            if item_id in stored.items:
                return stored.items[item_id]
        raise RequestError(
            f"{where}.id: no output item {item_id!r} in this session's stored responses",
            param=f"{where}.id",
        )


def parse_request(
    body: dict, log: ResponseLog, memo: ConversionMemo | None = None
) -> ResponsesRequest:
    """Check a Responses request and convert it; ``log`` holds the session's earlier
    responses (``previous_response_id``, ``item_reference``), ``memo`` lets a request that
    repeats the last one's input items convert only the new ones."""
    model = body.get("model", "")
    expect(model, (str,), "model", "a string")
    for key in _UNSUPPORTED:
        if body.get(key) not in (None, False):
            raise RequestError(f"{key}: not supported by this proxy", param=key)
    raw = body.get("input")
    if raw is None:
        raise RequestError("input: required", param="input")
    if isinstance(raw, str):
        new = [{"role": "user", "content": raw}]
    else:
        expect(raw, (list,), "input", "a string or an array of input items")
        new = _merge_turns(convert_messages(raw, _Converter(log), memo))
    previous = body.get("previous_response_id")
    conversation = new
    if previous is not None:
        expect(previous, (str,), "previous_response_id", "a string")
        conversation = log.get(previous).conversation + new
    if not conversation:
        raise RequestError("input: must not be empty", param="input")
    instructions = body.get("instructions")
    if instructions is not None:
        expect(instructions, (str,), "instructions", "a string")
    head = [{"role": "system", "content": instructions}] if instructions else []
    tools, namespaces = _tools(body.get("tools"))
    parse_tools = _tool_choice(body.get("tool_choice"), tools)
    fmt = (opt_object(body, "text") or {}).get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise RequestError(f"text.format: type {kind!r} is not supported", param="text.format")
    for key in ("metadata", "reasoning"):
        opt_object(body, key)
    store = opt_bool(body, "store", True)
    echo = {
        "instructions": instructions,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": opt_bool(body, "parallel_tool_calls", True),
        "metadata": body.get("metadata") or {},
        "previous_response_id": previous,
        "store": store,
    }
    return ResponsesRequest(
        api="responses",
        model=model,
        messages=head + conversation,
        tools=tools if parse_tools else None,
        parse_tools=parse_tools and bool(tools),
        max_tokens=opt_int(body, "max_output_tokens", lo=1),
        temperature=opt_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=opt_number(body, "top_p", 1.0, 0.0, 1.0),
        min_p=opt_number(body, "min_p", 0.0, 0.0, 0.999),
        stream=opt_bool(body, "stream"),
        conversation=conversation,
        store=store,
        namespaces=namespaces,
        echo=echo,
    )


class _Converter:
    """Converts input item ``k`` into internal messages (assistant parts merged later)."""

    def __init__(self, log: ResponseLog):
        self.log = log

    def __call__(self, item: object, k: int) -> list[dict]:
        where = f"input[{k}]"
        if type(item) is not dict:
            expect(item, (dict,), where, "an object")
        kind = item.get("type")
        if kind == "item_reference":
            expect(item.get("id"), (str,), f"{where}.id", "a string")
            item = self.log.item(item["id"], where)
            kind = item.get("type")
        if kind in (None, "message"):
            return [_message(item, where)]
        if kind == "function_call":
            return [_function_call(item, where)]
        if kind == "function_call_output":
            call_id = item.get("call_id")
            expect(call_id, (str,), f"{where}.call_id", "a string")
            output = _text(item.get("output"), f"{where}.output")
            return [{"role": "tool", "tool_call_id": call_id, "content": output}]
        if kind == "reasoning":
            parts = [*(item.get("summary") or []), *(item.get("content") or [])]
            text = _text(parts, f"{where}.summary")  # encrypted_content: opaque, left out
            return [{"role": "assistant", "content": "", "reasoning_content": text}] if text else []
        raise RequestError(f"{where}.type: unsupported item type {kind!r}", param=f"{where}.type")


def _message(item: dict, where: str) -> dict:
    role = _ROLES.get(item.get("role"))
    if role is None:
        raise RequestError(
            f"{where}.role: expected one of {sorted(_ROLES)}, got {item.get('role')!r}",
            param=f"{where}.role",
        )
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def _text(content: object, where: str) -> str:
    """A string, or the text of an array of text parts (other part types are a 400)."""
    if type(content) is str:
        return content
    return text_of_parts(content, where, _TEXT_PARTS)


def _function_call(item: dict, where: str) -> dict:
    expect(item.get("name"), (str,), f"{where}.name", "a string")
    expect(item.get("call_id"), (str,), f"{where}.call_id", "a string")
    args = item.get("arguments", "")
    expect(args, (str,), f"{where}.arguments", "a JSON string")
    try:
        args = json.loads(args) if args.strip() else {}
    except ValueError:
        pass  # rendered as the client sent it
    call = {"name": item["name"], "arguments": args}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": item["call_id"], "type": "function", "function": call}],
    }


def _merge_turns(messages: list[dict]) -> list[dict]:
    """Consecutive assistant messages (a response's reasoning, text and calls) as one turn.
    Merged messages are new dicts: the converted ones may be a memo's."""
    out: list[dict] = []
    for msg in messages:
        prev = out[-1] if out else None
        if msg["role"] != "assistant" or prev is None or prev["role"] != "assistant":
            out.append(msg)
            continue
        merged = {"role": "assistant", "content": _join(prev["content"], msg["content"])}
        calls = [*prev.get("tool_calls", ()), *msg.get("tool_calls", ())]
        if calls:
            merged["tool_calls"] = calls
        reasoning = _join(prev.get("reasoning_content", ""), msg.get("reasoning_content", ""))
        if reasoning:
            merged["reasoning_content"] = reasoning
        out[-1] = merged
    return out


def _join(a: str, b: str) -> str:
    return f"{a}\n{b}" if a and b else a or b


def _tools(tools: object) -> tuple[list[dict] | None, dict[str, str]]:
    if tools is None:
        return None, {}
    expect(tools, (list,), "tools", "an array of tools")
    out: list[dict] = []
    namespaces: dict[str, str] = {}
    for k, tool in enumerate(tools):
        expect(tool, (dict,), f"tools[{k}]", "an object")
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool, f"tools[{k}]"))
        elif kind == "namespace":
            expect(tool.get("name"), (str,), f"tools[{k}].name", "a string")
            inner = tool.get("tools")
            expect(inner, (list,), f"tools[{k}].tools", "an array of tools")
            for j, fn in enumerate(inner):
                at = f"tools[{k}].tools[{j}]"
                expect(fn, (dict,), at, "an object")
                if fn.get("type") == "function":
                    out.append(_function(fn, at))
                    namespaces[fn["name"]] = tool["name"]
        elif kind not in _NOT_OFFERED:
            raise RequestError(
                f"tools[{k}].type: unsupported tool type {kind!r}", param=f"tools[{k}].type"
            )
    return out or None, namespaces


def _function(tool: dict, where: str) -> dict:
    expect(tool.get("name"), (str,), f"{where}.name", "a string")
    params = tool.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    expect(params, (dict,), f"{where}.parameters", "an object")
    fn = {"name": tool["name"], "description": tool.get("description") or "", "parameters": params}
    return {"type": "function", "function": fn}


def _tool_choice(choice: object, tools: list[dict] | None) -> bool:
    """Whether tools are offered. ``required`` and a named function are accepted but not
    enforced (no constrained decoding): the model may still answer in text."""
    if choice is None or choice in ("auto", "required"):
        return True
    if choice == "none":
        return False
    expect(choice, (dict,), "tool_choice", "'none', 'auto', 'required' or an object")
    if choice.get("type") == "function":
        names = {t["function"]["name"] for t in tools or []}
        if choice.get("name") not in names:
            raise RequestError(
                f"tool_choice: no function named {choice.get('name')!r} in tools",
                param="tool_choice",
            )
    return True


def reply_message(text: str, calls: list[ToolCall]) -> dict:
    """The assistant message a response's output is in a later request (what the session
    matched its reply against)."""
    msg: dict = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [
            {
                "id": f"call_{c.id}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in calls
        ]
    return msg


class ResponseWriter:
    """Builds one response from the call's events: its SSE events (``response.created`` ...
    ``response.completed``) as bytes, and the Response object (:attr:`response`), which it
    stores in the session's ``log`` when it finishes (unless the request says not to).
    ``cached``: the prompt tokens reused from an earlier call (``cached_tokens``)."""

    def __init__(self, req: ResponsesRequest, log: ResponseLog, cached: int = 0):
        self.req, self.log, self.cached = req, log, cached
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.output: list[dict] = []
        self.response: dict = {}
        self._seq = 0
        self._open: dict | None = None  # the message item receiving text
        self._held = ""  # whitespace not yet worth a message item

    def _event(self, kind: str, **data) -> bytes:
        data = {"type": kind, **data, "sequence_number": self._seq}
        self._seq += 1
        return f"event: {kind}\ndata: ".encode() + json_bytes(data) + b"\n\n"

    def _object(self, status: str, usage: dict | None = None, **extra) -> dict:
        e = self.req.echo
        obj = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.req.model,
            "output": [dict(item) for item in self.output],
            "error": None,
            "incomplete_details": None,
            "instructions": e.get("instructions"),
            "metadata": e.get("metadata") or {},
            "parallel_tool_calls": e.get("parallel_tool_calls", True),
            "tool_choice": e.get("tool_choice") or "auto",
            "tools": e.get("tools") or [],
            "temperature": self.req.temperature,
            "top_p": self.req.top_p,
            "max_output_tokens": self.req.max_tokens,
            "previous_response_id": e.get("previous_response_id"),
            "store": e.get("store", True),
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": usage,
        }
        obj.update(extra)
        return obj

    def start(self) -> bytes:
        obj = self._object("in_progress")
        return self._event("response.created", response=obj) + self._event(
            "response.in_progress", response=obj
        )

    def ping(self) -> bytes:
        return b": ping\n\n"

    def text(self, text: str) -> bytes:
        out = b""
        if self._open is None:
            self._held += text
            if not self._held.strip():
                return b""
            text, self._held = self._held, ""
            out = self._open_message()
        self._open["content"][0]["text"] += text
        return out + self._event(
            "response.output_text.delta", **self._at(0), delta=text, logprobs=[]
        )

    def _open_message(self) -> bytes:
        item = {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        out = self._add(item)
        self._open = item
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        out += self._event("response.content_part.added", **self._at(0), part=dict(part))
        item["content"].append(part)
        return out

    def _at(self, content_index: int | None = None) -> dict:
        item = self._open if content_index is not None else self.output[-1]
        at = {"item_id": item["id"], "output_index": self.output.index(item)}
        if content_index is not None:
            at["content_index"] = content_index
        return at

    def _add(self, item: dict) -> bytes:
        self.output.append(item)
        added = {k: (list(v) if isinstance(v, list) else v) for k, v in item.items()}
        return self._event(
            "response.output_item.added", output_index=len(self.output) - 1, item=added
        )

    def _close(self, status: str = "completed") -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        part = item["content"][0]
        at = {"item_id": item["id"], "output_index": self.output.index(item), "content_index": 0}
        out = self._event("response.output_text.done", **at, text=part["text"], logprobs=[])
        out += self._event("response.content_part.done", **at, part=part)
        item["status"] = status
        return out + self._event(
            "response.output_item.done", output_index=at["output_index"], item=item
        )

    def tool_call(self, call: ToolCall) -> bytes:
        out = self._close()
        self._held = ""
        item = {
            "id": f"fc_{uuid.uuid4().hex}",
            "type": "function_call",
            "status": "in_progress",
            "call_id": f"call_{call.id}",
            "name": call.name,
            "arguments": "",
        }
        namespace = self.req.namespaces.get(call.name)
        if namespace is not None:
            item["namespace"] = namespace
        out += self._add(item)
        args = json.dumps(call.arguments, ensure_ascii=False)
        at = self._at()
        out += self._event("response.function_call_arguments.delta", **at, delta=args)
        out += self._event("response.function_call_arguments.done", **at, arguments=args)
        item["arguments"], item["status"] = args, "completed"
        return out + self._event(
            "response.output_item.done", output_index=at["output_index"], item=item
        )

    def finish(
        self, finish: str, usage: tuple[int, int], text: str, calls: list[ToolCall]
    ) -> bytes:
        """The closing events; ``text`` and ``calls`` are the reply as parsed whole."""
        cut = finish == "length"
        out = self._open_message() if not self.output else b""  # an empty answer: one message
        out += self._close("incomplete" if cut else "completed")
        counts = {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": self.cached},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage[0] + usage[1],
        }
        if cut:
            details = {"reason": "max_output_tokens"}
            self.response = self._object("incomplete", counts, incomplete_details=details)
        else:
            self.response = self._object("completed", counts, completed_at=int(time.time()))
        if self.req.store:
            self.log.add(self.id, self.stored(text, calls))
        kind = "response.incomplete" if cut else "response.completed"
        return out + self._event(kind, response=self.response)

    def error(self, err: RequestError) -> bytes:
        out = self._close("incomplete")
        failure = {"code": err.code or "server_error", "message": err.message}
        self.response = self._object("failed", error=failure)
        return out + self._event("response.failed", response=self.response)

    def stored(self, text: str, calls: list[ToolCall]) -> StoredResponse:
        """This response as later calls of the session see it."""
        items = {item["id"]: item for item in self.output}
        conversation = self.req.conversation + [reply_message(text, calls)]
        return StoredResponse(conversation, items, self.response)
