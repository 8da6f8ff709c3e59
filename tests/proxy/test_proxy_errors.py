"""Bad input gets a 400 in the API's own error shape naming what was wrong; nothing
crashes the server; unparseable tool calls come back as text."""

from __future__ import annotations

import httpx
import pytest

from gyre_env.proxy.scripted import ScriptedEngine

OK_OPENAI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
OK_ANTHROPIC = {"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def proxy(start_proxy, enc):
    return start_proxy(
        [ScriptedEngine([enc("fine<|im_end|>")], context_length=4096)], max_request_bytes=200_000
    )


def _openai_error(r: httpx.Response, status: int, *words: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for word in words:
        assert word in err["message"], err
    return err


def _anthropic_error(r: httpx.Response, status: int, *words: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    for word in words:
        assert word in body["error"]["message"], body
    return body["error"]


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{not json", ["not valid JSON"]),
        (b"[1, 2]", ["JSON object"]),
        ({"model": "m"}, ["messages: required"]),
        ({"model": "m", "messages": "hi"}, ["messages: expected an array"]),
        (
            {"model": "m", "messages": [{"role": "user", "content": 5}]},
            ["messages[0].content", "got integer"],
        ),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, ["messages[0].role"]),
        ({**OK_OPENAI, "temperature": "hot"}, ["temperature: expected a number, got string"]),
        ({**OK_OPENAI, "max_tokens": "5"}, ["max_tokens: expected an integer"]),
        ({**OK_OPENAI, "min_p": 1.5}, ["min_p: must be between 0 and 0.999, got 1.5"]),
        ({**OK_OPENAI, "stream": "yes"}, ["stream: expected a boolean"]),
        ({**OK_OPENAI, "tools": {"a": 1}}, ["tools: expected an array"]),
        ({**OK_OPENAI, "n": 2}, ["n: only n=1"]),
        ({**OK_OPENAI, "stop": [1]}, ["stop[0]: expected a string"]),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            },
            ["unsupported content type 'image_url'"],
        ),
    ],
)
def test_openai_bad_requests(proxy, body, words):
    url = proxy.openai_base_url("e") + "/chat/completions"
    r = httpx.post(url, content=body) if isinstance(body, bytes) else httpx.post(url, json=body)
    err = _openai_error(r, 400, *words)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{", ["not valid JSON"]),
        ({"model": "c", "messages": [{"role": "user", "content": "x"}]}, ["max_tokens: required"]),
        ({**OK_ANTHROPIC, "system": 5}, ["system: expected a string or an array"]),
        ({**OK_ANTHROPIC, "thinking": "on"}, ["thinking: expected an object"]),
        (
            {
                **OK_ANTHROPIC,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            ["unsupported content block type 'image'"],
        ),
        (
            {
                **OK_ANTHROPIC,
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "name": "x", "input": "str"}],
                    }
                ],
            },
            ["messages[0].content[0].input: expected an object"],
        ),
        ({**OK_ANTHROPIC, "stop_sequences": "x y"}, ["stop_sequences"]),
    ],
)
def test_anthropic_bad_requests(proxy, body, words):
    url = proxy.anthropic_base_url("e") + "/v1/messages"
    r = httpx.post(url, content=body) if isinstance(body, bytes) else httpx.post(url, json=body)
    assert _anthropic_error(r, 400, *words)["type"] == "invalid_request_error"


def test_prompt_longer_than_context(proxy):
    long = [{"role": "user", "content": "word " * 5000}]
    r = httpx.post(
        proxy.openai_base_url("e") + "/chat/completions", json={"model": "m", "messages": long}
    )
    assert _openai_error(r, 400, "context is 4096 tokens")["code"] == "context_length_exceeded"
    r = httpx.post(
        proxy.anthropic_base_url("e") + "/v1/messages", json={**OK_ANTHROPIC, "messages": long}
    )
    _anthropic_error(r, 400, "context is 4096 tokens")
    r = httpx.post(
        proxy.anthropic_base_url("e") + "/v1/messages",
        json={**OK_ANTHROPIC, "stream": True, "messages": long},
    )
    _anthropic_error(r, 400, "context")  # refused before the stream starts


def test_request_size_limit(proxy):
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 300_000}]}
    _openai_error(
        httpx.post(proxy.openai_base_url("e") + "/chat/completions", json=body), 413, "limit"
    )
    _anthropic_error(httpx.post(proxy.anthropic_base_url("e") + "/v1/messages", json=body), 413)


def test_bearer_token(start_proxy, enc):
    proxy = start_proxy([ScriptedEngine([enc("ok<|im_end|>")])], auth_token="sekret")
    url = proxy.base_url + "/v1/chat/completions"
    _openai_error(httpx.post(url, json=OK_OPENAI), 401, "API key")
    _openai_error(httpx.post(url, json=OK_OPENAI, headers={"authorization": "Bearer nope"}), 401)
    assert (
        httpx.post(url, json=OK_OPENAI, headers={"authorization": "Bearer sekret"}).status_code
        == 200
    )
    r = httpx.post(
        proxy.base_url + "/v1/messages", json=OK_ANTHROPIC, headers={"x-api-key": "sekret:ep-7"}
    )
    assert r.status_code == 200
    assert [rec.session for rec in proxy.records()] == ["default", "ep-7"]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "bash", "arguments": {"cmd": \n</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}',
        "plain <tool_call",
    ],
)
def test_unparseable_tool_calls_come_back_as_text(start_proxy, enc, bash_tool, text):
    proxy = start_proxy([ScriptedEngine([enc(text + "<|im_end|>")])])
    body = {**OK_OPENAI, "tools": [bash_tool]}
    r = httpx.post(proxy.openai_base_url("t") + "/chat/completions", json=body)
    msg = r.json()["choices"][0]["message"]
    assert r.status_code == 200 and msg["content"] == text and not msg.get("tool_calls")
    r = httpx.post(
        proxy.anthropic_base_url("t") + "/v1/messages",
        json={
            **OK_ANTHROPIC,
            "stream": True,
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
        },
    )
    assert r.status_code == 200 and "tool_use" not in r.text and "message_stop" in r.text


class _Broken(ScriptedEngine):
    async def stream(self, prompt_ids, params):
        raise RuntimeError("engine bug")
        yield  # pragma: no cover


def test_engine_bug_is_a_500_in_shape_and_the_server_lives(start_proxy, enc):
    proxy = start_proxy([_Broken([enc("x")])])
    r = httpx.post(proxy.openai_base_url("b") + "/chat/completions", json=OK_OPENAI)
    assert _openai_error(r, 500, "engine bug")["type"] == "server_error"
    r = httpx.post(
        proxy.anthropic_base_url("b") + "/v1/messages", json={**OK_ANTHROPIC, "stream": True}
    )
    assert r.status_code == 200 and "event: error" in r.text and "engine bug" in r.text
    assert httpx.get(proxy.base_url + "/health").json()["status"] == "ok"
    assert proxy.records()[0].finish_reason == "error"


def test_models_health_metrics(proxy):
    assert httpx.get(proxy.openai_base_url("x") + "/models").json()["data"][0]["id"] == "gyre"
    assert (
        httpx.post(proxy.openai_base_url("m1") + "/chat/completions", json=OK_OPENAI).status_code
        == 200
    )
    health = httpx.get(proxy.base_url + "/health").json()
    assert health["replicas"]["scripted"]["paused"] is False
    text = httpx.get(proxy.base_url + "/metrics").text
    assert 'gyre_proxy_session_requests_total{session="m1"} 1' in text
    assert 'gyre_proxy_replica_latency_seconds_count{replica="scripted"} 1' in text
    assert "gyre_proxy_session_queue_wait_seconds_sum" in text
    n = httpx.post(
        proxy.anthropic_base_url("x") + "/v1/messages/count_tokens", json=OK_ANTHROPIC
    ).json()
    assert n["input_tokens"] > 3
    assert httpx.request("DELETE", proxy.base_url + "/s/m1").json()["released"] is True
