"""The other process of the weight-sync tests (a real peer, not a fake).

``dist-receiver PORT RANK WORLD OUT TINY N``: an embedded engine that follows a
DistPublisher until it serves version N, saving its weights to OUT/v<version>.pt.
``dist-publisher PORT TINY SEED VERSION [DIE_AFTER]``: publishes the perturbed tiny model;
with DIE_AFTER it kills itself (os._exit) after that many broadcasts, mid-transfer.
``mooncake-publisher BOARD_PORT``: publishes version 1, then 2 and 3, each after a line on
stdin (two slots: version 3 overwrites version 1's slot and collects its record).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def mooncake_tensors(version: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(version)
    return {
        "w.fp32": torch.randn(300, 700, generator=g),
        "w.bf16": torch.randn(123457, generator=g).bfloat16(),
        "w.int64": torch.randint(0, 1 << 40, (999,), generator=g),
        "w.scalar": torch.tensor(float(version)),
    }


def dist_receiver(port, rank, world, out, tiny, target) -> None:
    import torch

    from gyre_env.engines.embedded import EmbeddedEngine
    from gyre_env.weightsync.distributed import DistReceiver, DistSyncConfig
    from gyre_env.weightsync.replicas import EngineFollower

    engine = EmbeddedEngine(model_path=tiny, num_threads=1)
    config = DistSyncConfig(
        port=int(port), world_size=int(world), timeout_s=20, bucket_bytes=1 << 20
    )
    follower = EngineFollower(engine, DistReceiver(config, int(rank)), config=config)

    async def follow() -> None:
        while engine.weight_version < int(target):
            if await follower.sync() is not None:
                state = {k: v.clone() for k, v in engine._model.state_dict().items()}
                torch.save(state, Path(out) / f"v{engine.weight_version}.pt")
                print(f"loaded {engine.weight_version}", flush=True)
            await asyncio.sleep(0.02)

    print("ready", flush=True)
    asyncio.run(follow())
    engine.close()


def dist_publisher(port, tiny, seed, version, die_after=None) -> None:
    from wsutil import perturbed

    from gyre_env.weightsync import distributed
    from gyre_env.weightsync.distributed import DistPublisher, DistSyncConfig

    if die_after is not None:
        real = distributed._Group.broadcast
        count = [0]

        def broadcast(self, tensor):
            count[0] += 1
            if count[0] > int(die_after):
                print("dying mid-transfer", flush=True)
                os._exit(9)
            return real(self, tensor)

        distributed._Group.broadcast = broadcast
    publisher = DistPublisher(DistSyncConfig(port=int(port), timeout_s=20, bucket_bytes=64 << 10))
    print("ready", flush=True)
    publisher.publish(perturbed(tiny, int(seed)), int(version))
    print(f"published {version}", flush=True)


def mooncake_publisher(board_port) -> None:
    from gyre_env.weightsync.mooncake import MooncakePublisher, MooncakeSyncConfig

    config = MooncakeSyncConfig(board_port=int(board_port), timeout_s=10, bucket_bytes=256 << 10)
    publisher = MooncakePublisher(config)
    publisher.publish(mooncake_tensors(1), 1)
    print("published 1", flush=True)
    for version in (2, 3):
        sys.stdin.readline()
        publisher.publish(mooncake_tensors(version), version)
        print(f"published {version}", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    kind, args = sys.argv[1], sys.argv[2:]
    {"dist-receiver": dist_receiver, "dist-publisher": dist_publisher,
     "mooncake-publisher": mooncake_publisher}[kind](*args)  # fmt: skip
