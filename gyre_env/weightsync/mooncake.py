"""Mooncake transfer-engine weight sync: engines read the trainer's registered buffers.

The publisher packs each version into one of ``slots`` flat regions, each registered
once (per layout) with its Mooncake ``TransferEngine``, and posts one record per version
(its session ``host:rpc_port``, slot, address and the :class:`Manifest`) on a TCPStore
board it serves. Engines pull: each one reads the whole region, every bucket at once,
with one batched transfer (``batch_transfer_sync_read``; a single entry, since both
regions have the same layout) into its own registered staging region, under a deadline.
``protocol="tcp"`` with ``"P2PHANDSHAKE"`` metadata needs no metadata server (this
machine); ``"rdma"`` is the same code on clusters. Over TCP the transfer engine moves
``tcp_chunk_bytes`` per socket operation (``MC_TCP_SLICE_SIZE``; its 64 KiB default
costs about half the loopback bandwidth here).

Publishing never waits for readers, so a reader may overlap the slot being rewritten; the
board marks a slot ``-1`` before rewriting it and its version after (a seqlock), and a
reader that finds its slot changed after the transfer discards what it read and retries
with the newest version: a torn read is never handed to an engine.

Old records are garbage-collected: after posting a version the publisher deletes the
records of all but the newest ``keep_versions``. That is safe for a reader mid-read of
an old version: the record is only read before the transfer, and the data it points to
is guarded by the slot marker, not by the record; a reader whose record is gone, or
whose slot changed, retries with the newest version, exactly as for a rewritten slot.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from gyre_env._optional import require
from gyre_env.weightsync.base import (
    ALIGN,
    Manifest,
    SyncConfig,
    SyncTimeoutError,
    WeightSyncError,
    WholeVersions,
    check_version,
    layout_of,
    manifest_layout,
    named_list,
    open_store,
    pack_bucket,
    plan_buckets,
    store_get,
    unpack_bucket,
)

if TYPE_CHECKING:
    import torch

PROTOCOLS = ("tcp", "rdma")
POLL_S = 0.0002
"""Sleep between two checks of a running read's status."""


@dataclass(kw_only=True)
class MooncakeSyncConfig(SyncConfig):
    """The transfer engine's setup and the board's address."""

    local_host: str = "127.0.0.1"
    """This process's address as peers reach it (its Mooncake session host)."""
    protocol: str = "tcp"
    """``tcp`` (anywhere) or ``rdma`` (InfiniBand/RoCE NICs)."""
    metadata: str = "P2PHANDSHAKE"
    """Metadata service: ``P2PHANDSHAKE`` (peers exchange it directly) or an etcd/HTTP URL."""
    device_name: str = ""
    """RDMA NIC names (``mlx5_0,mlx5_1``); empty for TCP or auto-discovery."""
    board_host: str = "127.0.0.1"
    """Address of the publisher's TCPStore board."""
    board_port: int = 29660
    group_name: str = "gyre-weights-mooncake"
    """Board key prefix; two publishers on one board need two names."""
    slots: int = 2
    """Registered bucket sets on the publisher: 2 lets readers finish version N while
    N+1 is packed (publisher memory: slots x model bytes)."""
    max_retries: int = 3
    """Reads retried when the slot was rewritten during the transfer."""
    keep_versions: int | None = None
    """Version records kept on the board (the newest ones; older ones are deleted).
    None keeps ``slots`` of them: an older version's slot has been rewritten anyway."""
    tcp_chunk_bytes: int = 1 << 20
    """Bytes per socket read/write of Mooncake's TCP transport (``MC_TCP_SLICE_SIZE``,
    process-wide, read when the first transfer starts; a value already in the
    environment wins)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.keep_versions is not None and self.keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {self.keep_versions}")
        if self.tcp_chunk_bytes < 4096:
            raise ValueError(f"tcp_chunk_bytes must be >= 4096, got {self.tcp_chunk_bytes}")


def _transfer_engine(config: MooncakeSyncConfig):
    """A started TransferEngine and its session name (``host:rpc_port``)."""
    engine_mod = require("mooncake.engine", "Mooncake weight sync")
    os.environ.setdefault("MC_TCP_SLICE_SIZE", str(config.tcp_chunk_bytes))
    engine = engine_mod.TransferEngine()
    rc = engine.initialize(config.local_host, config.metadata, config.protocol, config.device_name)
    if rc != 0:
        raise WeightSyncError(
            f"TransferEngine.initialize({config.local_host!r}, {config.metadata!r}, "
            f"{config.protocol!r}) returned {rc}",
            peer=config.local_host,
        )
    return engine, f"{config.local_host}:{engine.get_rpc_port()}"


def _registered(engine, nbytes: int, peer: str) -> torch.Tensor:
    torch = require("torch", "Mooncake weight sync")
    buf = torch.empty(max(nbytes, ALIGN), dtype=torch.uint8)
    rc = engine.register_memory(buf.data_ptr(), buf.numel())
    if rc != 0:
        raise WeightSyncError(f"register_memory of {buf.numel()} bytes returned {rc}", peer=peer)
    return buf


def _offsets(manifest: Manifest) -> list[int]:
    """Start of each bucket inside one contiguous region (aligned)."""
    out, at = [], 0
    for b in manifest.buckets:
        out.append(at)
        at += -(-max(b.nbytes, 1) // ALIGN) * ALIGN
    return out + [at]


class MooncakePublisher:
    """The core cell's side: registers bucket slots, packs versions into them, posts them."""

    def __init__(self, config: MooncakeSyncConfig | None = None):
        self.config = config or MooncakeSyncConfig()
        self.version: int | None = None
        self._engine, self.session = _transfer_engine(self.config)
        self._board = open_store(
            self.config.board_host, self.config.board_port, serve=True,
            prefix=self.config.group_name, timeout_s=self.config.timeout_s, peer=self.session,
        )  # fmt: skip
        self._layout: tuple | None = None
        self._slots: list[torch.Tensor] = []
        self._next_slot = 0
        self._posted: list[int] = []  # versions with a record on the board, oldest first
        self._whole = WholeVersions(self.session)

    def publish(self, named_tensors: Mapping | Iterable, version: int) -> None:
        """Pack ``version`` into the next slot and post it; returns without waiting for readers."""
        named = named_list(named_tensors)
        check_version(version, self.version, peer=self.session)
        self._whole.check(layout_of(named), version)  # every tensor of the first version
        manifest = plan_buckets(named, self.config.bucket_bytes, version)
        offsets = _offsets(manifest)
        if manifest.layout() != self._layout:
            self._release_slots()
            self._slots = [
                _registered(self._engine, offsets[-1], self.session)
                for _ in range(self.config.slots)
            ]
            self._layout = manifest.layout()
        slot = self._next_slot
        self._next_slot = (slot + 1) % self.config.slots
        region = self._slots[slot]
        self._board.set(f"slot/{slot}", "-1")  # readers of this slot now retry
        tensors = dict(named)
        for bucket, at in zip(manifest.buckets, offsets, strict=False):
            pack_bucket(bucket, tensors, region[at : at + bucket.nbytes])
        self._board.set(f"slot/{slot}", str(version))
        where = {"session": self.session, "slot": slot, "address": region.data_ptr()}
        record = {"where": where, "manifest": asdict(manifest)}
        self._board.set(f"record/{version}", json.dumps(record, separators=(",", ":")))
        self._board.set("latest", str(version))
        self.version = version
        self._posted.append(version)
        self._collect()

    def _collect(self) -> None:
        """Delete the records of all but the newest ``keep_versions`` (see the module
        docstring for why readers mid-read stay safe)."""
        keep = self.config.keep_versions or self.config.slots
        while len(self._posted) > keep:
            self._board.delete_key(f"record/{self._posted.pop(0)}")

    @property
    def posted_versions(self) -> list[int]:
        """Versions whose records are still on the board, oldest first."""
        return list(self._posted)

    def _release_slots(self) -> None:
        for buf in self._slots:
            self._engine.unregister_memory(buf.data_ptr())
        self._slots = []

    def close(self) -> None:
        self._release_slots()
        self._layout = None


class MooncakeReceiver:
    """An engine's side: pulls the newest version with batched reads into staging buffers."""

    def __init__(self, config: MooncakeSyncConfig | None = None):
        self.config = config or MooncakeSyncConfig()
        self._engine, self.session = _transfer_engine(self.config)
        self.peer = (
            f"Mooncake publisher via board {self.config.board_host}:{self.config.board_port}"
        )
        self._board = None
        self._layout: tuple | None = None
        self._staging: torch.Tensor | None = None
        self._views: dict = {}  # the tensors' views into _staging, made once per layout
        self._abandoned: list = []  # buffers a timed-out transfer may still write into
        self._whole = WholeVersions(self.peer)

    def _store(self):
        if self._board is None:
            cfg = self.config
            self._board = open_store(
                cfg.board_host, cfg.board_port, serve=False, prefix=cfg.group_name,
                timeout_s=cfg.timeout_s, peer=self.peer,
            )  # fmt: skip
        return self._board

    def _get(self, key: str) -> bytes | None:
        try:
            return store_get(self._store(), key)
        except RuntimeError as e:  # the publisher and its board went away
            self._board = None
            raise WeightSyncError(f"lost the board: {e}", peer=self.peer) from e

    async def latest_version(self) -> int | None:
        raw = await asyncio.to_thread(self._get, "latest")
        return None if raw is None else int(raw)

    async def receive(self, after: int | None) -> tuple[int, Mapping[str, torch.Tensor]]:
        return await asyncio.to_thread(self._receive, after)

    def _receive(self, after: int | None) -> tuple[int, dict[str, torch.Tensor]]:
        for _ in range(self.config.max_retries + 1):
            raw = self._get("latest")
            if raw is None:
                raise WeightSyncError("nothing was published yet", peer=self.peer)
            version = check_version(int(raw), after, peer=self.peer)
            record = self._get(f"record/{version}")
            if record is None:  # collected: newer versions were posted meanwhile
                continue
            record = json.loads(record)
            manifest = Manifest.from_dict(record["manifest"])
            self._whole.check(manifest_layout(manifest), version)  # before any read
            where = record["where"]
            self._read(manifest, where)
            if self._get(f"slot/{where['slot']}") == str(version).encode():
                return version, dict(self._views)
        raise WeightSyncError(
            f"the slot was rewritten during each of {self.config.max_retries + 1} reads "
            "(publishing faster than a read; raise slots)",
            peer=self.peer,
        )

    def _read(self, manifest: Manifest, where: dict) -> None:
        """One batched read of the publisher's whole region into the staging region."""
        size = _offsets(manifest)[-1]
        if manifest.layout() != self._layout or self._staging is None:
            self._staging = _registered(self._engine, size, self.session)
            self._views = {}
            for bucket, at in zip(manifest.buckets, _offsets(manifest), strict=False):
                self._views.update(unpack_bucket(bucket, self._staging[at : at + bucket.nbytes]))
            self._layout = manifest.layout()
        peer = f"Mooncake publisher {where['session']}"
        try:
            self._transfer(where["session"], self._staging.data_ptr(), where["address"], size, peer)
        except WeightSyncError:
            self._abandoned.append(self._staging)  # the read may still land in it
            self._staging, self._layout, self._views = None, None, {}
            raise

    def _transfer(self, session: str, local: int, remote: int, size: int, peer: str) -> None:
        """Submit the read, then poll its status with short sleeps until the deadline.

        Not ``batch_transfer_sync_read``: its wait spins on a core, which on a small
        machine is the core the transfer engine's own I/O thread needs (measured: ~40%
        of the bandwidth lost on 2 cores)."""
        batch = self._engine.batch_transfer_async_read(session, [local], [remote], [size])
        if batch == 0 or batch >= 1 << 63:  # 0, or -1 as an unsigned batch id
            raise WeightSyncError(
                f"could not submit a read of {size} bytes (peer gone?)", peer=peer
            )
        deadline = time.monotonic() + self.config.timeout_s
        while (status := self._engine.transfer_check_status(batch)) == 0:
            if time.monotonic() > deadline:
                raise SyncTimeoutError(
                    f"batched read of {size} bytes did not finish within "
                    f"{self.config.timeout_s:g}s",
                    peer=peer,
                )
            time.sleep(POLL_S)
        if status != 1:
            raise WeightSyncError(
                f"batched read of {size} bytes returned {status} (peer gone?)", peer=peer
            )

    def close(self) -> None:
        self._staging = None
        self._views = {}
        self._board = None
