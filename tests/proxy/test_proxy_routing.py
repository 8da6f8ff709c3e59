"""Routing over replicas: least-loaded with session affinity, waiting (with keep-alive
pings) while all replicas are paused, no request lost across pause/resume, and a replica
that dies mid-request continued on another (or a clear 503)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time

import httpx
import pytest

from gyre_env.proxy.scripted import ScriptedEngine

OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _continuing(reply: list[int]):
    """A script that continues ``reply`` after whatever part of it ends the prompt."""

    def script(prompt, params):
        done = max(
            (k for k in range(len(reply) + 1) if k == 0 or prompt[-k:] == reply[:k]), default=0
        )
        return reply[done:]

    return script


def _post(url: str, body: dict = OK, **kw) -> httpx.Response:
    return httpx.post(url + "/chat/completions", json=body, timeout=30, **kw)


class _Gated(ScriptedEngine):
    """Holds every call until ``gate[0]`` calls have arrived (over all replicas), so the
    calls are all in flight at once however slowly a loaded machine sends them."""

    def __init__(self, *a, gate: list[int], **kw):
        super().__init__(*a, **kw)
        self.gate = gate

    async def stream(self, prompt_ids, params):
        self.gate[1] += 1
        deadline = time.monotonic() + 20
        while self.gate[1] < self.gate[0] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        async for chunk in super().stream(prompt_ids, params):
            yield chunk


def test_least_loaded_with_session_affinity(start_proxy, enc):
    reply = enc("ok<|im_end|>")
    gate = [4, 0]  # [calls to wait for, calls arrived]
    a = _Gated([reply], name="a", gate=gate)
    b = _Gated([reply], name="b", gate=gate)
    proxy = start_proxy([a, b], affinity_slack=0)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda s: _post(proxy.openai_base_url(f"s{s}")), range(4)))
    assert len(a.prompts) == 2 and len(b.prompts) == 2, "concurrent calls spread over replicas"
    gate[0] = 0
    for _ in range(3):
        _post(proxy.openai_base_url("sticky"))
    sticky = [r.replica for r in proxy.records() if r.session == "sticky"]
    assert len(set(sticky)) == 1, "an idle session stays on its replica"


def test_all_paused_requests_wait_with_pings_and_none_is_lost(start_proxy, enc):
    engine = ScriptedEngine([enc("back<|im_end|>")])
    proxy = start_proxy([engine], ping_interval_s=0.1, probe_interval_s=0.05)
    proxy.call(proxy.core.router.pause())
    stream_body = {
        "model": "c",
        "max_tokens": 20,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streamed = pool.submit(
            httpx.post, proxy.anthropic_base_url("w") + "/v1/messages", json=stream_body, timeout=30
        )
        plain = [pool.submit(_post, proxy.openai_base_url(f"p{k}")) for k in range(6)]
        try:
            deadline = time.monotonic() + 30
            while proxy.core.router.waiting < 7 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert proxy.core.router.waiting == 7
            # a waiting call leaves the count for an instant each time the replica probe
            # wakes it to look again: the gauge reads 7 on one of a few reads
            reads = [httpx.get(proxy.base_url + "/metrics").text for _ in range(10)]
            assert any("gyre_proxy_waiting_calls 7" in r for r in reads)
            time.sleep(0.5)
            assert not streamed.done() and not any(f.done() for f in plain)
        finally:  # a failed check must not leave the pinged stream waiting forever
            proxy.call(proxy.core.router.resume())
        text = streamed.result().text
        results = [f.result() for f in plain]
    assert text.count("event: ping") >= 3 and text.index("event: ping") < text.index(
        "content_block_start"
    )
    assert '"text":"back"' in text and "message_stop" in text
    assert all(
        r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "back"
        for r in results
    )
    recs = proxy.records()
    assert len(recs) == 7 and all(
        r.finish_reason == "stop" and r.timings["queue"] > 0.5 for r in recs
    )


def test_engine_paused_directly_is_probed_until_it_resumes(start_proxy, enc):
    engine = ScriptedEngine([enc("ok<|im_end|>")])
    proxy = start_proxy([engine], probe_interval_s=0.05)
    asyncio.run(engine.pause())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_post, proxy.openai_base_url("d"))
        time.sleep(0.3)
        assert not future.done()
        asyncio.run(engine.resume())
        assert future.result().status_code == 200


def test_wait_is_bounded(start_proxy, enc):
    proxy = start_proxy([ScriptedEngine([enc("ok<|im_end|>")])], wait_timeout_s=0.3)
    proxy.call(proxy.core.router.pause())
    r = _post(proxy.openai_base_url("t"))
    assert (
        r.status_code == 503 and "no replica accepted within 0.3s" in r.json()["error"]["message"]
    )
    r = httpx.post(proxy.anthropic_base_url("t") + "/v1/messages", json={**OK, "max_tokens": 5})
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("stream", [False, True])
def test_replica_dying_mid_request_continues_elsewhere(start_proxy, enc, stream):
    reply = enc("one two three four five<|im_end|>")
    a = ScriptedEngine(_continuing(reply), name="a", chunk_size=1)
    b = ScriptedEngine(_continuing(reply), name="b", chunk_size=1)
    proxy = start_proxy([a, b])
    a.fail_next(after_tokens=3)  # both idle: the first replica, a, is chosen
    r = _post(proxy.openai_base_url("die"), {**OK, "stream": stream})
    assert r.status_code == 200
    if stream:
        lines = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in lines if c["choices"])
    else:
        text = r.json()["choices"][0]["message"]["content"]
    assert text == "one two three four five"
    rec = proxy.records()[0]
    assert rec.replica == "a,b" and rec.output_ids == reply and rec.finish_reason == "stop"
    assert rec.extra["retries"] == [
        {"replica": "a", "error": "a died mid-request", "after_tokens": 3}
    ]
    assert b.prompts[0] == rec.prompt_ids + reply[:3]


def test_only_replica_dying_is_a_clear_503(start_proxy, enc):
    engine = ScriptedEngine([enc("a b c<|im_end|>")], chunk_size=1)
    proxy = start_proxy([engine], replica_down_s=1.5)  # long enough for a loaded machine
    engine.fail_next(after_tokens=1)
    r = _post(proxy.openai_base_url("x"))
    assert r.status_code == 503 and "every replica failed" in r.json()["error"]["message"]
    assert "scripted died mid-request" in r.json()["error"]["message"]
    # while it is marked down, calls fail fast (streaming: an error event)
    r = httpx.post(
        proxy.anthropic_base_url("x") + "/v1/messages", json={**OK, "max_tokens": 5, "stream": True}
    )
    assert "event: error" in r.text and "every replica failed" in r.text
    time.sleep(1.6)
    assert _post(proxy.openai_base_url("x")).status_code == 200, "tried again after replica_down_s"
    recs = proxy.records()
    assert [rec.finish_reason for rec in recs] == ["error", "error", "stop"]
    assert (
        recs[0].extra["retries"][0]["replica"] == "scripted"
        and recs[0].output_ids == recs[2].output_ids[:1]
    )


def test_long_first_call_does_not_stall_other_sessions(start_proxy, enc):
    """Tokenizing a ~200k-character first prompt runs off the event loop."""
    proxy = start_proxy([ScriptedEngine([enc("ok<|im_end|>")])], verify_render=False)
    long = {"model": "m", "messages": [{"role": "user", "content": "many words here. " * 12000}]}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(_post, proxy.openai_base_url("long"), long)
        while proxy.core.sessions._sessions.get("long") is None:
            time.sleep(0.005)
        t0 = time.monotonic()
        quick = _post(proxy.openai_base_url("short"))
        quick_s = time.monotonic() - t0
        assert quick.status_code == 200 and not slow.done(), "the short call finished first"
        assert slow.result().status_code == 200
    assert quick_s < 0.5


def test_streams_get_pings_during_a_slow_prefill(start_proxy, enc):
    """A replica that takes long for its first token (a 32k prefill on CPU takes ~40 s)."""
    engine = ScriptedEngine([enc("late<|im_end|>")], delay_s=0.45)
    proxy = start_proxy([engine], ping_interval_s=0.1)
    body = {
        "model": "c",
        "max_tokens": 20,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    text = httpx.post(proxy.anthropic_base_url("slow") + "/v1/messages", json=body, timeout=30).text
    assert text.count("event: ping") >= 3 and text.index("event: ping") < text.index(
        "content_block_start"
    )
    assert '"text":"late"' in text and text.rstrip().endswith('data: {"type":"message_stop"}')
    assert proxy.records()[0].timings["queue"] < 0.05, "it was not waiting for a replica"
