"""Tokens per second of an engine at several batch sizes, and the gain from batching.

Used by ``benchmarks/engine_throughput.py`` and by the proxy benchmark. Each measurement
sends ``batch`` concurrent greedy requests of ``new_tokens`` tokens (stop ids disabled, so
every request runs to its length) and divides the tokens produced by the wall time until
the last one finishes; the best of ``repeats`` runs is kept, after one warm-up.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass

from gyre_env.engines.base import Engine, SamplingParams


@dataclass(kw_only=True)
class ThroughputResult:
    """Measured figures; ``tokens_per_s[b]`` is for ``b`` concurrent requests."""

    engine: str
    prompt_tokens: int
    new_tokens: int
    tokens_per_s: dict[int, float]
    batching_gain: float
    """tokens/s at the largest batch divided by tokens/s at the smallest."""
    load_average: float
    """1-minute load average when the measurement started: on a shared machine, figures
    taken under a load above the core count are low and noisy."""

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        rates = ", ".join(f"batch {b}: {r:,.0f} tok/s" for b, r in self.tokens_per_s.items())
        return (
            f"{self.engine}: {rates}; batching gain {self.batching_gain:.2f}x "
            f"(load average {self.load_average:.1f} on {os.cpu_count()} cores)"
        )


async def measure_throughput(
    engine: Engine,
    *,
    batch_sizes: tuple[int, ...] = (1, 8),
    prompt_tokens: int = 64,
    new_tokens: int = 64,
    repeats: int = 3,
    vocab_size: int = 1000,
) -> ThroughputResult:
    """Measure ``engine`` (already started) at each batch size; see the module docstring."""
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch_sizes must be positive, got {batch_sizes}")
    load = os.getloadavg()[0]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    rates: dict[int, float] = {}

    async def one_run(batch: int) -> float:
        prompts = [
            [(7 * i + 13 * j + 1) % vocab_size for j in range(prompt_tokens)] for i in range(batch)
        ]
        start = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        elapsed = time.perf_counter() - start
        return sum(len(r.output_ids) for r in results) / elapsed

    await one_run(max(batch_sizes))  # warm-up: allocator, kernels, caches
    for batch in batch_sizes:
        rates[batch] = max([await one_run(batch) for _ in range(repeats)])
    gain = rates[max(batch_sizes)] / rates[min(batch_sizes)]
    return ThroughputResult(
        engine=getattr(engine, "name", type(engine).__name__),
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        tokens_per_s=rates,
        batching_gain=gain,
        load_average=load,
    )


def measure_embedded_throughput(model_path: str | None = None, **kwargs) -> ThroughputResult:
    """Load an EmbeddedEngine (default: the tiny model) and measure it; blocking."""
    from gyre_env.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(
        model_path=model_path, max_batch_size=max(kwargs.get("batch_sizes", (1, 8)))
    )
    try:
        kwargs.setdefault("vocab_size", engine.vocab_size)
        return asyncio.run(measure_throughput(engine, **kwargs))
    finally:
        engine.close()
