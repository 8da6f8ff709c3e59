"""Moving a leaving cell's in-flight requests to the cells that keep serving.

``migrate`` exports every unfinished request from the source engine
(``EmbeddedEngine.export_inflight``), sends each running request's KV over a
:class:`KVTransport` as one packed byte buffer, and imports the requests into the target
engines, least loaded first. The whole transfer has a window (``window_s``): a request
whose KV has not arrived within it is re-prefilled from its token ids by its target, and
the overrun is logged as ``RDMA_TRANSFER_FAILED`` and reported (``MigrationReport.failed``)
so that the driver can tell the policy and shrink the context per batch. Callers never
notice: their streams continue on the target.

Transports: :class:`CopyTransport` copies the bytes within the process;
:class:`MooncakeTransport` moves them between two Mooncake transfer engines (TCP here,
RDMA on clusters), the target reading the source's registered buffer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gyre_env.engines.base import EngineError
from gyre_env.engines.kv_migration import MigratingRequest, pack_kv, unpack_kv

log = logging.getLogger(__name__)

RDMA_TRANSFER_FAILED = "RDMA_TRANSFER_FAILED"
"""The event users grep for: a KV migration ran past its window and fell back to re-prefill."""


class KVTransferTimeout(EngineError):
    """A KV transfer did not finish within the migration window."""


class KVTransport(Protocol):
    """Moves one packed KV buffer (flat ``uint8``) to the target's memory."""

    name: str

    def send(self, buffer, *, deadline: float):
        """The buffer as it now sits on the target side; ``KVTransferTimeout`` when the
        monotonic ``deadline`` passed before it arrived."""
        ...


@dataclass
class CopyTransport:
    """In-process: the bytes are copied into a fresh buffer (what a target engine in the
    same process reads). ``seconds_per_gb`` adds a modelled link delay for tests of the
    window; 0 measures the copy alone."""

    name: str = "in-process copy"
    seconds_per_gb: float = 0.0

    def send(self, buffer, *, deadline: float):
        if self.seconds_per_gb:
            delay = buffer.numel() / 1e9 * self.seconds_per_gb
            time.sleep(max(0.0, min(delay, deadline - time.monotonic() + 1e-3)))
        out = buffer.clone()
        if time.monotonic() > deadline:
            raise KVTransferTimeout(f"{self.name}: {buffer.numel()} bytes arrived past the window")
        return out


class MooncakeTransport:
    """KV bytes over Mooncake: the source side registers a send buffer, the target side
    reads it into its own registered buffer (``transfer_sync_read``) under the deadline.
    Both transfer engines live in this process here; across nodes each side is its own."""

    def __init__(self, *, protocol: str = "tcp", host: str = "127.0.0.1", device_name: str = ""):
        from gyre_env._optional import require

        engine_mod = require("mooncake.engine", "KV migration over Mooncake")
        self.name = f"mooncake {protocol}"
        self._ends = []
        for _ in range(2):
            engine = engine_mod.TransferEngine()
            rc = engine.initialize(host, "P2PHANDSHAKE", protocol, device_name)
            if rc != 0:
                raise EngineError(f"Mooncake TransferEngine.initialize({host!r}) returned {rc}")
            self._ends.append((engine, f"{host}:{engine.get_rpc_port()}"))
        self._buffers: list = []  # [send, receive], grown (and registered) as needed
        self._abandoned: list = []  # buffers a timed-out read may still write into

    def _ensure(self, nbytes: int) -> None:
        import torch

        if self._buffers and self._buffers[0].numel() >= nbytes:
            return
        size = 1 << max(20, (nbytes - 1).bit_length())  # powers of two: few re-registrations
        for (engine, _), buf in zip(self._ends, self._buffers, strict=False):
            engine.unregister_memory(buf.data_ptr())
        self._buffers = []
        for engine, session in self._ends:
            buf = torch.empty(size, dtype=torch.uint8)
            if engine.register_memory(buf.data_ptr(), size) != 0:
                raise EngineError(f"Mooncake register_memory({size}) failed on {session}")
            self._buffers.append(buf)

    def send(self, buffer, *, deadline: float):
        from gyre_env.weightsync.base import SyncTimeoutError, call_with_deadline

        n = buffer.numel()
        self._ensure(n)
        out, into = self._buffers
        out[:n].copy_(buffer)
        (_, source), (reader, _) = self._ends
        left = deadline - time.monotonic()
        if left <= 0:
            raise KVTransferTimeout(f"{self.name}: the window closed before {n} bytes were sent")

        def read() -> int:
            return reader.transfer_sync_read(source, into.data_ptr(), out.data_ptr(), n)

        try:
            rc = call_with_deadline(read, timeout_s=left, peer=source, what="KV read")
        except SyncTimeoutError as e:
            self._abandoned.append(self._buffers)
            self._buffers = []
            raise KVTransferTimeout(f"{self.name}: {n} bytes not read within the window") from e
        if rc < 0:
            raise EngineError(f"{self.name}: read of {n} bytes from {source} returned {rc}")
        return into[:n].clone()


@dataclass
class MigrationReport:
    """What one migration did and how long each part took."""

    requests: int = 0
    with_kv: int = 0
    """Requests that continued from their transferred KV."""
    reprefilled: int = 0
    """Requests the targets prefill again from their ids (queued, or past the window)."""
    kv_bytes: int = 0
    export_s: float = 0.0
    transfer_s: float = 0.0
    import_s: float = 0.0
    failed: bool = False
    """The window was exceeded (``RDMA_TRANSFER_FAILED``)."""
    targets: dict[str, int] = field(default_factory=dict)
    """Requests per target engine."""
    produced: list[int] = field(default_factory=list)
    """Per moved request: output ids it had when exported (what came before the move)."""
    transport: str = ""

    @property
    def total_s(self) -> float:
        return self.export_s + self.transfer_s + self.import_s


async def migrate(
    source,
    targets: Sequence,
    *,
    window_s: float = 8.0,
    transport: KVTransport | None = None,
    keep_kv: bool = True,
) -> MigrationReport:
    """Move ``source``'s unfinished requests to ``targets`` (engines of this process)."""
    if not targets:
        raise ValueError("migrate needs at least one target engine")
    transport = transport or CopyTransport()
    report = MigrationReport(transport=transport.name)
    t0 = time.monotonic()
    moved = await source.export_inflight()
    report.export_s = time.monotonic() - t0
    report.requests = len(moved)
    report.produced = [len(m.request.output_ids) for m in moved]
    t1 = time.monotonic()
    deadline = t0 + window_s
    sent: set[int] = set()
    try:
        for i, item in enumerate(moved):
            if item.keys is not None and keep_kv:
                await asyncio.to_thread(_send, item, transport, deadline)
                sent.add(i)
                report.kv_bytes += item.kv_nbytes
    except KVTransferTimeout as e:
        report.failed = True
        log.warning(
            "%s source=%s window=%.3gs: %s; re-prefilling the rest",
            RDMA_TRANSFER_FAILED,
            getattr(source, "name", "?"),
            window_s,
            e,
        )
    for i, item in enumerate(moved):
        if i not in sent:
            item.drop_kv()
    report.transfer_s = time.monotonic() - t1
    t2 = time.monotonic()
    await _spread(moved, targets, report)
    report.import_s = time.monotonic() - t2
    report.with_kv = sum(m.keys is not None for m in moved)
    report.reprefilled = report.requests - report.with_kv
    return report


def _send(item: MigratingRequest, transport: KVTransport, deadline: float) -> None:
    """Pack, send and unpack one request's KV (it then points at the received bytes)."""
    wire, layout = pack_kv(item.keys, item.values)
    received = transport.send(wire, deadline=deadline)
    item.keys, item.values = unpack_kv(received, layout)


async def _spread(moved: list[MigratingRequest], targets: Sequence, report: MigrationReport):
    """Least-loaded assignment of the moved requests over the targets."""
    load = {}
    for engine in targets:
        h = await engine.health()
        load[engine.name] = h["running"] + h["queued"]
    by_name = {e.name: e for e in targets}
    batches: dict[str, list] = {name: [] for name in by_name}
    for item in moved:
        name = min(load, key=load.__getitem__)
        load[name] += 1
        batches[name].append(item)
    for name, items in batches.items():
        if items:
            await by_name[name].import_inflight(items)
            report.targets[name] = len(items)
