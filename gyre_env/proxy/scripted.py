"""An engine that answers instantly from a script of token ids.

For proxy tests and benchmarks: it implements the Engine protocol with no model, so a test
can drive an agent into a tool call deterministically, measure the proxy's own overhead,
pause it, or make it die mid-request. Its logprobs are 0.0 (a script is deterministic).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from gyre_env.engines.base import (
    EngineError,
    EnginePausedError,
    GenerateResult,
    SamplingParams,
    TokenChunk,
)

Script = Callable[[list[int], SamplingParams], list[int]]


class ScriptedEngine:
    """Replies with scripted ids: ``replies`` is a callable ``(prompt_ids, params) -> ids``
    or a list of id lists used in turn (the last one repeats). ``chunk_size`` ids per
    streamed chunk (0: all in one), ``delay_s`` before each chunk."""

    def __init__(
        self,
        replies: Script | list[list[int]],
        *,
        name: str = "scripted",
        context_length: int = 131072,
        chunk_size: int = 0,
        delay_s: float = 0.0,
        weight_version: int = 0,
        record_prompts: bool = True,
    ):
        self.name = name
        self.context_length = context_length
        self.chunk_size = chunk_size
        self.delay_s = delay_s
        self._replies = replies
        self._turn = 0
        self._version = weight_version
        self._paused = False
        self._fail_after: int | None = None
        self.record_prompts = record_prompts
        self.prompts: list[list[int]] = []
        """Every prompt received, in order, if ``record_prompts`` (tests compare them with
        the records; a benchmark turns this off)."""
        self.inflight = 0

    def fail_next(self, after_tokens: int = 0) -> None:
        """Make the next request die with EngineError after ``after_tokens`` streamed ids."""
        self._fail_after = after_tokens

    def _script(self, prompt_ids: list[int], params: SamplingParams) -> tuple[list[int], str]:
        if callable(self._replies):
            ids = list(self._replies(prompt_ids, params))
        else:
            ids = list(self._replies[min(self._turn, len(self._replies) - 1)])
            self._turn += 1
        for k, tok in enumerate(ids):
            if tok in params.stop_token_ids:
                return ids[: k + 1], "stop"
        room = min(params.max_new_tokens, self.context_length - len(prompt_ids))
        if len(ids) > room:
            return ids[: max(room, 0)], "length"
        return ids, "stop"

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        ids: list[int] = []
        finish = "stop"
        async for chunk in self.stream(prompt_ids, params):
            ids.extend(chunk.ids)
            finish = chunk.finish_reason or finish
        return GenerateResult(
            output_ids=ids,
            output_logprobs=[0.0] * len(ids),
            finish_reason=finish,
            weight_version=self._version,
        )

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        if self._paused:
            raise EnginePausedError(f"{self.name} is paused")
        if self.record_prompts:
            self.prompts.append(list(prompt_ids))
        ids, finish = self._script(prompt_ids, params)
        fail_after, self._fail_after = self._fail_after, None
        size = self.chunk_size or max(len(ids), 1)
        self.inflight += 1
        try:
            for start in range(0, max(len(ids), 1), size):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                piece = ids[start : start + size]
                if fail_after is not None and start + len(piece) > fail_after:
                    piece = ids[start:fail_after]
                    if piece:
                        yield TokenChunk(
                            ids=piece, logprobs=[0.0] * len(piece), weight_version=self._version
                        )
                    raise EngineError(f"{self.name} died mid-request")
                last = start + size >= len(ids)
                yield TokenChunk(
                    ids=piece,
                    logprobs=[0.0] * len(piece),
                    weight_version=self._version,
                    finish_reason=finish if last else None,
                )
        finally:
            self.inflight -= 1

    async def pause(self) -> None:
        self._paused = True

    async def resume(self) -> None:
        self._paused = False

    async def release_memory(self) -> None:
        self._paused = True

    async def resume_memory(self) -> None:
        pass

    async def update_weights(self, source: object, version: int) -> None:
        self._version = version

    async def health(self) -> dict:
        return {
            "name": self.name,
            "paused": self._paused,
            "inflight": self.inflight,
            "weight_version": self._version,
        }

    @property
    def weight_version(self) -> int:
        return self._version
