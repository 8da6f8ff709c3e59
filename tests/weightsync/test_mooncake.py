"""Mooncake transfer engine between two real processes over TCP (P2PHANDSHAKE metadata):
the bytes and dtypes the publisher registered arrive exactly, newer versions are pulled,
and a publisher that dies gives a prompt error naming it, not a hang."""

from __future__ import annotations

import os
import time

import pytest
import torch
from peer import mooncake_tensors
from wsutil import Peer, free_port, run_async

if not os.environ.get("CI"):  # CI installs the extra: there a missing one fails the import
    pytest.importorskip("mooncake.engine", reason="pip install 'gyre-env[mooncake]'")

from gyre_env.weightsync import MooncakeReceiver, MooncakeSyncConfig, WeightSyncError  # noqa: E402


@run_async
async def test_pull_between_two_processes_over_tcp():
    port = free_port()
    publisher = Peer("mooncake-publisher", str(port))
    try:
        publisher.expect("published 1")
        receiver = MooncakeReceiver(MooncakeSyncConfig(board_port=port, timeout_s=10))
        assert await receiver.latest_version() == 1
        for version in (1, 2):
            got_version, got = await receiver.receive(version - 1 if version > 1 else None)
            assert got_version == version
            for name, t in mooncake_tensors(version).items():
                assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
                assert torch.equal(got[name], t), name
            if version == 1:
                with pytest.raises(WeightSyncError, match="not newer than 1"):
                    await receiver.receive(1)  # nothing newer yet
                publisher.send("next")
                publisher.expect("published 2")
        board = receiver._store()
        assert board.check(["record/1"]) and board.check(["record/2"])
        publisher.send("next")
        publisher.expect("published 3")
        # the newest `slots` (2) records stay; version 1's is collected with its slot
        assert not board.check(["record/1"]) and board.check(["record/2", "record/3"])
        got_version, got = await receiver.receive(None)
        assert got_version == 3
        assert all(torch.equal(got[n], t) for n, t in mooncake_tensors(3).items())
        publisher.kill()
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=rf"127.0.0.1:{port}|Mooncake publisher"):
            await receiver.receive(1)
        assert time.monotonic() - start < 10 + 5
    finally:
        publisher.kill()
