"""In-process weight sync: the trainer and embedded engines share one process.

Nothing travels, so nothing is bucketed: ``publish`` hands the trainer's tensors to each
engine's ``update_weights``, which copies them straight into the engine's parameters on
its worker thread between decode steps (one ``copy_`` per tensor, converting dtype only
where the engine serves another one). Requests accepted before the swap finish on the
old weights; later ones start on the new: no request sees a mix.

Push mode: ``InProcessPublisher(engines)``. Pull mode: a publisher with ``keep_latest``
keeps a snapshot of the newest version that :class:`InProcessReceiver` hands to an
:class:`~gyre_env.weightsync.replicas.EngineFollower`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from gyre_env.weightsync.base import (
    SyncConfig,
    WholeVersions,
    check_version,
    layout_of,
    named_list,
)
from gyre_env.weightsync.replicas import RoutingGuard, engine_name, push_all

if TYPE_CHECKING:
    import torch

    from gyre_env.engines.base import Engine
    from gyre_env.proxy.router import Router


class InProcessPublisher:
    """Pushes each version into every engine of this process (see the module docstring)."""

    def __init__(
        self,
        engines: list[Engine],
        *,
        config: SyncConfig | None = None,
        router: Router | None = None,
        keep_latest: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        """``keep_latest`` keeps a copy of the newest version for pulling receivers;
        ``loop`` is the event loop the engines are driven from (the proxy's), which the
        blocking :meth:`publish` submits to; without it ``publish`` runs a private loop
        kept across publishes (a fresh loop per call costs more than a 10M-parameter
        copy on a busy machine)."""
        self.engines = list(engines)
        self.config = config or SyncConfig()
        self.guard = RoutingGuard(router)
        self.keep_latest = keep_latest
        self.loop = loop
        self.version: int | None = None
        self.latest: dict[str, torch.Tensor] | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._whole = WholeVersions("in-process publisher")

    def publish(self, named_tensors: Mapping | Iterable, version: int) -> None:
        """Blocking :meth:`apublish` (from the trainer's thread, never the engines' loop)."""
        coro = self.apublish(named_tensors, version)
        if self.loop is None:
            if self._own_loop is None or self._own_loop.is_closed():
                self._own_loop = asyncio.new_event_loop()
            self._own_loop.run_until_complete(coro)
        else:
            asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def apublish(self, named_tensors: Mapping | Iterable, version: int) -> None:
        """Swap ``version`` into every engine; the first failure is raised (naming its
        engine) after all engines were tried, and that engine leaves routing. A version
        without every tensor of the first one is refused before any engine sees it
        (``IncompleteVersionError``; each engine also checks against its own model)."""
        named = named_list(named_tensors)
        check_version(version, self.version, peer="in-process publisher")
        for engine in self.engines:
            check_version(version, engine.weight_version, peer=engine_name(engine))
        self._whole.check(layout_of(named), version)  # every tensor of the first version
        self.version = version
        if self.keep_latest:
            self.latest = {n: t.detach().clone() for n, t in named}
        state = {n: t.detach() for n, t in named}

        def make_update(engine: Engine):
            return lambda: engine.update_weights(state, version)

        await push_all(
            self.engines, make_update, version, guard=self.guard, timeout_s=self.config.timeout_s
        )

    def close(self) -> None:
        self.latest = None
        if self._own_loop is not None and not self._own_loop.is_running():
            self._own_loop.close()
        self._own_loop = None


class InProcessReceiver:
    """Pulls the snapshot an ``InProcessPublisher(keep_latest=True)`` keeps."""

    def __init__(self, publisher: InProcessPublisher):
        if not publisher.keep_latest:
            raise ValueError("InProcessReceiver needs a publisher made with keep_latest=True")
        self.publisher = publisher
        self.peer = "in-process publisher"

    async def latest_version(self) -> int | None:
        return self.publisher.version if self.publisher.latest is not None else None

    async def receive(self, after: int | None) -> tuple[int, Mapping[str, torch.Tensor]]:
        version, latest = self.publisher.version, self.publisher.latest
        if latest is None or version is None:
            raise ValueError("nothing was published yet")
        check_version(version, after, peer=self.peer)
        return version, latest

    def close(self) -> None:
        pass
