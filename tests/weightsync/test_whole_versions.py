"""A weight version is accepted only whole (issue 34): a version that lacks some of the
model's tensors, or carries one of another shape or dtype, is refused by the engine that
would load it, by the publishers (in-process, torch.distributed to another process) and by
the elastic cells' weight board, naming what is missing; the old version stays served."""

from __future__ import annotations

import asyncio

import pytest
import torch
from wsutil import Peer, free_port, perturbed

from gyre_env.engines.embedded import EmbeddedEngine
from gyre_env.weightsync.base import IncompleteVersionError


def _dropped(state: dict) -> list[str]:
    """The tensors a partial version leaves out: two projections (no tied aliases)."""
    return [n for n in state if n.endswith("proj.weight")][:2]


def _partial(state: dict) -> dict:
    """``state`` without the ``_dropped`` tensors."""
    return {n: t for n, t in state.items() if n not in _dropped(state)}


def test_the_engine_refuses_a_partial_version_and_keeps_serving_the_old_one(tiny_path):
    engine = EmbeddedEngine(model_path=str(tiny_path), num_threads=1)
    try:
        full = {k: v + 0.01 for k, v in engine._model.state_dict().items()}
        before = {k: v.clone() for k, v in engine._model.state_dict().items()}
        missing = _dropped(full)
        with pytest.raises(ValueError) as e:
            asyncio.run(engine.update_weights(_partial(full), version=1))
        message = str(e.value)
        assert "accepted only whole" in message and "keeps version 0" in message
        assert all(name in message for name in missing)
        assert engine.weight_version == 0
        for name, t in engine._model.state_dict().items():
            assert torch.equal(t, before[name]), f"{name} changed by a refused version"
        asyncio.run(engine.update_weights(full, version=1))  # the whole one is taken
        assert engine.weight_version == 1
        # the trainer's parameters (a tied embedding under one of its names) are whole
        named = dict(engine._model.named_parameters())
        asyncio.run(engine.update_weights(named, version=2))
        assert engine.weight_version == 2
    finally:
        engine.close()


def test_publishers_and_the_board_accept_a_version_only_whole(tiny_path):
    from gyre_env.scheduler.versions import WeightBoard
    from gyre_env.weightsync import EngineFollower, InProcessPublisher, InProcessReceiver

    v1, v2 = perturbed(tiny_path, seed=1), perturbed(tiny_path, seed=2)
    missing = _dropped(v2)
    engine = EmbeddedEngine(model_path=str(tiny_path), num_threads=1)
    try:
        publisher = InProcessPublisher([engine], keep_latest=True)
        publisher.publish(v1, 1)
        with pytest.raises(IncompleteVersionError) as e:
            publisher.publish(_partial(v2), 2)
        assert f"2 of its {len(v1)} tensors missing ({missing[0]}, {missing[1]})" in str(e.value)
        assert publisher.version == 1 and engine.weight_version == 1
        wrong = {**v2, missing[0]: v2[missing[0]].double()}
        with pytest.raises(IncompleteVersionError, match="shape/dtype mismatch"):
            publisher.publish(wrong, 2)
        publisher.publish(v2, 2)
        assert engine.weight_version == 2
        # a pulling engine checks against its own model whatever the publisher let through
        follower_engine = EmbeddedEngine(model_path=str(tiny_path), num_threads=1)
        try:
            publisher.latest = _partial(publisher.latest)
            follower = EngineFollower(follower_engine, InProcessReceiver(publisher))
            with pytest.raises(Exception, match="accepted only whole"):
                asyncio.run(follower.sync())
            assert follower_engine.weight_version == 0
        finally:
            follower_engine.close()
        publisher.close()
    finally:
        engine.close()

    board = WeightBoard()
    board.publish(1, v1)
    with pytest.raises(IncompleteVersionError, match=rf"weight board.*missing \({missing[0]}"):
        board.publish(2, _partial(v2))
    assert board.version == 1 and set(board.latest()[1]) == set(v1)
    board.publish(2, v2)
    assert board.version == 2


@pytest.mark.slow
def test_a_distributed_publisher_refuses_a_partial_version_and_the_group_goes_on(
    tiny_path, tmp_path
):
    """Over gloo to a receiving engine in another process: the partial version is never
    broadcast, the receiver keeps version 1, and the next whole version arrives."""
    from gyre_env.weightsync.distributed import DistPublisher, DistSyncConfig

    port = free_port()
    publisher = DistPublisher(DistSyncConfig(port=port, timeout_s=20, bucket_bytes=1 << 20))
    peer = Peer("dist-receiver", str(port), "1", "2", str(tmp_path), str(tiny_path), "2")
    try:
        peer.expect("ready")
        publisher.publish(perturbed(tiny_path, 1), 1)
        peer.expect("loaded 1")
        with pytest.raises(IncompleteVersionError, match="version 2 refused.*missing"):
            publisher.publish(_partial(perturbed(tiny_path, 2)), 2)
        assert publisher.version == 1
        sent = perturbed(tiny_path, 3)
        publisher.publish(sent, 2)
        peer.expect("loaded 2")
        got = torch.load(tmp_path / "v2.pt")
        assert all(torch.equal(got[n], t) for n, t in sent.items())
    finally:
        peer.kill()
        publisher.close()
