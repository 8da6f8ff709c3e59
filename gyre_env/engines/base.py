"""The Engine protocol: token ids in, token ids + logprobs + weight version out.

Engines never see text. The proxy owns tokenization, so training sees exactly the ids
that were sampled. Backends: ``embedded`` (transformers, in-process) and ``sglang``
(HTTP client of an SGLang server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class EngineError(RuntimeError):
    """The engine failed to serve a request (dead replica, bad response)."""


class EnginePausedError(EngineError):
    """The engine is paused or switching role and accepts no new requests right now."""


class ContextLengthError(EngineError, ValueError):
    """The prompt leaves no room for a single new token within the engine's context length."""


@dataclass(kw_only=True)
class SamplingParams:
    """How to sample. Documented fields only; unknown keys are rejected by the proxy."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 disables top-k."""
    min_p: float = 0.0
    """Drop tokens whose probability (after temperature) is below ``min_p`` times the most
    likely token's; 0 disables it. SGLang's and vLLM's ``min_p``."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Generation ends after sampling one of these (it is kept in the output)."""
    seed: int | None = None


@dataclass(kw_only=True)
class GenerateResult:
    """What one generation produced."""

    output_ids: list[int]
    output_logprobs: list[float]
    """Log-probability of each sampled id under the sampling distribution's model."""
    finish_reason: str
    """``stop`` (a stop token) | ``length`` (max_new_tokens or context) | ``abort``."""
    weight_version: int
    prefill_s: float = 0.0
    decode_s: float = 0.0


@dataclass(kw_only=True)
class TokenChunk:
    """One streamed piece of a generation; the last chunk has ``finish_reason`` set."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    weight_version: int = 0
    queued_s: float | None = None
    """On the first chunk, from engines that know: seconds the request waited in the
    engine for a batch slot before its prefill began (None: not reported)."""


@runtime_checkable
class Engine(Protocol):
    """A model replica. All methods are safe to call from the proxy's event loop."""

    name: str
    context_length: int

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult: ...

    def stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]: ...

    async def pause(self) -> None:
        """Stop accepting new requests; in-flight ones finish."""
        ...

    async def resume(self) -> None: ...

    async def release_memory(self) -> None:
        """Free weights/KV cache (GPU memory) so the cell can train; implies pause."""
        ...

    async def resume_memory(self) -> None: ...

    async def update_weights(self, source: object, version: int) -> None:
        """Load new weights (a state dict, a folder path, or a backend-specific handle)."""
        ...

    async def health(self) -> dict: ...

    @property
    def weight_version(self) -> int: ...
