"""Upstream passthrough: forward calls to an OpenAI- or Anthropic-compatible API.

For evaluating API models through Gyre and collecting their traces. The request body goes
upstream unchanged (the model name optionally replaced, the upstream's own key added) and
the answer comes back unchanged, streamed or not. Tokenization is the upstream's, so the
record holds text: the request, the answer's text and tool calls, the usage the upstream
reported, and token ids only where the upstream returns them (vLLM-style
``prompt_token_ids`` / ``token_ids`` fields). Branches are tracked on messages as for
token sessions (a call extending an earlier call's messages and reply is its child).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gyre_env._optional import require
from gyre_env.proxy.chat import ChatRequest, RequestError
from gyre_env.proxy.render import reply_key
from gyre_env.proxy.sessions import (
    BranchClassifier,
    CallContext,
    chain_hashes,
    default_classifier,
    reply_of,
)
from gyre_env.trajectory.records import CallRecord, RecordSink, record_written, submit_record

_FORWARDED_HEADERS = (
    "anthropic-version",
    "anthropic-beta",
    "openai-organization",
    "openai-project",
)


@dataclass(kw_only=True)
class UpstreamConfig:
    """Where and how to forward."""

    base_url: str
    """Root of the upstream API, without ``/v1`` (``https://api.anthropic.com``)."""
    api: str = "openai"
    """``openai`` (``/v1/chat/completions``) or ``anthropic`` (``/v1/messages``)."""
    api_key: str | None = None
    """Sent upstream as ``Authorization: Bearer`` (OpenAI) or ``x-api-key`` (Anthropic)."""
    model: str | None = None
    """If set, replaces the model name of every request."""
    timeout_s: float = 600.0
    headers: dict[str, str] = field(default_factory=dict)
    """Extra headers sent upstream."""

    def __post_init__(self) -> None:
        if self.api not in ("openai", "anthropic"):
            raise ValueError(
                f"UpstreamConfig.api must be 'openai' or 'anthropic', got {self.api!r}"
            )
        self.base_url = self.base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]


@dataclass
class _TextSession:
    calls: int = 0
    branches: int = 0
    by_prompt: dict = field(default_factory=dict)
    """prompt hash -> finished calls with that prompt: {index, branch, role, reply, claimed}"""


class Passthrough:
    """Forwards calls of one API to the upstream and records text-level traces."""

    def __init__(
        self,
        upstream: UpstreamConfig,
        *,
        sink: RecordSink | None = None,
        classifier: BranchClassifier = default_classifier,
    ):
        self.upstream = upstream
        self.sink = sink
        self.classifier = classifier
        self._sessions: dict[str, _TextSession] = {}
        self._lock = threading.Lock()
        self._client = None

    def _http(self):
        if self._client is None:
            httpx = require("httpx", "upstream passthrough")
            self._client = httpx.AsyncClient(timeout=self.upstream.timeout_s)
        return self._client

    def _plan(self, session: str, req: ChatRequest, headers: dict) -> dict:
        role = self.classifier(
            CallContext(session=session, messages=req.messages, headers=headers, api=req.api)
        )
        hashes = chain_hashes(req.messages, req.tools)
        with self._lock:
            state = self._sessions.setdefault(session, _TextSession())
            index, parent = state.calls, None
            state.calls += 1
            for i in range(len(req.messages) - 1, 0, -1):
                msg = req.messages[i - 1]
                if msg["role"] == "assistant" and hashes[i - 1] in state.by_prompt:
                    reply = reply_of(msg)
                    parent = next(
                        (
                            c
                            for c in reversed(state.by_prompt[hashes[i - 1]])
                            if c["reply"] == reply
                        ),
                        None,
                    )
                    if parent is not None:
                        break
            if parent is not None and parent["role"] == role and not parent["claimed"]:
                parent["claimed"], branch = True, parent["branch"]
            else:
                branch, state.branches = f"b{state.branches}", state.branches + 1
        return {
            "index": index,
            "parent": parent,
            "branch": branch,
            "role": role,
            "prompt_hash": hashes[-1],
            "state": state,
            "session": session,
        }

    def _url(self) -> str:
        path = "/v1/chat/completions" if self.upstream.api == "openai" else "/v1/messages"
        return self.upstream.base_url + path

    def _headers(self, incoming: dict) -> dict:
        out = {k: incoming[k] for k in _FORWARDED_HEADERS if k in incoming}
        if self.upstream.api == "anthropic":
            out.setdefault("anthropic-version", "2023-06-01")
            if self.upstream.api_key:
                out["x-api-key"] = self.upstream.api_key
        elif self.upstream.api_key:
            out["authorization"] = f"Bearer {self.upstream.api_key}"
        return {**out, **self.upstream.headers, "content-type": "application/json"}

    async def forward(self, api: str, session: str, body: dict, req: ChatRequest, headers: dict):
        """Return ``(status, json_body)`` or ``(status, async byte iterator)`` for streams."""
        if api != self.upstream.api:
            raise RequestError(
                f"this proxy forwards {self.upstream.api} requests only; "
                f"use the {self.upstream.api} endpoint"
            )
        if self.upstream.model:
            body = {**body, "model": self.upstream.model}
        plan = self._plan(session, req, headers)
        created, t0 = time.time(), time.perf_counter()
        httpx = require("httpx", "upstream passthrough")
        try:
            if req.stream:
                upstream = await self._http().send(
                    self._http().build_request(
                        "POST", self._url(), json=body, headers=self._headers(headers)
                    ),
                    stream=True,
                )
                return upstream.status_code, self._relay(
                    upstream, api, req, body, plan, created, t0
                )
            resp = await self._http().post(self._url(), json=body, headers=self._headers(headers))
        except httpx.HTTPError as e:
            await self._record(
                plan, req, body, created, t0, status=502, text="", calls=[], error=str(e)
            )
            raise RequestError(
                f"upstream {self._url()} failed: {type(e).__name__}: {e}", status=502
            ) from e
        try:
            data = resp.json()
        except ValueError:
            data = {"error": {"message": resp.text[:2000]}}
        text, calls, usage, ids = _parse_response(api, data)
        await self._record(
            plan,
            req,
            body,
            created,
            t0,
            status=resp.status_code,
            text=text,
            calls=calls,
            usage=usage,
            ids=ids,
            finish=_finish(api, data),
        )
        return resp.status_code, data

    async def _relay(self, upstream, api, req, body, plan, created, t0) -> AsyncIterator[bytes]:
        acc = _StreamAccumulator(api)
        error = None
        try:
            async for chunk in upstream.aiter_raw():
                acc.feed(chunk)
                yield chunk
        except Exception as e:  # the client sees the stream end; the record says why
            error = f"{type(e).__name__}: {e}"
        finally:
            await upstream.aclose()
            await self._record(
                plan,
                req,
                body,
                created,
                t0,
                status=upstream.status_code,
                text=acc.text,
                calls=acc.calls(),
                usage=acc.usage,
                finish=acc.finish,
                error=error,
            )

    async def _record(
        self,
        plan,
        req,
        body,
        created,
        t0,
        *,
        status: int,
        text: str,
        calls: list,
        usage=None,
        ids=None,
        finish=None,
        error=None,
    ) -> None:
        """Remember the call and write its record (on the sink's writer thread, awaited)."""
        ok = 200 <= status < 300 and error is None
        if ok:
            self._remember(plan, text, calls)
        if self.sink is None:
            return
        ids = ids or {}
        parent = plan["parent"]
        extra = {
            "upstream": self._url(),
            "status": status,
            "request": body,
            "response_text": text,
            "tool_calls": calls,
            "usage": usage or {},
        }
        if error:
            extra["error"] = error
        record = CallRecord(
            session=plan["session"],
            call_index=plan["index"],
            branch=plan["branch"],
            parent=parent["index"] if parent else None,
            role=plan["role"],
            prompt_ids=ids.get("prompt", []),
            output_ids=ids.get("output", []),
            output_logprobs=ids.get("logprobs", []),
            weight_version=0,
            sampling={
                "temperature": req.temperature,
                "top_p": req.top_p,
                "min_p": req.min_p,
                "max_tokens": req.max_tokens,
                "stop": req.stop,
            },
            finish_reason=finish or ("error" if not ok else "stop"),
            timings={"total": time.perf_counter() - t0},
            replica="upstream",
            api="passthrough",
            created=created,
            extra=extra,
        )
        await record_written(submit_record(self.sink, record))

    def _remember(self, plan: dict, text: str, calls: list[dict]) -> None:
        """Let later calls that extend this one's messages and answer find it."""
        reply = reply_key(text, [(c["name"], c["arguments"]) for c in calls])
        entry = {
            "index": plan["index"],
            "branch": plan["branch"],
            "role": plan["role"],
            "reply": reply,
            "claimed": False,
        }
        with self._lock:
            plan["state"].by_prompt.setdefault(plan["prompt_hash"], []).append(entry)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _parse_response(api: str, data: dict) -> tuple[str, list[dict], dict, dict]:
    """(text, tool calls, usage, token ids) of a complete upstream answer."""
    if not isinstance(data, dict):
        return "", [], {}, {}
    if api == "openai":
        choice = (data.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        calls = [
            {
                "name": c["function"]["name"],
                "arguments": _json_or_str(c["function"].get("arguments", "")),
            }
            for c in msg.get("tool_calls") or []
            if isinstance(c, dict) and "function" in c
        ]
        ids = {}
        if isinstance(data.get("prompt_token_ids"), list):
            ids["prompt"] = data["prompt_token_ids"]
        if isinstance(choice.get("token_ids"), list):
            ids["output"] = choice["token_ids"]
        return msg.get("content") or "", calls, data.get("usage") or {}, ids
    blocks = data.get("content") or []
    text = "".join(
        b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )
    calls = [
        {"name": b["name"], "arguments": b.get("input", {})}
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    return text, calls, data.get("usage") or {}, {}


def _finish(api: str, data: dict) -> str | None:
    if not isinstance(data, dict):
        return None
    if api == "openai":
        return ((data.get("choices") or [{}])[0]).get("finish_reason")
    return data.get("stop_reason")


def _json_or_str(text: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


class _StreamAccumulator:
    """Collects text, tool calls, usage and finish reason from upstream SSE bytes."""

    def __init__(self, api: str):
        self.api = api
        self._buf = b""
        self.text = ""
        self._calls: dict[int, dict] = {}
        self.usage: dict = {}
        self.finish: str | None = None

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload and payload != b"[DONE]":
                    try:
                        self._event(json.loads(payload))
                    except ValueError:
                        continue

    def _event(self, ev: dict) -> None:
        if self.api == "openai":
            if ev.get("usage"):
                self.usage = ev["usage"]
            for ch in ev.get("choices") or []:
                delta = ch.get("delta") or {}
                self.text += delta.get("content") or ""
                for tc in delta.get("tool_calls") or []:
                    entry = self._calls.setdefault(
                        tc.get("index", 0), {"name": "", "arguments": ""}
                    )
                    fn = tc.get("function") or {}
                    entry["name"] += fn.get("name") or ""
                    entry["arguments"] += fn.get("arguments") or ""
                self.finish = ch.get("finish_reason") or self.finish
            return
        kind = ev.get("type")
        if (
            kind == "content_block_start"
            and (ev.get("content_block") or {}).get("type") == "tool_use"
        ):
            self._calls[ev["index"]] = {
                "name": ev["content_block"].get("name", ""),
                "arguments": "",
            }
        elif kind == "content_block_delta":
            delta = ev.get("delta") or {}
            if delta.get("type") == "text_delta":
                self.text += delta.get("text", "")
            elif delta.get("type") == "input_json_delta" and ev.get("index") in self._calls:
                self._calls[ev["index"]]["arguments"] += delta.get("partial_json", "")
        elif kind == "message_start":
            self.usage = dict((ev.get("message") or {}).get("usage") or {})
        elif kind == "message_delta":
            self.usage.update(ev.get("usage") or {})
            self.finish = (ev.get("delta") or {}).get("stop_reason") or self.finish

    def calls(self) -> list[dict]:
        return [
            {"name": c["name"], "arguments": _json_or_str(c["arguments"]) if c["arguments"] else {}}
            for _, c in sorted(self._calls.items())
        ]
