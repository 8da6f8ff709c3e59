"""Weight sync: versioned, atomic, bucketed updates from the trainer to every engine.

``base`` holds the contract (publisher/receiver protocols, buckets, versions, errors and
deadlines); one module per transport: ``inprocess`` (trainer and embedded engine in one
process), ``distributed`` (torch.distributed broadcast, gloo or NCCL), ``mooncake``
(Mooncake transfer engine reads, TCP or RDMA) and ``sglang`` (SGLang's update endpoints).
``replicas`` pushes to a list of engines or lets each engine pull, and takes an engine
whose sync failed out of the proxy's routing until a full resync succeeds.

Names are imported lazily: ``import gyre_env.weightsync`` imports neither torch nor mooncake.
"""

from __future__ import annotations

import importlib

from gyre_env.weightsync.base import (
    Manifest,
    SyncConfig,
    SyncTimeoutError,
    VersionOrderError,
    WeightPublisher,
    WeightReceiver,
    WeightSyncError,
)

_LAZY = {
    "EngineFollower": "gyre_env.weightsync.replicas",
    "RoutingGuard": "gyre_env.weightsync.replicas",
    "InProcessPublisher": "gyre_env.weightsync.inprocess",
    "InProcessReceiver": "gyre_env.weightsync.inprocess",
    "DistSyncConfig": "gyre_env.weightsync.distributed",
    "DistPublisher": "gyre_env.weightsync.distributed",
    "DistReceiver": "gyre_env.weightsync.distributed",
    "MooncakeSyncConfig": "gyre_env.weightsync.mooncake",
    "MooncakePublisher": "gyre_env.weightsync.mooncake",
    "MooncakeReceiver": "gyre_env.weightsync.mooncake",
    "SGLangPublisher": "gyre_env.weightsync.sglang",
    "SGLangSyncConfig": "gyre_env.weightsync.sglang",
}

__all__ = [
    "Manifest",
    "SyncConfig",
    "SyncTimeoutError",
    "VersionOrderError",
    "WeightPublisher",
    "WeightReceiver",
    "WeightSyncError",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gyre_env.weightsync' has no attribute {name!r}")
