"""Shared fixtures of the engine tests (the tiny model: ``tiny_path`` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def engine(tiny_path):
    """A shared engine for tests that do not change its weights or pause it."""
    from gyre_env.engines.embedded import EmbeddedEngine

    eng = EmbeddedEngine(model_path=str(tiny_path), max_batch_size=8)
    yield eng
    eng.close()


@pytest.fixture
def prompts(tokenizer):
    """Eight chat prompts of different lengths."""
    out = []
    for i in range(8):
        messages = [{"role": "user", "content": f"Task {i}: " + "fix the failing test. " * (i + 1)}]
        out.append(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)[
                "input_ids"
            ]
        )
    return out
