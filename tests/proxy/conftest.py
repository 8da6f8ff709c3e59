"""Fixtures for proxy tests (``start_proxy``, a proxy started in-process, is in
``tests/conftest.py``: the security tests use it too).

The engine in most tests is ``ScriptedEngine`` (our own, real code: it answers scripted ids
instantly) so that tool calls, UTF-8 splits and stop strings happen deterministically;
tests of the real model use the embedded engine.
"""

from __future__ import annotations

import pytest

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
