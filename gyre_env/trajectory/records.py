"""TITO records: the exact token ids in and out of every model call, and what the runner
knows about each episode.

The proxy makes one ``CallRecord`` per model call and hands it to a ``RecordSink`` (a JSONL
file, the trajectory store, or both); the runner describes each episode with an
``EpisodeInfo``. Nothing downstream ever re-tokenizes text.

The record is the one place where prefix sharing is decided: ``parent`` and
``prefix_len`` say which earlier call's ids the prompt starts with. The compact JSONL
file, the store's delta encoding and the token tree all reuse that claim instead of
comparing token ids again (only a record that does not know, ``prefix_len=None``, is
searched).

``RecordWriter`` puts a sink behind a queue and one thread, so that the proxy's event
loop never waits on a disk write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal, Protocol

log = logging.getLogger(__name__)

BranchRole = Literal["main", "sub-agent", "summary"]


@dataclass(kw_only=True)
class CallRecord:
    """One model call of one session (episode).

    Token fields are lists of ints as the proxy writes them; records the store reads for
    token trees carry numpy arrays instead (``int32`` ids, ``float64`` logprobs)."""

    session: str
    """The episode's proxy session id."""
    call_index: int
    """0-based order of this call within its session."""
    branch: str
    """Branch id within the session; calls extending each other share it."""
    parent: int | None
    """``call_index`` of the call whose prompt+output this prompt extends, if any."""
    role: BranchRole
    """What the branch is: the main conversation, a sub-agent, or a summary/compaction."""
    prompt_ids: list[int]
    """Exact prompt token ids sent to the engine."""
    output_ids: list[int]
    """Exact sampled token ids."""
    output_logprobs: list[float]
    """Behaviour log-probabilities of ``output_ids`` (same length)."""
    weight_version: int
    """Version of the policy weights that sampled this call."""
    sampling: dict = field(default_factory=dict)
    """Sampling parameters (temperature, top_p, max_tokens, stop, ...)."""
    finish_reason: str = "stop"
    """``stop`` | ``length`` | ``tool_calls`` | ``error``."""
    timings: dict = field(default_factory=dict)
    """Seconds of the call: ``queue`` (waiting for a replica in the proxy),
    ``engine_queue`` (waiting in the engine for a batch slot: part of ``prefill``, from
    engines that report it), ``prefill`` (engine call to first token), ``decode``,
    ``render`` and ``total``."""
    replica: str = ""
    """Which engine replica served the call (and retries, if any)."""
    api: str = "openai"
    """``openai`` | ``anthropic`` | ``responses`` (OpenAI Responses) | ``passthrough``."""
    created: float = 0.0
    """Unix time the call was received."""
    extra: dict = field(default_factory=dict)
    """Free-form metadata (e.g. passthrough text traces)."""
    prefix_len: int | None = None
    """Leading ``prompt_ids`` copied verbatim from the ``parent`` call's prompt+output ids
    (``0`` when the prompt was tokenized whole). The proxy sets it on every call it
    tokenizes; ``None`` means unknown (a passthrough, a hand-made record, a file from
    before this field), and only then do the store and the tree compare ids themselves."""

    def to_dict(self) -> dict:
        """A shallow dict (no deep copy: a 128k-id prompt must not cost a copy per id)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> CallRecord:
        return cls(**data)

    @property
    def shares_parent(self) -> bool:
        """The record itself says its prompt starts with ``prefix_len`` ids of ``parent``."""
        return self.parent is not None and bool(self.prefix_len)


@dataclass(kw_only=True)
class EpisodeInfo:
    """What the runner knows about an episode that its model calls do not say."""

    session: str
    """The proxy session id of the episode (``CallRecord.session``)."""
    run: str = ""
    """Training run the episode belongs to."""
    task: str = ""
    """Task id; episodes of one task in one group share a tree."""
    group: str = ""
    """GRPO group id; empty means the episode is a group of its own."""
    outcome: str = "unknown"
    """``success`` | ``failure`` | ``timeout`` | ``infra_error`` | ... (``unknown`` until scored)."""
    reward: float = 0.0
    """Final episode reward (the GRPO advantage is computed from it)."""
    step_rewards: dict[int, float] = field(default_factory=dict)
    """Partial reward of the env step that followed call ``call_index`` -> reward."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> EpisodeInfo:
        try:
            info = cls(**data)
        except TypeError as e:
            raise ValueError(f"bad EpisodeInfo {data!r}: {e}") from e
        info.step_rewards = {int(k): float(v) for k, v in info.step_rewards.items()}
        return info

    @classmethod
    def from_record(cls, record: CallRecord) -> EpisodeInfo:
        """Fallback when the runner wrote no episode info: use ``record.extra`` if set."""
        extra = record.extra or {}
        return cls(
            session=record.session,
            run=str(extra.get("run", "")),
            task=str(extra.get("task", "")),
            group=str(extra.get("group", "")),
        )

    @property
    def group_key(self) -> tuple[str, str]:
        """(run, group) - the key episodes are grouped into trees by."""
        return (self.run, self.group or f"session:{self.session}")


def read_episodes_jsonl(path: str | Path) -> list[EpisodeInfo]:
    """Episode infos, one JSON object per line (``EpisodeInfo.to_dict``)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(EpisodeInfo.from_dict(json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON: {e}") from e
    return out


try:  # orjson writes long id lists ~10x faster than the stdlib
    import orjson

    def _dumps_line(data: dict) -> str:
        return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE).decode()

except ImportError:  # pragma: no cover - depends on the environment

    def _dumps_line(data: dict) -> str:
        return json.dumps(data, separators=(",", ":")) + "\n"


class RecordSink(Protocol):
    """Where the proxy sends records. Must be thread-safe."""

    def write(self, record: CallRecord) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON line per record; each line is flushed as it is written.

    With ``compact=True`` a record whose prompt extends its parent's ids (``prefix_len``)
    is written as ``"prompt_ids": null`` plus ``"prompt_suffix_ids"`` (the ids after the
    prefix), so a long session's file grows with its new tokens rather than with the
    context at every call. :func:`read_jsonl` restores the full ``prompt_ids``. Only a
    parent written earlier to the same file is referenced this way.
    """

    def __init__(self, path: str | Path, *, compact: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.compact = compact
        self._written: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: CallRecord) -> None:
        data = record.to_dict()
        with self._lock:
            seen = self._written.setdefault(record.session, set()) if self.compact else None
            if seen is not None and record.shares_parent and record.parent in seen:
                data["prompt_suffix_ids"] = data["prompt_ids"][record.prefix_len :]
                data["prompt_ids"] = None
            self._fh.write(_dumps_line(data))
            self._fh.flush()
            if seen is not None:
                seen.add(record.call_index)

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()


def read_jsonl(path: str | Path) -> list[CallRecord]:
    """Read records back; a torn last line (a crash mid-write) is ignored. Compact lines
    (see :class:`JsonlSink`) get their full ``prompt_ids`` back from their parent."""
    out = []
    by_call: dict[tuple[str, int], CallRecord] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                data = json.loads(line)
                suffix = data.pop("prompt_suffix_ids", None)
                if data.get("prompt_ids") is None and suffix is not None:
                    parent = by_call[(data["session"], data["parent"])]
                    head = (parent.prompt_ids + parent.output_ids)[: data["prefix_len"]]
                    data["prompt_ids"] = head + suffix
                record = CallRecord.from_dict(data)
            except (json.JSONDecodeError, TypeError, KeyError):
                continue
            by_call[(record.session, record.call_index)] = record
            out.append(record)
    return out


class RecordWriteError(RuntimeError):
    """Records a :class:`RecordWriter` could not write (the first failure is the cause)."""


_STOP = object()


class RecordWriter:
    """A ``RecordSink`` in front of ``sink`` that writes on its own thread.

    ``write``/``submit`` queue a record and return at once; one thread writes the queued
    records to ``sink`` in the order they came (a parent before the calls extending it).
    ``flush`` waits until everything queued so far is written; ``close`` flushes, joins the
    thread and closes ``sink``. A write that fails is logged at once, its future carries
    the exception, and the next ``flush`` or ``close`` raises :class:`RecordWriteError`
    naming how many were lost: nothing is dropped silently. ``max_pending`` bounds the
    queue (a full queue makes ``write`` wait: backpressure instead of unbounded memory).
    """

    def __init__(self, sink: RecordSink, *, max_pending: int = 1024, name: str = "gyre-records"):
        self.sink = sink
        self._queue: queue.Queue = queue.Queue(max_pending)
        self._lock = threading.Lock()  # orders submissions against close
        self._failures: list[BaseException] = []
        self._failures_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, record: CallRecord | None) -> Future:
        """Queue ``record`` (``None``: a marker that completes once all before it are
        written); the future completes when it is written."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RecordWriteError("the record writer is closed")
            self._queue.put((record, fut))
        return fut

    def write(self, record: CallRecord) -> None:
        self.submit(record)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record queued before this call is written; raise
        :class:`RecordWriteError` if any write failed since the last flush."""
        self.submit(None).result(timeout)
        self._raise_failures()

    def close(self) -> None:
        """Write everything queued, stop the thread, close ``sink`` (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put((_STOP, None))
        self._thread.join()
        try:
            self.sink.close()
        finally:
            self._raise_failures()

    def _run(self) -> None:
        while True:
            record, fut = self._queue.get()
            if record is _STOP:
                return
            error = None
            if record is not None:
                try:
                    self.sink.write(record)
                except Exception as e:  # surfaced by flush/close and the future
                    log.exception("record sink failed for %s/%d", record.session, record.call_index)
                    with self._failures_lock:
                        self._failures.append(e)
                    error = e
            _settle(fut, error)

    def _raise_failures(self) -> None:
        with self._failures_lock:
            failures, self._failures = self._failures, []
        if failures:
            raise RecordWriteError(
                f"{len(failures)} record(s) could not be written to {type(self.sink).__name__}: "
                f"{type(failures[0]).__name__}: {failures[0]}"
            ) from failures[0]


def _settle(fut: Future, error: BaseException | None) -> None:
    # InvalidStateError: the waiter cancelled; the record is written all the same
    with contextlib.suppress(InvalidStateError):
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)


def submit_record(sink: RecordSink, record: CallRecord) -> Future:
    """Hand ``record`` to ``sink``: queued when it is a :class:`RecordWriter`, else written
    now. The future fails if the write does; the failure is logged either way."""
    fut: Future = Future()
    try:
        if isinstance(sink, RecordWriter):
            return sink.submit(record)
        sink.write(record)
    except Exception as e:
        log.exception("record sink failed for %s/%d", record.session, record.call_index)
        fut.set_exception(e)
    else:
        fut.set_result(None)
    return fut


async def record_written(fut: Future) -> None:
    """Wait, without blocking the event loop, until a submitted record is written. A
    failed write was logged where it failed and must not fail the model call; a cancelled
    waiter leaves the write to finish on its own."""
    with contextlib.suppress(Exception):  # a cancellation is not an Exception: it propagates
        await asyncio.shield(asyncio.wrap_future(fut))


__all__ = [
    "BranchRole",
    "CallRecord",
    "EpisodeInfo",
    "JsonlSink",
    "RecordSink",
    "RecordWriteError",
    "RecordWriter",
    "read_episodes_jsonl",
    "read_jsonl",
    "record_written",
    "submit_record",
]


def trace_calls(records) -> list[dict]:
    """A traced episode's calls from its proxy records, in call order: ``new`` prompt
    tokens past the cached prefix, ``out`` tokens, ``start`` (``time.time()`` when the
    proxy took the request), the record's ``queue`` / ``engine_queue`` / ``prefill`` /
    ``decode`` / ``total`` seconds and the serving ``replica``."""
    return [
        dict(
            new=max(len(r.prompt_ids) - int(r.prefix_len or 0), 0),
            out=len(r.output_ids),
            start=float(r.created),
            queue=float(r.timings.get("queue", 0.0)),
            engine_queue=float(r.timings.get("engine_queue", 0.0)),
            prefill=float(r.timings.get("prefill", 0.0)),
            decode=float(r.timings.get("decode", 0.0)),
            total=float(r.timings.get("total", 0.0)),
            replica=r.replica,
        )
        for r in sorted(records, key=lambda r: r.call_index)
    ]
