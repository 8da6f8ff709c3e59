"""Re-exports of the TITO record types, which live in :mod:`gyre_env.trajectory.records`
(the records are the trajectory's data; the proxy is one writer of them). Kept so that
``from gyre_env.proxy.records import CallRecord, JsonlSink, read_jsonl`` keeps working."""

from __future__ import annotations

from gyre_env.trajectory.records import (
    BranchRole,
    CallRecord,
    JsonlSink,
    RecordSink,
    RecordWriteError,
    RecordWriter,
    read_jsonl,
)

__all__ = [
    "BranchRole",
    "CallRecord",
    "JsonlSink",
    "RecordSink",
    "RecordWriteError",
    "RecordWriter",
    "read_jsonl",
]
