"""Cells whose engines are SGLang servers: a switch to TRAINING aborts the cell's running
requests on its server and the router continues each on the other cell from its token ids
(SGLang exports no KV), then releases the server's memory; back to ROLLOUT it resumes the
memory and loads the newest version through SGLang's update API (disk mode here). A server
that fails an update is excluded from routing by name and resynced.

The servers are FAKES of SGLang's HTTP API (tests/engines/fake_sglang.py) sampling real
tokens from the tiny model with the embedded engine: SGLang cannot run on a CPU. The
cells, router, trainer, weight board and weight sync are Gyre's own, unfaked."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest

from gyre_env.engines.base import SamplingParams
from gyre_env.engines.sglang import SGLangEngine
from gyre_env.proxy.router import Router, RouteTrace
from gyre_env.scheduler.cell import Cell
from gyre_env.scheduler.policy import Role
from gyre_env.scheduler.versions import (
    STALE_WEIGHTS_DETECTED,
    Heartbeat,
    HeartbeatConfig,
    WeightBoard,
)
from gyre_env.weightsync import WeightSyncError
from gyre_env.weightsync.sglang import SGLangSyncConfig, SyncedSGLangEngine

sys.path.insert(0, str(Path(__file__).parents[1] / "engines"))
from fake_sglang import FakeServer, FakeState  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


@pytest.fixture
def pool(tiny_path, tmp_path):
    """Two fake servers (real tokens of the tiny model), their synced engines, a router."""
    servers, engines = [], []
    for i in range(2):
        state = FakeState(model_path=str(tiny_path), context_length=512, token_delay_s=0.01)
        state.start_model()
        servers.append(FakeServer(state))
        engine = SGLangEngine(url=servers[-1].url, name=f"c{i}", pause_mode="abort")
        sync = SGLangSyncConfig(
            mode="disk", export_dir=str(tmp_path / f"c{i}"), base_model_path=str(tiny_path)
        )
        engines.append(SyncedSGLangEngine(engine, sync))
    yield servers, engines
    for server in servers:
        server.stop()


async def _routed(engines) -> Router:
    """The engines started, behind one router that failed updates exclude them from."""
    for e in engines:
        await e.start()
    router = Router(engines, probe_interval_s=0.02)
    for e in engines:
        e.attach_router(router)
    return router


def _cells(tiny_path, engines, router):
    from gyre_env.trainers.torch_backend import TorchTrainer

    board = WeightBoard()
    return [
        Cell(i, e, TorchTrainer(tiny_path), board=board, router=router)
        for i, e in enumerate(engines)
    ]


async def _collect(router, session, prompt, trace, got):
    async for chunk in router.stream(session, prompt, GREEDY, trace):
        if hasattr(chunk, "ids"):
            got.extend(chunk.ids)


def test_a_switch_reprefills_elsewhere_then_comes_back_on_new_weights(
    pool, tiny_path, prompts, make_units
):
    from gyre_env.trainers.protocol import TrainBatch

    servers, engines = pool

    async def scenario():
        router = await _routed(engines)
        alone = [(await engines[1].generate(p, GREEDY)).output_ids for p in prompts[:3]]
        a, b = _cells(tiny_path, engines, router)
        router.replicas[1].paused_until = float("inf")  # every call starts on cell 0
        traces = [RouteTrace() for _ in range(3)]
        outs: list[list[int]] = [[], [], []]
        tasks = [
            asyncio.create_task(_collect(router, f"s{i}", p, traces[i], outs[i]))
            for i, p in enumerate(prompts[:3])
        ]
        while min(len(o) for o in outs) < 3:  # all three mid-generation on cell 0
            await asyncio.sleep(0.01)
        router.replicas[1].paused_until = 0.0
        record = await a.to_training(serving=[a, b])
        await asyncio.gather(*tasks)
        return alone, outs, traces, record, a, b

    alone, outs, traces, record, a, b = asyncio.run(scenario())
    assert outs == alone, "each request continued on cell 1 from its ids, greedily the same"
    for trace in traces:
        assert trace.replicas == ["c0", "c1"] and trace.retries[0]["after_tokens"] >= 3
    assert list(record.phases) == ["stop_admitting", "migrate", "release", "onload"]
    m = record.migration
    assert m.requests == m.reprefilled == 3 and m.with_kv == 0
    assert servers[0].state.released and servers[0].state.received["pause_modes"][0] == "abort"

    a.trainer.train_step(TrainBatch(units=make_units(), kind="rl"))
    a.board.publish(a.trainer.version, dict(a.trainer.named_parameters()))
    back = asyncio.run(a.to_rollout())
    assert list(back.phases) == ["offload", "resume", "load_weights", "admit"]
    assert a.role is Role.ROLLOUT and back.weight_version == a.weight_version == 1
    assert not servers[0].state.released and servers[0].state.weight_version == "1"
    assert [Path(d["path"]).name for d in servers[0].state.received["disk"]] == ["v1"]
    served = asyncio.run(engines[0].generate(prompts[0], GREEDY))
    assert served.weight_version == 1 and served.output_ids != alone[0]  # trained weights


def test_a_failed_update_excludes_the_server_until_a_resync(pool, tiny_path, caplog):
    servers, engines = pool
    from gyre_env.trainers.torch_backend import TorchTrainer

    named = dict(TorchTrainer(tiny_path).named_parameters())

    async def scenario():
        router = await _routed(engines)
        _a, b = _cells(tiny_path, engines, router)
        b.board.publish(1, named)
        servers[1].state.fail_updates = 1
        with pytest.raises(WeightSyncError, match="c1.*update to version 1 failed"):
            await b.sync_engine()
        out = router.replicas[1].excluded, servers[1].state.paused, b.weight_version
        stale = Heartbeat(HeartbeatConfig(staleness_bound=0)).beat(1, {1: b.weight_version})
        await b.sync_engine()  # the resync: a full update of the same version
        return out, stale, router.replicas[1].excluded

    with caplog.at_level(logging.WARNING):
        (excluded, paused, version), stale, after = asyncio.run(scenario())
    assert excluded and paused and version == 0  # out of routing, left paused
    assert stale == [1] and STALE_WEIGHTS_DETECTED in caplog.text
    assert after is None and servers[1].state.weight_version == "1"
    assert not servers[1].state.paused and "WEIGHT_SYNC_RECOVERED" in caplog.text


def test_the_loop_push_resyncs_a_failed_server_and_raises_only_when_none_loaded(pool, tiny_path):
    from gyre_env.trainers.torch_backend import TorchTrainer

    from gyre_env.train.rollout_engines import push_weights

    servers, engines = pool
    named = list(TorchTrainer(tiny_path).named_parameters())

    async def scenario():
        router = await _routed(engines)
        servers[0].state.fail_updates = 1  # fails once: resynced at once
        await push_weights(engines, named, 1)
        first = [s.state.weight_version for s in servers], [r.excluded for r in router.replicas]
        servers[0].state.fail_updates = 2  # fails the resync too: stays out, c1 serves
        await push_weights(engines, named, 2)
        second = [s.state.weight_version for s in servers], router.replicas[0].excluded
        for s in servers:
            s.state.fail_updates = 2
        with pytest.raises(WeightSyncError, match="no engine loaded version 3"):
            await push_weights(engines, named, 3)
        return first, second

    (versions, excluded), (versions2, out) = asyncio.run(scenario())
    assert versions == ["1", "1"] and excluded == [None, None]
    assert versions2 == ["1", "2"] and out is not None
