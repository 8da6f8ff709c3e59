"""Trajectories: token trees from TITO records, a durable store, bounded samples, packing.

The path from the proxy to the trainer::

    from gyre_env.trajectory import TrajectoryStore, SampleConfig, bounded_samples, pack

    store = TrajectoryStore("runs/r1/trajectories.db")   # also a proxy RecordSink
    store.begin_episode(session=s, run="r1", task=t, group=g)   # runner, before the agent
    store.write(call_record)                                    # proxy, once per call
    store.finish_episode(session=s, outcome="success", reward=1.0)  # runner, after scoring

    trees = store.trees(run="r1", weight_version=7)     # one TokenTree per GRPO group
    units, stats = bounded_samples(trees, SampleConfig(token_budget=32768))
    for unit in units:
        packed = pack(unit)                             # PackedTree (numpy arrays)
        batch = packed.tensors()                        # torch tensors, same names
        ...                                             # see gyre_env.trainers.hf_tree

Records in a proxy JSONL file: ``trees_from_jsonl(records_path, episodes_path)``. The
record types (``CallRecord``, ``EpisodeInfo``, the sinks, ``RecordWriter``) are in
``gyre_env.trajectory.records``.
Only numpy and the standard library are imported here; torch and pyarrow are imported
inside the functions that need them.
"""

from __future__ import annotations

from gyre_env.trajectory.packing import PackedTree, pack
from gyre_env.trajectory.records import (
    CallRecord,
    EpisodeInfo,
    JsonlSink,
    RecordSink,
    RecordWriteError,
    RecordWriter,
    read_episodes_jsonl,
    read_jsonl,
)
from gyre_env.trajectory.sampling import (
    SampleConfig,
    SampleStats,
    TrainingUnit,
    bounded_samples,
    group_advantages,
)
from gyre_env.trajectory.store import StoreError, StoreStats, TrajectoryStore
from gyre_env.trajectory.tree import TokenTree, TreeNode, build_trees, trees_from_jsonl

__all__ = [
    "CallRecord",
    "EpisodeInfo",
    "JsonlSink",
    "PackedTree",
    "RecordSink",
    "RecordWriteError",
    "RecordWriter",
    "SampleConfig",
    "SampleStats",
    "StoreError",
    "StoreStats",
    "TokenTree",
    "TrainingUnit",
    "TreeNode",
    "TrajectoryStore",
    "bounded_samples",
    "build_trees",
    "group_advantages",
    "pack",
    "read_episodes_jsonl",
    "read_jsonl",
    "trees_from_jsonl",
]
