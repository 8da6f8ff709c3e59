"""SGLangPublisher against a FAKE SGLang server (tests/engines/fake_sglang.py): SGLang has
no CPU kernels, so its HTTP API is mimicked. What is real: our publisher and client, the
HTTP traffic, the bytes (the fake decodes tensor payloads, reads the safetensors folder,
and receives gloo broadcasts in the group it joins). benchmarks/gpu/sglang_check.py runs
the same publisher against a real server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from wsutil import free_port, perturbed, run_async

from gyre_env.engines.sglang import SGLangEngine
from gyre_env.proxy.router import Router
from gyre_env.weightsync import (
    SGLangPublisher,
    SGLangSyncConfig,
    VersionOrderError,
    WeightSyncError,
)

sys.path.insert(0, str(Path(__file__).parents[1] / "engines"))
from fake_sglang import FakeServer, FakeState, test_serializer  # noqa: E402


@pytest.fixture
def server():
    fake = FakeServer(FakeState())
    yield fake
    fake.stop()


def client(server) -> SGLangEngine:
    return SGLangEngine(
        url=server.url, name="sgl", context_length=64, tensor_serializer=test_serializer
    )


def same(got: dict, sent: dict) -> bool:
    return set(got) == set(sent) and all(
        got[n].dtype == t.dtype and torch.equal(got[n], t) for n, t in sent.items()
    )


@run_async
async def test_tensor_mode_sends_every_bucket_with_the_version(server, tiny_path):
    engine = client(server)
    publisher = SGLangPublisher([engine], SGLangSyncConfig(bucket_bytes=64 << 10))
    sent = perturbed(tiny_path, 1)
    await publisher.apublish(sent, 1)
    calls = server.state.received["tensors"]
    assert len(calls) > 3  # bucketed
    got = {n: t for call in calls for n, t in call["named"].items()}
    assert same(got, sent)
    assert server.state.weight_version == "1" and engine.weight_version == 1
    assert server.state.paused is False and server.state.received["pause_modes"] == ["in_place"]
    with pytest.raises(VersionOrderError):
        await publisher.apublish(sent, 1)


@run_async
async def test_disk_mode_writes_a_model_folder_per_version(server, tiny_path, tmp_path):
    engine = client(server)
    config = SGLangSyncConfig(mode="disk", export_dir=str(tmp_path), base_model_path=str(tiny_path))
    publisher = SGLangPublisher([engine], config)
    for version in (1, 2, 3):
        sent = perturbed(tiny_path, version)
        await publisher.apublish(sent, version)
        assert same(server.state.received["disk"][-1]["named"], sent)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2", "v3"]  # keep_exports=2
    assert (tmp_path / "v3" / "config.json").is_file()


@run_async
async def test_distributed_mode_broadcasts_into_the_servers_group(server, tiny_path):
    engine = client(server)
    config = SGLangSyncConfig(mode="distributed", master_port=free_port(), timeout_s=20)
    publisher = SGLangPublisher([engine], config)
    for version in (1, 2):
        sent = perturbed(tiny_path, version)
        await publisher.apublish(sent, version)
        assert same(server.state.received["distributed_tensors"][-1], sent)
    assert len(server.state.received["groups"]) == 1  # the group is opened once
    assert server.state.weight_version == "2"


@run_async
async def test_an_update_that_loads_nothing_is_caught_and_the_server_leaves_routing(
    server, tiny_path
):
    engine = client(server)
    router = Router([engine])
    publisher = SGLangPublisher([engine], router=router)
    server.state.ignore_updates = True  # answers success, loads nothing
    with pytest.raises(WeightSyncError, match=r"sgl.*reports weight version None after loading 1"):
        await publisher.apublish(perturbed(tiny_path, 1), 1)
    assert router.replicas[0].excluded is not None
    assert server.state.paused  # never resumed on a partial update
    server.state.ignore_updates = False
    await publisher.apublish(perturbed(tiny_path, 2), 2)  # the full resync
    assert router.replicas[0].excluded is None and not server.state.paused
    assert server.state.weight_version == "2"
