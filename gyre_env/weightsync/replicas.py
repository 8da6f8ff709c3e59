"""Engines under weight sync: push to a list of engines, or let each engine pull.

Both modes go through :class:`RoutingGuard`: an engine whose sync failed or timed out is
taken out of the proxy's routing (``Router.exclude``; the proxy's ``/metrics`` shows
``gyre_proxy_replica_excluded 1``) and comes back only when a full sync succeeds. Every
sync here is full (all tensors of one version), so the next successful one is the resync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gyre_env.weightsync.base import (
    SyncConfig,
    SyncTimeoutError,
    WeightReceiver,
    WeightSyncError,
    check_version,
)

if TYPE_CHECKING:
    from gyre_env.engines.base import Engine
    from gyre_env.proxy.router import Router

log = logging.getLogger(__name__)


def engine_name(engine: Engine) -> str:
    return getattr(engine, "name", None) or type(engine).__name__


class RoutingGuard:
    """Keeps the router's view in step with sync outcomes (a no-op without a router)."""

    def __init__(self, router: Router | None = None):
        self.router = router
        self.excluded: dict[str, str] = {}
        """Engine name -> the error that took it out, while it is out."""
        self.stragglers: dict[str, asyncio.Future] = {}
        """Engine name -> a timed-out update that may still be running."""

    def _replica(self, name: str) -> str | None:
        if self.router is None:
            return None
        for r in self.router.replicas:
            if r.name == name or getattr(r.engine, "name", None) == name:
                return r.name
        return None

    def failed(self, name: str, error: BaseException) -> None:
        self.excluded[name] = str(error)
        replica = self._replica(name)
        if replica is not None:
            self.router.exclude(replica, str(error))
        else:
            log.warning("WEIGHT_SYNC_FAILED engine=%s: %s", name, error)

    def succeeded(self, name: str, version: int) -> None:
        was_out = self.excluded.pop(name, None) is not None
        replica = self._replica(name)
        if replica is not None:
            self.router.readmit(replica, version)
        elif was_out:
            log.warning("WEIGHT_SYNC_RECOVERED engine=%s at version %d", name, version)


async def guarded_update(
    engine: Engine,
    update: Callable[[], Awaitable[None]],
    version: int,
    *,
    guard: RoutingGuard,
    timeout_s: float,
) -> None:
    """Run one engine's ``update`` under a deadline; record the outcome with ``guard``.

    A timed-out update is not cancelled (cancelling a swap the engine already queued would
    break it); it may still complete, and the engine then serves that whole version. It
    stays excluded, and its next update waits for the straggler first, so versions never
    land out of order."""
    name = engine_name(engine)
    straggler = guard.stragglers.get(name)
    if straggler is not None and not straggler.done():
        try:
            await asyncio.wait_for(asyncio.shield(straggler), timeout_s)
        except asyncio.TimeoutError:
            error = SyncTimeoutError(
                f"an earlier update is still running after another {timeout_s:g}s", peer=name
            )
            guard.failed(name, error)
            raise error from None
    guard.stragglers.pop(name, None)
    task = asyncio.ensure_future(update())
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except asyncio.TimeoutError:
        guard.stragglers[name] = task
        task.add_done_callback(_consume)
        error: WeightSyncError = SyncTimeoutError(
            f"update to version {version} did not finish within {timeout_s:g}s", peer=name
        )
        guard.failed(name, error)
        raise error from None
    except WeightSyncError as e:
        guard.failed(name, e)
        raise
    except Exception as e:
        error = WeightSyncError(f"update to version {version} failed: {e}", peer=name)
        guard.failed(name, error)
        raise error from e
    guard.succeeded(name, version)


def _consume(task: asyncio.Future) -> None:
    """Retrieve a straggler's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("a timed-out weight update failed later: %s", task.exception())


async def push_all(
    engines: list[Engine],
    make_update: Callable[[Engine], Callable[[], Awaitable[None]]],
    version: int,
    *,
    guard: RoutingGuard,
    timeout_s: float,
) -> None:
    """Update every engine concurrently; one failure does not stop the others. Raises the
    first failure (naming its engine) after all have finished."""
    results = await asyncio.gather(
        *(
            guarded_update(e, make_update(e), version, guard=guard, timeout_s=timeout_s)
            for e in engines
        ),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        if len(errors) > 1:
            names = ", ".join(getattr(e, "peer", "?") for e in errors)
            log.warning("weight sync to version %d failed on %s", version, names)
        raise errors[0]


class EngineFollower:
    """Pull mode (checkpoint-engine's pattern): the core cell publishes; this engine pulls
    the newest version when told one exists (:meth:`notify`) or when it polls (:meth:`run`).
    Versions skipped in between are never loaded."""

    def __init__(
        self,
        engine: Engine,
        receiver: WeightReceiver,
        *,
        router: Router | None = None,
        config: SyncConfig | None = None,
    ):
        self.engine = engine
        self.receiver = receiver
        self.config = config or SyncConfig()
        self.guard = RoutingGuard(router)
        self._lock = asyncio.Lock()

    async def sync(self) -> int | None:
        """Pull and swap in the newest version newer than the engine's; returns it, or None
        when the engine already has the newest."""
        async with self._lock:
            current = self.engine.weight_version
            out_of_routing = engine_name(self.engine) in self.guard.excluded
            newest = await self.receiver.latest_version()
            if newest is None or (newest <= current and not out_of_routing):
                return None
            staged: dict[str, object] = {}

            async def update() -> None:
                version, tensors = await self.receiver.receive(None if out_of_routing else current)
                check_version(version, None if out_of_routing else current, peer=self.receiver.peer)
                staged["version"] = version
                await self.engine.update_weights(dict(tensors), version)

            await guarded_update(
                self.engine, update, newest, guard=self.guard, timeout_s=self.config.timeout_s
            )
            return staged["version"]

    async def notify(self, version: int) -> int | None:
        """Told that ``version`` exists: pull unless the engine already has it."""
        if (
            version <= self.engine.weight_version
            and engine_name(self.engine) not in self.guard.excluded
        ):
            return None
        return await self.sync()

    async def run(self, poll_s: float = 1.0, stop: asyncio.Event | None = None) -> None:
        """Poll for new versions until ``stop`` is set; failures are logged and retried."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.sync()
            except WeightSyncError as e:
                log.warning("%s; retrying in %gs", e, poll_s)
            try:
                await asyncio.wait_for(stop.wait(), poll_s)
            except asyncio.TimeoutError:
                pass
