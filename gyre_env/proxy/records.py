"""TITO records: the exact token ids in and out of every model call.

The proxy writes one ``CallRecord`` per model call to a ``RecordSink``. The trajectory
store builds token trees from them; nothing downstream ever re-tokenizes text.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, Protocol

BranchRole = Literal["main", "sub-agent", "summary"]


@dataclass(kw_only=True)
class CallRecord:
    """One model call of one session (episode)."""

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
    """Seconds spent queued, in prefill and in decode: ``{"queue", "prefill", "decode"}``."""
    replica: str = ""
    """Which engine replica served the call (and retries, if any)."""
    api: str = "openai"
    """``openai`` | ``anthropic`` | ``passthrough``."""
    created: float = 0.0
    """Unix time the call was received."""
    extra: dict = field(default_factory=dict)
    """Free-form metadata (e.g. passthrough text traces)."""
    prefix_len: int = 0
    """Leading ``prompt_ids`` copied verbatim from the parent call's prompt+output ids
    (``0`` when the prompt was tokenized whole); the rest were tokenized for this call."""

    def to_dict(self) -> dict:
        """A shallow dict (no deep copy: a 128k-id prompt must not cost a copy per id)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> CallRecord:
        return cls(**data)


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
            if seen is not None and record.prefix_len and record.parent in seen:
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
