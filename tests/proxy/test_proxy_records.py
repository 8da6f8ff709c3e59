"""Records leave the proxy off its event loop: a hanging sink stalls no other request, a
client that has its answer finds the record written, and stop() writes everything."""

from __future__ import annotations

import asyncio
import threading

import httpx

from gyre_env.proxy.scripted import ScriptedEngine
from gyre_env.proxy.server import ProxyConfig, ProxyServer
from gyre_env.trajectory.records import RecordWriter


class _WatchedSink:
    """Notes where each write runs; ``gate`` holds writes back until set."""

    def __init__(self):
        self.records, self.on_loop, self.closed = [], [], False
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()

    def write(self, record):
        try:
            asyncio.get_running_loop()
            self.on_loop.append(True)
        except RuntimeError:
            self.on_loop.append(False)
        self.entered.set()
        self.gate.wait(30)
        self.records.append(record)

    def close(self):
        self.closed = True


def _ask(url: str, text: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return httpx.post(url + "/chat/completions", json=body, timeout=30)


def test_records_are_written_off_the_loop_before_the_answer(tok, enc):
    sink = _WatchedSink()
    engine = ScriptedEngine([enc("one<|im_end|>"), enc("two<|im_end|>")])
    proxy = ProxyServer(ProxyConfig(), engines=[engine], tokenizer=tok, sink=sink).start()
    try:
        assert isinstance(proxy.sink, RecordWriter) and proxy.core.sink is proxy.sink
        assert _ask(proxy.openai_base_url("a"), "hi").status_code == 200
        assert [r.session for r in sink.records] == ["a"]  # written before the answer came
        sink.gate.clear()
        sink.entered.clear()
        answer: list = []
        slow = threading.Thread(
            target=lambda: answer.append(_ask(proxy.openai_base_url("b"), "hi"))
        )
        slow.start()
        assert sink.entered.wait(30)  # b's record is being written, and hangs
        health = httpx.get(f"{proxy.base_url}/health", timeout=10)  # the loop still serves
        assert health.status_code == 200 and not answer
        sink.gate.set()
        slow.join(30)
        assert answer[0].status_code == 200 and [r.session for r in sink.records] == ["a", "b"]
    finally:
        proxy.stop()
    assert sink.on_loop == [False, False] and sink.closed
