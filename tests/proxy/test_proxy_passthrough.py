"""Upstream passthrough, against a fake OpenAI/Anthropic upstream started in the test
(a real remote API cannot be reached from CI): answers come back unchanged, streamed or
not, and records carry the text-level trace, usage, branch links and token ids when the
upstream gives them."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import anthropic
import httpx
import openai
import pytest

from gyre_env.proxy.passthrough import UpstreamConfig
from gyre_env.proxy.records import JsonlSink, read_jsonl
from gyre_env.proxy.server import ProxyConfig, ProxyServer


class FakeUpstream:
    """A minimal OpenAI + Anthropic API: a tool call first, text once a tool result is sent."""

    def __init__(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        self.seen: list[tuple[dict, dict]] = []

        async def chat(request):
            body = await request.json()
            self.seen.append((dict(request.headers), body))
            has_result = any(m["role"] == "tool" for m in body["messages"])
            if body.get("stream"):
                return StreamingResponse(
                    self._openai_stream(has_result), media_type="text/event-stream"
                )
            msg = (
                {"role": "assistant", "content": "done"}
                if has_result
                else {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
                        }
                    ],
                }
            )
            return JSONResponse(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "prompt_token_ids": [1, 2, 3],
                    "choices": [
                        {
                            "index": 0,
                            "message": msg,
                            "token_ids": [7, 8],
                            "finish_reason": "stop" if has_result else "tool_calls",
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                }
            )

        async def messages(request):
            body = await request.json()
            self.seen.append((dict(request.headers), body))
            if request.headers.get("x-api-key") != "upstream-key":
                return JSONResponse(
                    {
                        "type": "error",
                        "error": {"type": "authentication_error", "message": "bad key"},
                    },
                    status_code=401,
                )
            return StreamingResponse(self._anthropic_stream(), media_type="text/event-stream")

        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/messages", messages, methods=["POST"]),
            ]
        )

    @staticmethod
    async def _openai_stream(has_result: bool):
        base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "up"}
        deltas = (
            [{"content": "do"}, {"content": "ne"}]
            if has_result
            else [
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "bash", "arguments": '{"cmd"'},
                        }
                    ]
                },
                {"tool_calls": [{"index": 0, "function": {"arguments": ': "ls"}'}}]},
            ]
        )
        for d in deltas:
            yield (
                "data: "
                + json.dumps({**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]})
                + "\n\n"
            )
        fin = "stop" if has_result else "tool_calls"
        yield (
            "data: "
            + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": fin}]})
            + "\n\n"
        )
        yield "data: [DONE]\n\n"

    @staticmethod
    async def _anthropic_stream():
        msg = {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": "up",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 0},
        }
        events = [
            ("message_start", {"type": "message_start", "message": msg}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "hello up"},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 2},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        for name, data in events:
            yield f"event: {name}\ndata: {json.dumps(data)}\n\n"
            await asyncio.sleep(0)

    def __enter__(self):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )
        self.thread.start()
        while not self.server.started:
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def upstream():
    with FakeUpstream() as up:
        yield up


def _proxy(tmp_path, **upstream) -> tuple[ProxyServer, str]:
    path = tmp_path / "pass.jsonl"
    server = ProxyServer(
        ProxyConfig(), upstream=UpstreamConfig(**upstream), sink=JsonlSink(path)
    ).start()
    return server, path


def test_openai_passthrough_records_text_traces(upstream, tmp_path, bash_tool):
    proxy, path = _proxy(
        tmp_path,
        base_url=upstream.url + "/v1",
        api="openai",
        api_key="up-key",
        model="upstream-model",
    )
    try:
        client = openai.OpenAI(base_url=proxy.openai_base_url("ev"), api_key="client-key")
        msgs = [{"role": "user", "content": "list"}]
        r = client.chat.completions.create(model="mine", messages=msgs, tools=[bash_tool])
        call = r.choices[0].message.tool_calls[0]
        assert call.function.arguments == '{"cmd": "ls"}'
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "a"},
        ]
        stream = client.chat.completions.create(
            model="mine", messages=msgs, tools=[bash_tool], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "done"
    finally:
        proxy.stop()
    headers, body = upstream.seen[0]
    assert headers["authorization"] == "Bearer up-key" and body["model"] == "upstream-model"
    recs = read_jsonl(path)
    assert [(r.api, r.session, r.parent, r.branch) for r in recs] == [
        ("passthrough", "ev", None, "b0"),
        ("passthrough", "ev", 0, "b0"),
    ]
    assert recs[0].extra["tool_calls"] == [{"name": "bash", "arguments": {"cmd": "ls"}}]
    assert recs[0].prompt_ids == [1, 2, 3] and recs[0].output_ids == [7, 8]
    assert recs[1].extra["response_text"] == "done" and recs[1].finish_reason == "stop"


def _stats_of_a_text_only_run(tmp_path, records, capsys):
    """`gyre trajectories stats|export` on a passthrough run whose calls have no token
    ids: counted as text-only calls, kept in the store, left out of the trees."""
    from gyre_env.cli import main
    from gyre_env.trajectory.store import TrajectoryStore

    db = tmp_path / "pass.db"
    with TrajectoryStore(db) as store:
        assert store.ingest_jsonl(records) == 1
    capsys.readouterr()
    assert main(["trajectories", "stats", "--store", str(db), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["calls"] == 1 and stats["text_only_calls"] == 1 and stats["tree_tokens"] == 0
    assert main(["trajectories", "stats", "--store", str(db)]) == 0
    assert "text-only calls 1" in capsys.readouterr().out
    out = tmp_path / "nodes.parquet"
    assert main(["trajectories", "export", "--store", str(db), "--out", str(out),
                 "--kind", "nodes"]) == 0  # fmt: skip


def test_anthropic_passthrough_stream_and_upstream_errors(upstream, tmp_path, capsys):
    proxy, path = _proxy(tmp_path, base_url=upstream.url, api="anthropic", api_key="upstream-key")
    try:
        client = anthropic.Anthropic(base_url=proxy.anthropic_base_url("an"), api_key="k")
        with client.messages.stream(
            model="c", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as s:
            final = s.get_final_message()
        assert final.content[0].text == "hello up"
        r = httpx.post(
            proxy.base_url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        )
        assert (
            r.status_code == 400
            and "forwards anthropic requests only" in r.json()["error"]["message"]
        )
    finally:
        proxy.stop()
    rec = read_jsonl(path)[0]
    assert rec.extra["response_text"] == "hello up" and rec.extra["usage"] == {
        "input_tokens": 11,
        "output_tokens": 2,
    }
    assert (
        rec.finish_reason == "end_turn" and rec.extra["request"]["messages"][0]["content"] == "hi"
    )
    assert rec.prompt_ids == [] and rec.output_ids == []  # this upstream gives text only
    _stats_of_a_text_only_run(tmp_path, path, capsys)

    bad, _ = _proxy(tmp_path, base_url=upstream.url, api="anthropic", api_key="wrong")
    down, _ = _proxy(tmp_path, base_url="http://127.0.0.1:9", api="anthropic")
    try:
        body = {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(bad.base_url + "/v1/messages", json={**body, "stream": True})
        assert r.status_code == 401 and "bad key" in r.text, "upstream errors pass through"
        r = httpx.post(down.base_url + "/v1/messages", json=body)
        assert (
            r.status_code == 502
            and r.json()["type"] == "error"
            and "upstream" in r.json()["error"]["message"]
        )
    finally:
        bad.stop()
        down.stop()
