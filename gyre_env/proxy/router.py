"""Routing calls over engine replicas: least-loaded with session affinity, waiting while
every replica is paused, and continuing a generation elsewhere when a replica dies.

A paused replica raises ``EnginePausedError``; the router then marks it paused and probes it
again every ``probe_interval_s`` (or at once when :meth:`Router.resume` is used). While no
replica accepts, the call waits up to ``wait_timeout_s`` and the caller gets ``PING`` items
to keep a streaming response alive. A replica that fails mid-request is marked down; the
generation continues on another replica from the prompt plus the ids already produced, so
the client sees one uninterrupted answer and the record lists both replicas.

A replica whose weight sync failed is *excluded* (:meth:`Router.exclude`): no call goes to
it until :meth:`Router.readmit` after a full resync; calls wait for another replica
meanwhile. Both are logged (``WEIGHT_SYNC_FAILED`` / ``WEIGHT_SYNC_RECOVERED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from gyre_env.engines.base import (
    ContextLengthError,
    Engine,
    EngineError,
    EnginePausedError,
    SamplingParams,
    TokenChunk,
)

log = logging.getLogger(__name__)

PING = object()
"""Yielded by :meth:`Router.stream` while the call waits for a replica."""


class NoReplicaError(EngineError):
    """No replica could serve the call (all paused past the wait bound, or all down)."""


@dataclass
class Replica:
    name: str
    engine: Engine
    inflight: int = 0
    paused_until: float = 0.0
    """Not tried before this time (monotonic); set when it refused with EnginePausedError."""
    down_until: float = 0.0
    """Not tried before this time after a failure."""
    served: int = 0
    excluded: str | None = None
    """Why it is out of routing (a failed weight sync) until readmitted; None when in."""
    sync_failures: int = 0


@dataclass
class RouteTrace:
    """What routing did for one call (copied into its record)."""

    replicas: list[str] = field(default_factory=list)
    retries: list[dict] = field(default_factory=list)
    queue_s: float = 0.0
    first_token_s: float = 0.0
    """Seconds from the (last) engine call to its first chunk."""
    engine_s: float = 0.0
    """Seconds from the (last) engine call to its last chunk."""
    engine_queue_s: float = 0.0
    """Seconds the engine held the call for a batch slot before its prefill (part of
    ``first_token_s``; from engines that report it on their first chunk, else 0)."""
    weight_versions: list[int] = field(default_factory=list)


class Router:
    """Chooses a replica per call and streams its tokens, with waiting and retries."""

    def __init__(
        self,
        engines: list[Engine],
        *,
        wait_timeout_s: float = 600.0,
        ping_interval_s: float = 5.0,
        probe_interval_s: float = 0.5,
        down_s: float = 5.0,
        affinity_slack: int = 2,
    ):
        if not engines:
            raise ValueError("Router needs at least one engine")
        names = [getattr(e, "name", "") or f"r{i}" for i, e in enumerate(engines)]
        if len(set(names)) != len(names):
            names = [f"{n}-{i}" for i, n in enumerate(names)]
        self.replicas = [Replica(n, e) for n, e in zip(names, engines, strict=True)]
        self.wait_timeout_s = wait_timeout_s
        self.ping_interval_s = ping_interval_s
        self.probe_interval_s = probe_interval_s
        self.down_s = down_s
        self.affinity_slack = affinity_slack
        self._affinity: dict[str, str] = {}
        self._changed = asyncio.Event()
        self.waiting = 0
        """Calls waiting for a replica right now (queued agent work)."""

    @property
    def context_length(self) -> int:
        return min(r.engine.context_length for r in self.replicas)

    def _pick(self, session: str, exclude: set[str]) -> Replica | None:
        now = time.monotonic()
        ready = [
            r
            for r in self.replicas
            if r.name not in exclude
            and r.paused_until <= now
            and r.down_until <= now
            and r.excluded is None
        ]
        if not ready:
            return None
        best = min(ready, key=lambda r: r.inflight)
        preferred = self._affinity.get(session)
        for r in ready:
            if r.name == preferred and r.inflight <= best.inflight + self.affinity_slack:
                return r
        return best

    async def _wait(self, deadline: float) -> bool:
        """Sleep until something changes or a probe/ping is due; False past the deadline."""
        now = time.monotonic()
        if now >= deadline:
            return False
        self._changed.clear()
        timeout = min(self.probe_interval_s, self.ping_interval_s, deadline - now)
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return True

    async def stream(
        self, session: str, prompt_ids: list[int], params: SamplingParams, trace: RouteTrace
    ) -> AsyncIterator[TokenChunk | object]:
        """Yield ``PING`` while waiting and ``TokenChunk`` s of one generation."""
        produced: list[int] = []
        exclude: set[str] = set()
        t0 = last_ping = time.monotonic()
        deadline = t0 + self.wait_timeout_s
        while True:
            replica = await self._next_replica(session, exclude, deadline, trace)
            if replica is None:  # waited one interval
                if time.monotonic() - last_ping >= self.ping_interval_s:
                    last_ping = time.monotonic()
                    yield PING
                continue
            trace.queue_s += time.monotonic() - t0
            self._affinity[session] = replica.name
            trace.replicas.append(replica.name)
            replica.inflight += 1
            try:
                attempt = self._generate(replica, prompt_ids, produced, params, trace)
                async with contextlib.aclosing(attempt):
                    async for chunk in attempt:
                        yield chunk
                        if chunk.finish_reason:
                            replica.served += 1
                            return
                raise EngineError(f"{replica.name} ended the stream without a finish reason")
            except ContextLengthError:
                raise  # the request's fault, not the replica's
            except EnginePausedError as e:
                replica.paused_until = time.monotonic() + self.probe_interval_s
                if produced:
                    trace.retries.append(_retry(replica, e, produced))
                else:  # refused before starting: not an attempt
                    trace.replicas.pop()
            except EngineError as e:
                replica.down_until = time.monotonic() + self.down_s
                exclude.add(replica.name)
                trace.retries.append(_retry(replica, e, produced))
            finally:
                replica.inflight -= 1
            t0 = time.monotonic()

    async def _next_replica(
        self, session: str, exclude: set[str], deadline: float, trace: RouteTrace
    ) -> Replica | None:
        """A replica to try now, or None after waiting one interval for one."""
        replica = self._pick(session, exclude)
        if replica is not None:
            return replica
        now = time.monotonic()
        if all(r.name in exclude or r.down_until > now for r in self.replicas):
            raise NoReplicaError(_no_replica_message(trace, "every replica failed"))
        self.waiting += 1
        try:
            alive = await self._wait(deadline)
        finally:
            self.waiting -= 1
        if not alive:
            why = f"no replica accepted within {self.wait_timeout_s:g}s"
            raise NoReplicaError(_no_replica_message(trace, why))
        return None

    async def _generate(
        self,
        replica: Replica,
        prompt_ids: list[int],
        produced: list[int],
        params: SamplingParams,
        trace: RouteTrace,
    ) -> AsyncIterator[TokenChunk]:
        """One attempt on one replica, continuing after the ids already ``produced``."""
        if produced:
            prompt_ids = prompt_ids + produced
            params = replace(params, max_new_tokens=params.max_new_tokens - len(produced))
        started = time.monotonic()
        stream = replica.engine.stream(prompt_ids, params)
        async with contextlib.aclosing(stream):  # closing it aborts the engine's generation
            async for chunk in stream:
                if not trace.first_token_s:
                    trace.first_token_s = time.monotonic() - started
                    trace.engine_queue_s = chunk.queued_s or 0.0
                produced.extend(chunk.ids)
                trace.engine_s = time.monotonic() - started
                if chunk.finish_reason == "abort":  # paused mid-request: continue later
                    if chunk.ids:
                        yield replace(chunk, finish_reason=None)
                    raise EnginePausedError(f"{replica.name} aborted the request")
                trace.weight_versions.append(chunk.weight_version)
                yield chunk

    async def pause(self, name: str | None = None) -> None:
        """Pause one replica (or all): it takes no new calls until :meth:`resume`."""
        for r in self._select(name):
            await r.engine.pause()
            r.paused_until = float("inf")

    async def resume(self, name: str | None = None) -> None:
        for r in self._select(name):
            await r.engine.resume()
            r.paused_until = 0.0
        self._changed.set()

    def _select(self, name: str | None) -> list[Replica]:
        chosen = [r for r in self.replicas if name is None or r.name == name]
        if not chosen:
            raise KeyError(f"no replica named {name!r}; have {[r.name for r in self.replicas]}")
        return chosen

    def exclude(self, name: str, reason: str) -> None:
        """Take a replica out of routing (its weights are not one whole version) until
        :meth:`readmit`; calls already streaming from it finish."""
        for r in self._select(name):
            r.excluded = reason
            r.sync_failures += 1
            log.warning("WEIGHT_SYNC_FAILED replica=%s excluded from routing: %s", r.name, reason)

    def readmit(self, name: str, version: int) -> None:
        """Route to a replica again after a full resync to ``version``."""
        for r in self._select(name):
            if r.excluded is not None:
                log.warning(
                    "WEIGHT_SYNC_RECOVERED replica=%s back in routing at version %d",
                    r.name,
                    version,
                )
            r.excluded = None
        self._changed.set()

    def notify(self) -> None:
        """Wake waiting calls (e.g. after resuming an engine directly)."""
        for r in self.replicas:
            if r.paused_until != float("inf"):
                r.paused_until = 0.0
        self._changed.set()


def _no_replica_message(trace: RouteTrace, why: str) -> str:
    tried = ", ".join(f"{r['replica']}: {r['error']}" for r in trace.retries)
    return f"no engine replica available: {why}" + (f" (tried {tried})" if tried else "")


def _retry(replica: Replica, error: Exception, produced: list[int]) -> dict:
    return {"replica": replica.name, "error": str(error), "after_tokens": len(produced)}
