"""The throughput measurement the benchmarks print (run here on tiny settings)."""

from __future__ import annotations

import asyncio

import pytest

from gyre_env.engines.throughput import measure_throughput


def test_measures_each_batch_size_and_the_gain(engine):
    result = asyncio.run(
        measure_throughput(
            engine,
            batch_sizes=(1, 4),
            prompt_tokens=8,
            new_tokens=4,
            repeats=1,
            vocab_size=engine.vocab_size,
        )
    )
    assert set(result.tokens_per_s) == {1, 4} and all(r > 0 for r in result.tokens_per_s.values())
    assert result.batching_gain == pytest.approx(result.tokens_per_s[4] / result.tokens_per_s[1])
    assert "batch 4" in result.summary() and result.to_dict()["new_tokens"] == 4


def test_rejects_empty_batch_sizes(engine):
    with pytest.raises(ValueError, match="batch_sizes"):
        asyncio.run(measure_throughput(engine, batch_sizes=()))
