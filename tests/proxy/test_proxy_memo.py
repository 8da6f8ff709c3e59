"""Reusing the conversion of a session's earlier messages (``ConversionMemo``) and their
keys: an agent's next turn converts only its new messages, and an edited history is never
taken for a repeated one, even where Python's ``==`` is loose (``1 == 1.0 == True``)."""

from __future__ import annotations

import copy

import httpx

from gyre_env.proxy import anthropic_api, openai_api
from gyre_env.proxy.chat import ConversionMemo
from gyre_env.proxy.scripted import ScriptedEngine


def _call(name: str, args) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}


def _history() -> list[dict]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "", "tool_calls": [_call("bash", {"cmd": "ls", "n": 1})]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
    ]


def _parse(messages: list[dict], memo: ConversionMemo | None) -> list[dict]:
    body = {"model": "m", "messages": copy.deepcopy(messages)}  # fresh objects, as a new body
    return openai_api.parse_request(body, memo).messages


def test_a_repeated_history_reuses_the_converted_messages():
    memo = ConversionMemo()
    first = _parse(_history(), memo)
    longer = _history() + [
        {"role": "assistant", "content": "two files"},
        {"role": "user", "content": "and now?"},
    ]
    second = _parse(longer, memo)
    assert second == _parse(longer, None)
    assert all(a is b for a, b in zip(first, second, strict=False))  # the same objects
    assert len(second) == len(first) + 2


def test_an_edited_history_is_converted_anew():
    memo = ConversionMemo()
    first = _parse(_history(), memo)
    edited = _history()
    edited[1]["content"] = "list the filez"  # same length, one byte differs
    again = _parse(edited + [{"role": "user", "content": "go"}], memo)
    assert again[1]["content"] == "list the filez"
    assert not any(a is b for a, b in zip(first, again, strict=False))


def test_numbers_and_booleans_are_compared_exactly():
    """``{"n": 1}`` and ``{"n": True}`` or ``{"n": 1.0}`` are equal to Python but render
    differently: a history that changed one of them is not a repeat."""
    for value in (True, 1.0):
        memo = ConversionMemo()
        _parse(_history(), memo)
        edited = _history()
        edited[2]["tool_calls"][0]["function"]["arguments"]["n"] = value
        again = _parse(edited, memo)
        args = again[2]["tool_calls"][0]["function"]["arguments"]
        assert type(args["n"]) is type(value)


def test_anthropic_system_and_blocks_are_reused():
    memo = ConversionMemo()
    body = {
        "model": "c",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": "fix it"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"n": 2}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
    }
    first = anthropic_api.parse_request(copy.deepcopy(body), memo).messages
    body["messages"].append({"role": "assistant", "content": "done"})
    second = anthropic_api.parse_request(copy.deepcopy(body), memo).messages
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "assistant"]
    assert all(a is b for a, b in zip(first, second, strict=False))
    body["system"][0]["text"] = "You are Claude Codf."
    third = anthropic_api.parse_request(copy.deepcopy(body), memo).messages
    assert third[0]["content"] == "You are Claude Codf."
    assert third[1] is not first[1]


def test_an_edited_history_never_extends_a_call(start_proxy, enc):
    """Through the server: the memo's fast path keeps extensions on their branch and
    sends a history edited in place (same length, or a number turned boolean) to a new
    branch, tokenized whole."""
    engine = ScriptedEngine([enc("ok<|im_end|>")])
    proxy = start_proxy([engine])
    url = proxy.openai_base_url("memo") + "/chat/completions"

    def post(messages: list[dict]) -> dict:
        r = httpx.post(url, json={"model": "m", "messages": messages}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]

    msgs = _history()
    reply = post(msgs)
    msgs += [reply, {"role": "user", "content": "next"}]
    post(msgs)  # extends call 0
    edited = copy.deepcopy(msgs)
    edited[1]["content"] = "list the filez"
    post(edited)
    numeric = copy.deepcopy(msgs)
    numeric[2]["tool_calls"][0]["function"]["arguments"]["n"] = True
    post(numeric)
    post(msgs)  # the unedited history again: the same prompt as call 1 (a repeat)
    records = proxy.records()
    assert [r.parent for r in records] == [None, 0, None, None, 0]
    assert records[1].prefix_len > 0 and records[2].prefix_len == 0
    assert len({r.branch for r in records[1:4]}) == 3
    assert records[4].prompt_ids == records[1].prompt_ids
    assert records[2].prompt_ids != records[1].prompt_ids
    assert records[3].prompt_ids != records[1].prompt_ids
    assert proxy.core.metrics.render_mismatches == 0


def test_a_side_conversation_does_not_evict_the_main_one():
    memo = ConversionMemo()
    first = _parse(_history(), memo)
    _parse([{"role": "user", "content": "a title for this chat?"}], memo)
    again = _parse(_history() + [{"role": "user", "content": "go on"}], memo)
    assert all(a is b for a, b in zip(first, again, strict=False))
