"""KV migration between two embedded engines: requests exported mid-generation continue on
another engine, with their KV or re-prefilled from their ids, and the caller's stream is
the same as if nothing had moved (greedy and seeded sampling alike). All real: the tiny
model on CPU, two engines' worker threads."""

from __future__ import annotations

import asyncio

import pytest

from gyre_env.engines.base import SamplingParams
from gyre_env.engines.embedded import EmbeddedEngine
from gyre_env.engines.kv_migration import pack_kv, unpack_kv


@pytest.fixture(scope="module")
def pair(tiny_path):
    a = EmbeddedEngine(model_path=str(tiny_path), max_batch_size=8, name="a")
    b = EmbeddedEngine(model_path=str(tiny_path), max_batch_size=8, name="b")
    yield a, b
    a.close()
    b.close()


async def _collect(engine, prompt, params, seen: list):
    ids = []
    async for chunk in engine.stream(prompt, params):
        ids.extend(chunk.ids)
        seen.append(1)
        last = chunk
    return ids, last.finish_reason


async def _migrate_midway(a, b, prompts, params, hold, *, keep_kv: bool, after_steps: int):
    held, until_held = hold
    await a.resume()
    seen: list = []
    with held(a, after_steps) as holding:
        tasks = [
            asyncio.create_task(_collect(a, p, sp, seen))
            for p, sp in zip(prompts, params, strict=True)
        ]
        await until_held(holding)
        moved = await a.export_inflight()
    assert all(m.kv_tokens == len(m.context_ids) - 1 for m in moved if m.keys is not None)
    if not keep_kv:
        for m in moved:
            m.drop_kv()
    await b.import_inflight(moved)
    results = await asyncio.gather(*tasks)
    await a.resume()
    return results, moved


@pytest.mark.parametrize("keep_kv", [True, False], ids=["kv", "reprefill"])
def test_migrated_requests_continue_exactly(pair, prompts, keep_kv, hold_in_flight):
    a, b = pair
    greedy = [SamplingParams(max_new_tokens=30, temperature=0.0) for _ in prompts[:4]]
    seeded = [SamplingParams(max_new_tokens=30, temperature=1.0, seed=7 + i) for i in range(4)]
    params = greedy + seeded
    alone = [
        asyncio.run(a.generate(p, sp)).output_ids for p, sp in zip(prompts, params, strict=True)
    ]
    results, moved = asyncio.run(
        _migrate_midway(a, b, prompts, params, hold_in_flight, keep_kv=keep_kv, after_steps=5)
    )
    assert [ids for ids, _ in results] == alone
    assert all(reason == "length" for _, reason in results)
    assert moved, "some requests were still in flight when exported"
    if keep_kv:
        running = [m for m in moved if m.keys is not None]
        assert running, "running requests moved with their KV"


def test_export_takes_queued_requests_too(tiny_path, prompts, hold_in_flight):
    a = EmbeddedEngine(model_path=str(tiny_path), max_batch_size=2, name="small")
    b = EmbeddedEngine(model_path=str(tiny_path), max_batch_size=8, name="big")
    try:
        params = SamplingParams(max_new_tokens=20, temperature=0.0)
        alone = [asyncio.run(b.generate(p, params)).output_ids for p in prompts[:6]]
        results, moved = asyncio.run(
            _migrate_midway(
                a, b, prompts[:6], [params] * 6, hold_in_flight, keep_kv=True, after_steps=2
            )
        )
        assert [ids for ids, _ in results] == alone
        assert any(m.keys is None for m in moved), "queued (not prefilled) requests move too"
    finally:
        a.close()
        b.close()


def test_kv_bytes_round_trip_exactly(pair, prompts, hold_in_flight):
    import torch

    a, b = pair
    params = SamplingParams(max_new_tokens=200, temperature=0.0)

    async def run():
        held, until_held = hold_in_flight
        await a.resume()
        seen: list = []
        with held(a, after_steps=5) as holding:
            task = asyncio.create_task(_collect(a, prompts[3], params, seen))
            await until_held(holding)
            (moved,) = await a.export_inflight()
        wire, layout = pack_kv(moved.keys, moved.values)
        assert wire.dtype == torch.uint8 and wire.numel() == layout.total_bytes == moved.kv_nbytes
        keys, values = unpack_kv(wire.clone(), layout)
        assert all(
            torch.equal(x, y) for x, y in zip(keys + values, moved.keys + moved.values, strict=True)
        )
        moved.keys, moved.values = keys, values
        await b.import_inflight([moved])
        out = await task
        await a.resume()
        return out

    alone = asyncio.run(a.generate(prompts[3], params)).output_ids
    ids, _ = asyncio.run(run())
    assert ids == alone


def test_kv_over_mooncake_tcp_continues_exactly(pair, prompts, hold_in_flight):
    pytest.importorskip(
        "mooncake.engine", reason="the mooncake extra (pip install gyre-env[mooncake])"
    )
    from gyre_env.scheduler.migration import MooncakeTransport, migrate

    a, b = pair
    params = SamplingParams(max_new_tokens=60, temperature=0.0)
    transport = MooncakeTransport()

    async def run():
        held, until_held = hold_in_flight
        await a.resume()
        seen: list = []
        with held(a, after_steps=2) as holding:
            tasks = [asyncio.create_task(_collect(a, p, params, seen)) for p in prompts[:3]]
            await until_held(holding)
            report = await migrate(a, [b], transport=transport, window_s=30.0)
        out = await asyncio.gather(*tasks)
        await a.resume()
        return report, out

    alone = [asyncio.run(a.generate(p, params)).output_ids for p in prompts[:3]]
    report, out = asyncio.run(run())
    assert [ids for ids, _ in out] == alone
    assert report.transport == "mooncake tcp" and report.with_kv > 0 and report.kv_bytes > 0
