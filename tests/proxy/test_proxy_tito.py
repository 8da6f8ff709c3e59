"""TITO: a session's records reproduce exactly the ids that were sampled.

Scripted engine (deterministic ids, including a multi-byte character split across byte
tokens in a way the tokenizer would never produce) for exactness; the embedded engine
(the real tiny model, sampling) for the same property with real generations.
"""

from __future__ import annotations

import time

import httpx

from gyre_env.proxy.scripted import ScriptedEngine


def _post(url: str, body: dict) -> dict:
    r = httpx.post(url + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _check_chain(records, prompts):
    """Every call's prompt is what the engine got, and extends its parent's ids exactly."""
    assert [r.prompt_ids for r in records] == prompts
    for prev, cur in zip(records, records[1:], strict=False):
        assert cur.parent == prev.call_index and cur.branch == prev.branch
        ids = prev.prompt_ids + prev.output_ids
        assert cur.prefix_len == len(ids)
        assert cur.prompt_ids[: len(ids)] == ids


def test_records_reproduce_sampled_ids_across_tools_utf8_and_stops(
    start_proxy, tok, enc, bash_tool, byte_ids
):
    BASH_TOOL = bash_tool
    emoji = byte_ids("😀".encode())
    assert emoji != enc("😀"), "the split must differ from the tokenizer's own"
    call = enc('<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>')
    text = enc("I see ") + emoji + enc(" files.<|im_end|>")
    stopped = enc("alpha STOP beta gamma<|im_end|>")
    bye = enc("bye<|im_end|>")
    engine = ScriptedEngine([call, text, stopped, bye], chunk_size=1)
    proxy = start_proxy([engine])
    url = proxy.openai_base_url("ep")
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "list"}]

    r1 = _post(url, {"model": "m", "messages": msgs, "tools": [BASH_TOOL]})
    tc = r1["choices"][0]["message"]["tool_calls"][0]
    assert r1["choices"][0]["finish_reason"] == "tool_calls" and tc["function"]["name"] == "bash"
    msgs += [
        r1["choices"][0]["message"],
        {"role": "tool", "tool_call_id": tc["id"], "content": "a.txt b.txt"},
    ]

    r2 = _post(url, {"model": "m", "messages": msgs, "tools": [BASH_TOOL]})
    assert r2["choices"][0]["message"]["content"] == "I see 😀 files."
    msgs += [r2["choices"][0]["message"], {"role": "user", "content": "go on"}]

    r3 = _post(url, {"model": "m", "messages": msgs, "tools": [BASH_TOOL], "stop": ["STOP"]})
    assert r3["choices"][0]["message"]["content"] == "alpha "
    assert r3["choices"][0]["finish_reason"] == "stop"
    msgs += [r3["choices"][0]["message"], {"role": "user", "content": "and?"}]

    r4 = _post(url, {"model": "m", "messages": msgs, "tools": [BASH_TOOL]})
    assert r4["usage"]["prompt_tokens"] == len(engine.prompts[3])

    recs = proxy.records()
    assert len(recs) == 4
    _check_chain(recs, engine.prompts)
    assert recs[0].prompt_ids == enc(
        tok.apply_chat_template(
            msgs[:2], tools=[BASH_TOOL], tokenize=False, add_generation_prompt=True
        )
    )
    assert recs[0].output_ids == call and recs[1].output_ids == text and recs[3].output_ids == bye
    # the stop string ends generation at the token completing it; those sampled ids stay
    k = next(k for k in range(1, len(stopped) + 1) if "STOP" in tok.decode(stopped[:k]))
    assert recs[2].output_ids == stopped[:k] and recs[2].extra["stop_sequence"] == "STOP"
    assert [r.finish_reason for r in recs] == ["tool_calls", "stop", "stop", "stop"]
    assert all(len(r.output_logprobs) == len(r.output_ids) for r in recs)
    # the split emoji is in every later prompt verbatim, never re-tokenized
    for r in recs[2:]:
        assert _contains(r.prompt_ids, emoji)
    assert proxy.core.metrics.render_mismatches == 0


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_length_cut_reply_gets_the_turn_closed(start_proxy, enc):
    engine = ScriptedEngine([enc("a long answer that goes on"), enc("ok<|im_end|>")])
    proxy = start_proxy([engine])
    url = proxy.openai_base_url("cut")
    msgs = [{"role": "user", "content": "talk"}]
    r1 = _post(url, {"model": "m", "messages": msgs, "max_tokens": 3})
    assert r1["choices"][0]["finish_reason"] == "length"
    msgs += [r1["choices"][0]["message"], {"role": "user", "content": "more"}]
    _post(url, {"model": "m", "messages": msgs})
    recs = proxy.records()
    _check_chain(recs, engine.prompts)
    after = recs[1].prompt_ids[recs[1].prefix_len :]
    assert after[:2] == enc("<|im_end|>\n"), "the closing the model did not sample is added"


def test_real_model_records_chain_exactly(start_proxy, embedded, bash_tool):
    """The tiny random model samples freely (temperature 1); each next prompt starts with
    exactly the previous prompt and the ids it sampled."""
    proxy = start_proxy([embedded])
    url = proxy.openai_base_url("real")
    msgs = [{"role": "user", "content": "héllo 世界, write code"}]
    for turn in range(3):
        r = _post(
            url,
            {"model": "m", "messages": msgs, "max_tokens": 24, "seed": turn, "tools": [bash_tool]},
        )
        msg = r["choices"][0]["message"]
        msgs += [msg, {"role": "user", "content": f"turn {turn} 🚀"}]
    recs = proxy.records()
    assert len(recs) == 3
    for prev, cur in zip(recs, recs[1:], strict=False):
        ids = prev.prompt_ids + prev.output_ids
        assert cur.parent == prev.call_index and cur.prompt_ids[: len(ids)] == ids
    assert all(r.weight_version == embedded.weight_version for r in recs)
    assert all(len(r.output_logprobs) == len(r.output_ids) > 0 for r in recs)
    assert all(lp <= 0.0 for r in recs for lp in r.output_logprobs)


def test_stop_string_aborts_the_engine_generation(start_proxy, enc):
    """The engine's stream is closed at the stop string, not drained to the end."""
    reply = enc("alpha STOP " + "word " * 60 + "<|im_end|>")
    engine = ScriptedEngine([reply], chunk_size=1, delay_s=0.02)
    proxy = start_proxy([engine])
    t0 = time.monotonic()
    r = _post(
        proxy.openai_base_url("stop"),
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["STOP"]},
    )
    assert r["choices"][0]["message"]["content"] == "alpha "
    assert time.monotonic() - t0 < 0.02 * len(reply) / 2 and engine.inflight == 0
    assert len(proxy.records()[0].output_ids) < 12 < len(reply)
