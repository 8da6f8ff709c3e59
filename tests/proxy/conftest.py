"""Fixtures for proxy tests (``start_proxy``, a proxy started in-process, is in
``tests/conftest.py``: the security tests use it too).

The engine in most tests is ``ScriptedEngine`` (our own, real code: it answers scripted ids
instantly) so that tool calls, UTF-8 splits and stop strings happen deterministically;
tests of the real model use the embedded engine.
"""

from __future__ import annotations

import pytest

from gyre_env.proxy.scripted import ScriptedEngine

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    },
}


@pytest.fixture
def bash_tool() -> dict:
    return BASH_TOOL


@pytest.fixture
def scripted(enc):
    """An engine that answers a ``bash`` tool call (``ls -la``, after "Let me look."), then,
    once a tool result is in the prompt, plain text."""
    tool_response = enc("<tool_response>")[0]
    call = enc(
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n'
        "</tool_call><|im_end|>"
    )
    done = enc("There are 3 files.<|im_end|>")
    return ScriptedEngine(
        lambda prompt, params: done if tool_response in prompt else call, chunk_size=3
    )


@pytest.fixture(scope="module")
def embedded():
    """The embedded engine on the built-in tiny model (loaded once per test module)."""
    from gyre_env.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(max_batch_size=4)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def byte_ids(tok):
    """``byte_ids(data)``: one token per byte (the byte-level alphabet), as a sampler may
    produce them; a multi-byte character comes out split across tokens."""
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    char = dict(zip(bs, (chr(c) for c in cs), strict=True))

    def ids(data: bytes) -> list[int]:
        return [tok.convert_tokens_to_ids(char[b]) for b in data]

    return ids
