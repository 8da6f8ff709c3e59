"""Per-session and per-replica counters, rendered in the Prometheus text format.

Latencies and queue waits are summaries (``_sum`` / ``_count``) plus a histogram per
replica; sessions are bounded (least recently used dropped) so labels cannot grow without
limit.
"""

from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, float("inf"))


@dataclass
class _Stats:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    reused_tokens: int = 0
    queue_s: float = 0.0
    latency_s: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(_BUCKETS))

    def add(
        self,
        *,
        prompt: int,
        output: int,
        reused: int,
        queue_s: float,
        latency_s: float,
        error: bool,
    ) -> None:
        self.requests += 1
        self.errors += int(error)
        self.prompt_tokens += prompt
        self.output_tokens += output
        self.reused_tokens += reused
        self.queue_s += queue_s
        self.latency_s += latency_s
        self.buckets[bisect.bisect_left(_BUCKETS, latency_s)] += 1  # cumulated when rendered


class ProxyMetrics:
    """Counters updated once per call (cheap), rendered on ``GET /metrics``."""

    def __init__(self, max_sessions: int = 1000):
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, _Stats] = OrderedDict()
        self.replicas: dict[str, _Stats] = {}
        self.render_mismatches = 0
        self.new_branches = 0

    def observe(
        self,
        *,
        session: str,
        replica: str,
        prompt: int,
        output: int,
        reused: int,
        queue_s: float,
        latency_s: float,
        error: bool = False,
    ) -> None:
        stats = self.sessions.get(session)
        if stats is None:
            stats = self.sessions[session] = _Stats()
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        else:
            self.sessions.move_to_end(session)
        kw = dict(
            prompt=prompt,
            output=output,
            reused=reused,
            queue_s=queue_s,
            latency_s=latency_s,
            error=error,
        )
        stats.add(**kw)
        self.replicas.setdefault(replica or "none", _Stats()).add(**kw)

    def render(
        self,
        inflight: dict[str, int] | None = None,
        waiting: int = 0,
        sync: dict[str, tuple[bool, int]] | None = None,
    ) -> str:
        """``sync`` maps a replica to (excluded from routing, weight-sync failures so far)."""
        lines: list[str] = [f"gyre_proxy_waiting_calls {waiting}"]
        for scope, table in (("session", self.sessions), ("replica", self.replicas)):
            lines += _family(scope, table)
        for name, value in (inflight or {}).items():
            lines.append(f'gyre_proxy_replica_inflight{{replica="{_esc(name)}"}} {value}')
        for name, (excluded, failures) in (sync or {}).items():
            lines.append(f'gyre_proxy_replica_excluded{{replica="{_esc(name)}"}} {int(excluded)}')
            lines.append(
                f'gyre_proxy_replica_weight_sync_failures_total{{replica="{_esc(name)}"}} {failures}'
            )
        lines.append(f"gyre_proxy_render_mismatch_total {self.render_mismatches}")
        lines.append(f"gyre_proxy_new_branches_total {self.new_branches}")
        return "\n".join(lines) + "\n"


def _family(scope: str, table: dict[str, _Stats]) -> list[str]:
    lines = []
    fields = (
        ("requests_total", "requests"),
        ("errors_total", "errors"),
        ("prompt_tokens_total", "prompt_tokens"),
        ("output_tokens_total", "output_tokens"),
        ("reused_prompt_tokens_total", "reused_tokens"),
        ("queue_wait_seconds_sum", "queue_s"),
        ("latency_seconds_sum", "latency_s"),
    )
    for suffix, attr in fields:
        metric = f"gyre_proxy_{scope}_{suffix}"
        lines.append(f"# TYPE {metric} {'counter' if suffix.endswith('total') else 'gauge'}")
        for key, stats in table.items():
            lines.append(f'{metric}{{{scope}="{_esc(key)}"}} {getattr(stats, attr)}')
    if scope == "replica":
        metric = "gyre_proxy_replica_latency_seconds"
        lines.append(f"# TYPE {metric} histogram")
        for key, stats in table.items():
            for edge, count in zip(_BUCKETS, itertools.accumulate(stats.buckets), strict=True):
                le = "+Inf" if edge == float("inf") else f"{edge:g}"
                lines.append(f'{metric}_bucket{{replica="{_esc(key)}",le="{le}"}} {count}')
            lines.append(f'{metric}_sum{{replica="{_esc(key)}"}} {stats.latency_s}')
            lines.append(f'{metric}_count{{replica="{_esc(key)}"}} {stats.requests}')
    return lines


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
