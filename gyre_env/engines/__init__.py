"""Model engines behind the proxy: token ids in, token ids + logprobs + weight version out.

``base`` holds the Engine protocol; ``embedded`` (transformers, in-process) and ``sglang``
(HTTP client of an SGLang server) implement it; ``tiny`` makes the built-in tiny model.
Names are imported lazily so that ``import gyre_env.engines`` does not import torch.
"""

from __future__ import annotations

import importlib

from gyre_env.engines.base import (
    ContextLengthError,
    Engine,
    EngineError,
    EnginePausedError,
    GenerateResult,
    SamplingParams,
    TokenChunk,
)

_LAZY = {
    "EmbeddedEngine": "gyre_env.engines.embedded",
    "EmbeddedEngineConfig": "gyre_env.engines.embedded",
    "SGLangEngine": "gyre_env.engines.sglang",
    "SGLangEngineConfig": "gyre_env.engines.sglang",
    "tiny_model_path": "gyre_env.engines.tiny",
    "load_tokenizer": "gyre_env.engines.tiny",
}

__all__ = [
    "ContextLengthError",
    "Engine",
    "EngineError",
    "EnginePausedError",
    "GenerateResult",
    "SamplingParams",
    "TokenChunk",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gyre_env.engines' has no attribute {name!r}")
