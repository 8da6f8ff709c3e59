"""Lazy imports of optional extras with an error that names the install command."""

from __future__ import annotations

import importlib
from types import ModuleType

# module (top-level import name) -> extra that provides it
_EXTRA_OF = {
    "docker": "docker",
    "torch": "train",
    "transformers": "train",
    "tokenizers": "train",
    "fastapi": "proxy",
    "uvicorn": "proxy",
    "httpx": "proxy",
    "langgraph": "langgraph",
    "langchain_openai": "langgraph",
    "langchain_core": "langgraph",
    "ray": "ray",
    "megatron": "megatron",
    "mooncake": "mooncake",
    "sglang": "sglang",
    "pyarrow": "store",
    "matplotlib": "plots",
    "tensorboard": "train",
    "minisweagent": "mini-swe-agent",
    "litellm": "mini-swe-agent",
    "crewai": "crewai",
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the `pip install` that fixes it."""


def install_hint(module: str) -> str:
    extra = _EXTRA_OF.get(module.split(".")[0])
    if extra is None:
        return f"pip install {module.split('.')[0]}"
    return f"pip install 'gyre-env[{extra}]'"


def require(module: str, purpose: str = "") -> ModuleType:
    """Import `module` or raise MissingExtraError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        what = f" (needed for {purpose})" if purpose else ""
        raise MissingExtraError(
            f"{module!r} is not installed{what}. Install it with: {install_hint(module)}"
        ) from e
