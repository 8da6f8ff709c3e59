"""Fixtures for agent tests: a model service in front of the tiny model or a scripted engine.

``ScriptedEngine`` (our own engine, real code) answers scripted token ids instantly, so a
test can make a model call tools deterministically; the embedded engine runs the real
(random) tiny model.
"""

from __future__ import annotations

import json

import pytest

from gyre_env.proxy.scripted import ScriptedEngine
from gyre_env.proxy.serving import ModelService, ModelServiceConfig


@pytest.fixture(scope="session")
def tool_call_text():
    """``(name, arguments) -> text`` the tiny model's template parses as one tool call."""

    def text(name: str, arguments: dict) -> str:
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"

    return text


@pytest.fixture
def scripted_service(tmp_path, tok, enc):
    """``start(reply_fn, sinks=())``: a model service whose engine answers
    ``reply_fn(prompt_text)`` (a string, ``<|im_end|>`` appended); ``sinks``: more record
    sinks (a trajectory store), closed with the service."""
    services = []

    def start(reply_fn, sinks=()) -> ModelService:
        def script(prompt_ids, params):
            return enc(reply_fn(tok.decode(prompt_ids)) + "<|im_end|>")

        service = ModelService(
            ModelServiceConfig(records_path=str(tmp_path / "records.jsonl")),
            engines=[ScriptedEngine(script)],
            tokenizer=tok,
            sinks=tuple(sinks),
        ).start()
        services.append(service)
        return service

    yield start
    for service in services:
        service.stop()
