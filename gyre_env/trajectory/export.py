"""Parquet export of stored trajectories (pyarrow is imported only here, lazily)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gyre_env._optional import require
from gyre_env.trajectory.records import CallRecord, EpisodeInfo
from gyre_env.trajectory.tree import TokenTree


def _write(path: str | Path, columns: dict, types: dict) -> int:
    pa = require("pyarrow", "Parquet export")
    pq = require("pyarrow.parquet", "Parquet export")
    table = pa.table({k: pa.array(v, type=types[k]) for k, v in columns.items()})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(path), compression="zstd")
    return table.num_rows


def export_calls(
    path: str | Path, records: Iterable[CallRecord], episodes: dict[str, EpisodeInfo]
) -> int:
    """One row per call with full token lists and its episode's metadata."""
    pa = require("pyarrow", "Parquet export")
    cols: dict[str, list] = {k: [] for k in _call_types(pa)}
    for r in records:
        e = episodes[r.session]
        for k, v in (
            ("run", e.run),
            ("task", e.task),
            ("group", e.group),
            ("session", r.session),
            ("call_index", r.call_index),
            ("branch", r.branch),
            ("parent", r.parent),
            ("role", r.role),
            ("prompt_ids", r.prompt_ids),
            ("output_ids", r.output_ids),
            ("output_logprobs", r.output_logprobs),
            ("weight_version", r.weight_version),
            ("finish_reason", r.finish_reason),
            ("outcome", e.outcome),
            ("reward", e.reward),
        ):
            cols[k].append(v)
    return _write(path, cols, _call_types(pa))


def _call_types(pa) -> dict:
    return {
        "run": pa.string(),
        "task": pa.string(),
        "group": pa.string(),
        "session": pa.string(),
        "call_index": pa.int32(),
        "branch": pa.string(),
        "parent": pa.int32(),
        "role": pa.string(),
        "prompt_ids": pa.list_(pa.int32()),
        "output_ids": pa.list_(pa.int32()),
        "output_logprobs": pa.list_(pa.float64()),
        "weight_version": pa.int64(),
        "finish_reason": pa.string(),
        "outcome": pa.string(),
        "reward": pa.float64(),
    }


def export_nodes(path: str | Path, trees: Iterable[TokenTree]) -> int:
    """One row per token-tree node: each shared prefix once."""
    pa = require("pyarrow", "Parquet export")
    types = {
        "run": pa.string(),
        "group": pa.string(),
        "task": pa.string(),
        "node": pa.int32(),
        "parent": pa.int32(),
        "tokens": pa.list_(pa.int32()),
        "sampled": pa.bool_(),
        "logprobs": pa.list_(pa.float32()),
        "weight_version": pa.int64(),
        "role": pa.string(),
        "sessions": pa.list_(pa.string()),
        "samplers": pa.list_(pa.string()),
    }
    cols: dict[str, list] = {k: [] for k in types}
    for t in trees:
        for i in t.dfs():
            n = t.nodes[i]
            row = {
                "run": t.run,
                "group": t.group,
                "task": t.task,
                "node": n.id,
                "parent": n.parent if n.parent > 0 else None,
                "tokens": n.tokens.tolist(),
                "sampled": n.sampled,
                "logprobs": n.logprobs.tolist() if n.logprobs is not None else None,
                "weight_version": n.weight_version,
                "role": n.role,
                "sessions": sorted(n.sessions),
                "samplers": [f"{s}#{c}" for s, c, _ in n.samplers],
            }
            for k, v in row.items():
                cols[k].append(v)
    return _write(path, cols, types)
