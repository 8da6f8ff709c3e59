"""Rendering and parsing pieces: tool-call parsing (whole and streamed), incremental
detokenization of split UTF-8, stop strings, the constant-cost suffix rendering and the
tokenized-piece cache, each against the plain computation they replace."""

from __future__ import annotations

import random

import pytest

from gyre_env.proxy.render import (
    ChatRenderer,
    IncrementalDecoder,
    StopStringMatcher,
    ToolCall,
    ToolCallParser,
    parse_tool_call,
    split_output,
)
from gyre_env.proxy.sessions import _exact_delta


@pytest.fixture(scope="module")
def renderer(tok):
    return ChatRenderer(tok)


def _stream(parser: ToolCallParser, text: str, step: int) -> list:
    out = []
    for i in range(0, len(text), step):
        out += parser.push(text[i : i + step])
    return out + parser.flush()


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_tool_calls_parse_the_same_streamed_or_whole(step):
    text = (
        'Sure.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls <x>"}}\n</tool_call>\n'
        '<tool_call>{"name": "read", "arguments": "{\\"path\\": \\"a\\"}"}</tool_call> bye <tool_ca'
    )
    text_out, calls = split_output(_stream(ToolCallParser(), text, step))
    assert [(c.name, c.arguments) for c in calls] == [
        ("bash", {"cmd": "ls <x>"}),
        ("read", {"path": "a"}),
    ]
    assert text_out == "Sure.\n\n bye <tool_ca"


@pytest.mark.parametrize(
    "body",
    [
        '{"name": 3}',
        "not json",
        '{"name": "x", "arguments": [1]}',
        "[]",
        '{"name": "x", "arguments": "{bad"}',
    ],
)
def test_invalid_tool_call_bodies_are_rejected(body):
    assert parse_tool_call(body) is None
    pieces = _stream(ToolCallParser(), f"a<tool_call>{body}</tool_call>b", 2)
    assert "".join(p for p in pieces if isinstance(p, str)) == f"a<tool_call>{body}</tool_call>b"
    assert not any(isinstance(p, ToolCall) for p in pieces)


def test_parser_disabled_passes_text_through():
    text = '<tool_call>{"name": "x", "arguments": {}}</tool_call>'
    assert "".join(_stream(ToolCallParser(enabled=False), text, 4)) == text


def test_incremental_decoder_holds_split_characters(renderer, tok, byte_ids):
    text = "naïve 😀 世界 done"
    ids = byte_ids(text.encode())  # one id per byte: every multi-byte character is split
    dec = IncrementalDecoder(renderer)
    pieces = [dec.push([i]) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces), "no half character is ever emitted"
    end = renderer.stop_token_ids[0]
    dec = IncrementalDecoder(renderer)
    canonical = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert dec.push([*canonical, end]) + dec.flush() == text, "stop tokens are not shown"


def test_stop_strings_across_pieces():
    m = StopStringMatcher(["STOP", "\nObs"])
    out = "".join(m.push(p) for p in ["ab", "cST", "O", "Pxyz"]) + m.flush()
    assert out == "abc" and m.matched == "STOP"
    m = StopStringMatcher(["END"])
    assert "".join(m.push(p) for p in ["E", "N", "x"]) + m.flush() == "ENx" and m.matched is None


CONVERSATIONS = [
    [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": {"cmd": "ls"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "a"},
        {"role": "tool", "tool_call_id": "2", "content": "b"},
    ],
    [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "system", "content": "mid-conversation note"},
        {"role": "user", "content": "more 😀"},
    ],
    [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "t", "reasoning_content": "hmm"},
        {"role": "user", "content": "v"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("with_tools", [True, False])
def test_suffix_rendering_matches_full_render(renderer, messages, with_tools, bash_tool):
    tools = [bash_tool] if with_tools else None
    i = max(k for k, m in enumerate(messages) if m["role"] == "assistant") + 1
    head = [m for m in messages[:1] if m["role"] == "system"]
    delta = renderer.render_delta(head, messages[i - 1], messages[i:], tools)
    assert delta == _exact_delta(renderer, messages, i, tools)
    assert renderer.render(messages, tools).endswith(delta)


def test_piece_cache_encodes_like_the_tokenizer(renderer):
    assert renderer._pieces is not None
    rng = random.Random(0)
    alphabet = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<tool_call>",
        "\n",
        " ",
        "a",
        "ab",
        "é",
        "😀",
        "世",
        "  ",
        "user",
        "system\n",
        "{",
        '"',
    ]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        assert renderer.encode(text) == renderer._encode_raw(text), text
