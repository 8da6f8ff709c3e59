"""Mooncake transfer-engine weight sync: engines read the trainer's registered buffers.

The publisher packs each version into one of ``slots`` bucket sets registered with its
Mooncake ``TransferEngine`` and posts where they are (its session ``host:rpc_port``, slot,
addresses, the :class:`Manifest`) on a TCPStore board it serves. Engines pull: each one
reads every bucket with one batched transfer (``batch_transfer_sync_read``) into its own
registered staging buffers, under a deadline. ``protocol="tcp"`` with ``"P2PHANDSHAKE"``
metadata needs no metadata server (this machine); ``"rdma"`` is the same code on clusters.

Publishing never waits for readers, so a reader may overlap the slot being rewritten; the
board marks a slot ``-1`` before rewriting it and its version after (a seqlock), and a
reader that finds its slot changed after the transfer discards what it read and retries
with the newest version: a torn read is never handed to an engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gyre_env._optional import require
from gyre_env.weightsync.base import (
    ALIGN,
    Manifest,
    SyncConfig,
    WeightSyncError,
    call_with_deadline,
    check_version,
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

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")


def _transfer_engine(config: MooncakeSyncConfig):
    """A started TransferEngine and its session name (``host:rpc_port``)."""
    engine_mod = require("mooncake.engine", "Mooncake weight sync")
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

    def publish(self, named_tensors: Mapping | Iterable, version: int) -> None:
        """Pack ``version`` into the next slot and post it; returns without waiting for readers."""
        named = named_list(named_tensors)
        check_version(version, self.version, peer=self.session)
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
        self._board.set(f"manifest/{version}", manifest.to_json())
        self._board.set(f"where/{version}", json.dumps(where))
        self._board.set("latest", str(version))
        self.version = version

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
        self._abandoned: list = []  # buffers a timed-out transfer may still write into

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
            manifest = Manifest.from_json(self._get(f"manifest/{version}"))
            where = json.loads(self._get(f"where/{version}"))
            self._read(manifest, where)
            if self._get(f"slot/{where['slot']}") == str(version).encode():
                tensors: dict[str, torch.Tensor] = {}
                for bucket, at in zip(manifest.buckets, _offsets(manifest), strict=False):
                    tensors.update(unpack_bucket(bucket, self._staging[at : at + bucket.nbytes]))
                return version, tensors
        raise WeightSyncError(
            f"the slot was rewritten during each of {self.config.max_retries + 1} reads "
            "(publishing faster than a read; raise slots)",
            peer=self.peer,
        )

    def _read(self, manifest: Manifest, where: dict) -> None:
        offsets = _offsets(manifest)
        if manifest.layout() != self._layout or self._staging is None:
            self._staging = _registered(self._engine, offsets[-1], self.session)
            self._layout = manifest.layout()
        base = self._staging.data_ptr()
        sizes = [b.nbytes for b in manifest.buckets]
        keep = [i for i, n in enumerate(sizes) if n > 0]
        local = [base + offsets[i] for i in keep]
        remote = [where["address"] + offsets[i] for i in keep]
        lengths = [sizes[i] for i in keep]
        peer = f"Mooncake publisher {where['session']}"

        def transfer() -> int:
            return self._engine.batch_transfer_sync_read(where["session"], local, remote, lengths)

        try:
            rc = call_with_deadline(
                transfer, timeout_s=self.config.timeout_s, peer=peer, what="batched read"
            )
        except WeightSyncError:
            self._abandoned.append(self._staging)  # the read may still land in it
            self._staging, self._layout = None, None
            raise
        if rc < 0:
            raise WeightSyncError(
                f"batched read of {sum(lengths)} bytes returned {rc} (peer gone?)", peer=peer
            )

    def close(self) -> None:
        self._staging = None
        self._board = None
