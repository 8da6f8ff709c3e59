"""BodyMemo: a session's next request body is parsed from where the last one's messages
ended, and gives exactly what parsing it whole gives (or the same error)."""

from __future__ import annotations

import json

import orjson
import pytest

from gyre_env.proxy.bodies import MIN_BYTES, BodyMemo


def _body(messages: list[dict], **extra) -> dict:
    return {"model": "m", "messages": messages, **extra}


def _history() -> list[dict]:
    big = "héllo wörld " * (MIN_BYTES // 10)  # non-ASCII: byte and character offsets differ
    return [
        {"role": "system", "content": big},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "n": 1.0}]},
    ]


@pytest.mark.parametrize("indent", [None, 2])
def test_an_extended_body_reuses_the_earlier_messages(indent):
    memo = BodyMemo()
    msgs = _history()
    first = memo.loads(json.dumps(_body(msgs), indent=indent).encode())
    msgs += [{"role": "user", "content": "ünd now"}, {"role": "assistant", "content": "ok"}]
    raw = json.dumps(_body(msgs, stream=True, tools=[{"a": [1]}]), indent=indent).encode()
    second = memo.loads(raw)
    assert second == orjson.loads(raw)
    assert all(a is b for a, b in zip(first["messages"], second["messages"], strict=False))
    msgs.append({"role": "user", "content": "again"})
    raw = json.dumps(_body(msgs), indent=indent).encode()
    third = memo.loads(raw)
    assert third == orjson.loads(raw) and third["messages"][3] is second["messages"][3]
    assert memo.loads(raw) == third  # the same body again: no new messages


def test_an_edited_body_is_parsed_whole():
    memo = BodyMemo()
    msgs = _history()
    first = memo.loads(json.dumps(_body(msgs)).encode())
    msgs[1]["content"] = "list filez"
    msgs.append({"role": "user", "content": "go"})
    raw = json.dumps(_body(msgs)).encode()
    again = memo.loads(raw)
    assert again == orjson.loads(raw)
    assert again["messages"][1]["content"] == "list filez"
    assert again["messages"][0] is not first["messages"][0]


@pytest.mark.parametrize(
    "tail",
    [
        b', {"role": "user", "content": "x"},]}',  # trailing comma
        b', {"role": "user", "content": NaN}]}',  # not JSON (orjson rejects NaN)
        b', {"role": "user"}], "messages": []}',  # a second messages member wins
        b', {"role": "user"}]} trailing',
        b', {"role": "user", "content": "\xff"}]}',  # invalid UTF-8
        b', {"role": "user"}], "model": "other"}',  # a later duplicate member wins
        b"]}",
    ],
)
def test_odd_tails_give_what_a_whole_parse_gives(tail):
    memo = BodyMemo()
    raw = json.dumps(_body(_history())).encode()
    memo.loads(raw)
    new = raw[: raw.rindex(b"]")] + tail
    try:
        want = orjson.loads(new)
    except ValueError:
        with pytest.raises(ValueError):
            memo.loads(new)
    else:
        assert memo.loads(new) == want


def test_small_and_unusual_bodies_are_not_remembered():
    memo = BodyMemo()
    memo.loads(json.dumps(_body([{"role": "user", "content": "hi"}])).encode())
    assert memo.entries == []
    raw = b'{"model": "a", "model": "b", "messages": ' + json.dumps(_history()).encode() + b"}"
    memo.loads(raw)
    assert memo.entries == []  # duplicate members
    assert memo.loads(b"[1, 2]") == [1, 2]


def test_a_side_call_does_not_evict_the_main_conversation():
    memo = BodyMemo()
    main, side = _history(), _history()
    side[1]["content"] = "a sub-agent's task"
    first = memo.loads(json.dumps(_body(main)).encode())
    memo.loads(json.dumps(_body(side)).encode())
    memo.loads(json.dumps(_body([{"role": "user", "content": "title?"}])).encode())  # small
    main.append({"role": "user", "content": "go on"})
    raw = json.dumps(_body(main)).encode()
    again = memo.loads(raw)
    assert again == orjson.loads(raw) and again["messages"][0] is first["messages"][0]
