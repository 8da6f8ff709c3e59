"""In-process weight sync into real embedded engines: exact weights, version order,
atomicity under concurrent generation (checked by recomputing logprobs), and an engine
whose sync timed out leaving the proxy's routing until a full resync."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch
from wsutil import perturbed, run_async

from gyre_env.engines.base import SamplingParams
from gyre_env.engines.embedded import EmbeddedEngine
from gyre_env.proxy.metrics import ProxyMetrics
from gyre_env.proxy.router import Router
from gyre_env.weightsync import (
    EngineFollower,
    InProcessPublisher,
    InProcessReceiver,
    SyncConfig,
    SyncTimeoutError,
    VersionOrderError,
)

PROMPT = [5, 17, 42, 99, 7, 3]


@pytest.fixture
def engines(tiny_path):
    made = [
        EmbeddedEngine(model_path=str(tiny_path), name=f"e{i}", num_threads=1) for i in range(2)
    ]
    yield made
    for e in made:
        e.close()


def served(engine) -> dict:
    return engine._model.state_dict()


@run_async
async def test_push_loads_exact_weights_into_every_engine_in_order(engines, tiny_path):
    v1 = perturbed(tiny_path, seed=1)
    publisher = InProcessPublisher(engines)
    await publisher.apublish(v1, 1)
    for engine in engines:
        assert engine.weight_version == 1
        state = served(engine)
        for name, t in v1.items():
            assert state[name].dtype == t.dtype
            assert torch.equal(state[name], t), name
    with pytest.raises(VersionOrderError, match="not newer than 1"):
        await publisher.apublish(v1, 1)
    with pytest.raises(VersionOrderError, match="e0"):  # a fresh publisher checks engines too
        await InProcessPublisher(engines).apublish(v1, 1)


def recompute(model_state, engine, prompt, output) -> list[float]:
    """Logprobs of ``output`` after ``prompt`` under ``model_state`` (temperature 1)."""
    model = engine._model
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(model_state, strict=False)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    model.load_state_dict(saved)
    logp = torch.log_softmax(logits.float(), -1)
    return logp[torch.arange(len(output)), torch.tensor(output)].tolist()


@run_async
async def test_every_generation_is_sampled_from_exactly_one_version(engines, tiny_path):
    engine = engines[0]
    v0 = {k: v.clone() for k, v in served(engine).items()}
    v1 = perturbed(tiny_path, seed=2, scale=0.2)
    params = SamplingParams(max_new_tokens=48, temperature=1.0, seed=11)
    before = [asyncio.ensure_future(engine.generate(PROMPT[: 3 + i], params)) for i in range(3)]
    await asyncio.sleep(0)  # accepted
    update = asyncio.ensure_future(InProcessPublisher([engine]).apublish(v1, 1))
    while not engine._control:  # the swap is queued behind the running generations
        await asyncio.sleep(0.001)
    after = [asyncio.ensure_future(engine.generate(PROMPT[: 3 + i], params)) for i in range(3)]
    results = await asyncio.gather(*before, *after)
    await update
    assert [r.weight_version for r in results] == [0, 0, 0, 1, 1, 1]
    for i, r in enumerate(results):
        prompt = PROMPT[: 3 + i % 3]
        own, other = (v0, v1) if r.weight_version == 0 else (v1, v0)
        mine = recompute(own, engine, prompt, r.output_ids)
        theirs = recompute(other, engine, prompt, r.output_ids)
        assert max(abs(a - b) for a, b in zip(mine, r.output_logprobs, strict=True)) < 1e-4
        assert max(abs(a - b) for a, b in zip(theirs, r.output_logprobs, strict=True)) > 1e-3


@run_async
async def test_timed_out_sync_leaves_routing_until_a_full_resync(engines, tiny_path, caplog):
    router = Router(engines)
    slow, other = engines
    busy = asyncio.ensure_future(
        slow.generate(PROMPT, SamplingParams(max_new_tokens=400, temperature=1.0, seed=1))
    )
    await asyncio.sleep(0.05)  # the swap must wait for this generation
    publisher = InProcessPublisher(engines, config=SyncConfig(timeout_s=0.05), router=router)
    with caplog.at_level(logging.WARNING), pytest.raises(SyncTimeoutError, match="e0"):
        await publisher.apublish(perturbed(tiny_path, seed=3), 1)
    assert "WEIGHT_SYNC_FAILED replica=e0" in caplog.text
    replicas = {r.name: r for r in router.replicas}
    assert replicas["e0"].excluded and replicas["e1"].excluded is None
    assert router._pick("s", set()).name == "e1"  # calls go elsewhere meanwhile
    sync = {r.name: (r.excluded is not None, r.sync_failures) for r in router.replicas}
    text = ProxyMetrics().render(sync=sync)
    assert 'gyre_proxy_replica_excluded{replica="e0"} 1' in text
    assert 'gyre_proxy_replica_weight_sync_failures_total{replica="e0"} 1' in text
    await busy
    publisher.config = SyncConfig(timeout_s=30)
    v2 = perturbed(tiny_path, seed=4)
    await publisher.apublish(v2, 2)
    assert replicas["e0"].excluded is None
    assert "WEIGHT_SYNC_RECOVERED replica=e0" in caplog.text
    assert all(torch.equal(served(slow)[n], t) for n, t in v2.items())


@run_async
async def test_pull_mode_engines_load_the_newest_version_when_told(engines, tiny_path):
    publisher = InProcessPublisher([], keep_latest=True)
    follower = EngineFollower(engines[0], InProcessReceiver(publisher))
    assert await follower.sync() is None  # nothing published
    await publisher.apublish(perturbed(tiny_path, seed=5), 1)
    v2 = perturbed(tiny_path, seed=6)
    await publisher.apublish(v2, 2)
    assert await follower.notify(2) == 2  # version 1 is skipped, never loaded
    assert engines[0].weight_version == 2
    assert all(torch.equal(served(engines[0])[n], t) for n, t in v2.items())
    assert await follower.notify(2) is None
