"""torch.distributed weight sync: the trainer broadcasts buckets to engines in other processes.

The publisher is rank 0 of a dedicated process group (gloo on CPU, NCCL on GPUs) that it
builds directly on a TCPStore it serves, under its own key prefix (``group_name``): it
never touches the default group, so a trainer's own ``init_process_group`` and this one
cannot cross. Receivers (ranks 1..world_size-1) connect to that store.

Per version: the publisher posts ``latest`` on the store (and a :class:`Manifest`'s layout
once, under its fingerprint), then broadcasts a header (version, bucket count,
``direct_bytes``, layout fingerprint) and the version's
*segments* (:func:`segments`): a tensor of at least ``direct_bytes`` goes on the wire
straight from the trainer's memory, with no packing copy; runs of smaller tensors are
packed into a staging bucket (packing run i+1 while run i is on the wire). Receivers
receive every segment straight into its place in their preallocated flat bucket buffers
(no unpacking copy: the tensors handed to the engine are views of them), stage all of
them before the engine swaps them in, then mark ``done/<version>/<rank>``. Every store wait and collective has the
``timeout_s`` deadline: a wrong world size, port or prefix fails within it (naming the
group, its address and the ranks), as does a peer that dies mid-broadcast. A failed
collective poisons the group; the next publish forms a new *generation* of it, which the
surviving receivers (and restarted ones) join, so a full resync follows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gyre_env._optional import require
from gyre_env.weightsync.base import (
    IncompleteVersionError,
    Manifest,
    SyncConfig,
    SyncTimeoutError,
    WeightSyncError,
    WholeVersions,
    alloc_buckets,
    check_version,
    layout_of,
    manifest_layout,
    named_list,
    open_store,
    plan_buckets,
    store_get,
    unpack_bucket,
)

if TYPE_CHECKING:
    import torch

BACKENDS = ("gloo", "nccl")
COLLECT_EVERY = 16
"""Versions between two clean-ups of the store's confirmation keys."""


@dataclass(kw_only=True)
class DistSyncConfig(SyncConfig):
    """Where the group meets and who is in it."""

    host: str = "127.0.0.1"
    """Address of the publisher's store (rank 0)."""
    port: int = 29650
    """Port of the publisher's store; not the trainer's own MASTER_PORT."""
    world_size: int = 2
    """Publisher plus every receiver."""
    group_name: str = "gyre-weights"
    """Store key prefix of this group; two groups on one store need two names."""
    backend: str = "gloo"
    """``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors, one GPU per rank)."""
    device: str = "cpu"
    """Where the buckets live: ``cpu`` for gloo, ``cuda[:N]`` for NCCL."""
    direct_bytes: int = 1 << 20
    """Tensors of at least this many bytes are broadcast straight from the trainer's
    memory (one collective each, no packing copy); smaller ones are packed into buckets.
    Only the publisher's value counts: it is sent in each version's header."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.world_size < 2:
            raise ValueError(
                f"world_size must be >= 2 (a publisher and a receiver), got {self.world_size}"
            )
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if not isinstance(self.direct_bytes, int) or self.direct_bytes < 1:
            raise ValueError(f"direct_bytes must be an int >= 1, got {self.direct_bytes!r}")

    @property
    def where(self) -> str:
        return (
            f"group {self.group_name!r} at {self.host}:{self.port} (world_size {self.world_size})"
        )


@dataclass(frozen=True)
class Segment:
    """One broadcast: bytes ``[start, end)`` of bucket ``bucket``; ``name`` is the tensor
    sent straight from the trainer's memory, or None for a packed run of small tensors."""

    bucket: int
    start: int
    end: int
    name: str | None


def segments(manifest: Manifest, direct_bytes: int) -> list[Segment]:
    """The broadcasts of one version, in order; both sides derive them from the manifest."""
    out: list[Segment] = []
    for i, bucket in enumerate(manifest.buckets):
        run: list[int] | None = None  # [start, end) of the packed run being built
        for spec in bucket.tensors:
            if spec.nbytes >= direct_bytes:
                if run is not None:
                    out.append(Segment(i, run[0], run[1], None))
                    run = None
                out.append(Segment(i, spec.offset, spec.offset + spec.nbytes, spec.name))
            elif spec.nbytes > 0:
                if run is None:
                    run = [spec.offset, spec.offset]
                run[1] = spec.offset + spec.nbytes
        if run is not None:
            out.append(Segment(i, run[0], run[1], None))
    return out


def layout_id(manifest: Manifest) -> int:
    """A 62-bit fingerprint of the layout (everything but the version)."""
    text = Manifest(version=0, buckets=manifest.buckets).to_json()
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 2


def _wire_bytes(tensor: torch.Tensor, device: str) -> torch.Tensor:
    """The tensor's bytes as a flat ``uint8`` view on ``device`` (copied only when it is
    not contiguous or lives elsewhere)."""
    torch = require("torch", "torch.distributed weight sync")
    src = tensor.detach()
    if src.device != torch.device(device):
        src = src.to(device)
    if not src.is_contiguous():
        src = src.contiguous()
    return src.reshape(-1).view(torch.uint8)


class _Group:
    """One generation of the process group, with its store; shared by both sides."""

    def __init__(self, config: DistSyncConfig, rank: int, store, generation: int):
        self.config, self.rank, self.generation = config, rank, generation
        dist = require("torch.distributed", "torch.distributed weight sync")
        timeout = datetime.timedelta(seconds=config.timeout_s)
        prefixed = dist.PrefixStore(f"gen{generation}", store)
        peer = f"{config.where}, generation {generation}"
        try:
            if config.backend == "gloo":
                self.pg = dist.ProcessGroupGloo(prefixed, rank, config.world_size, timeout)
            else:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self.pg = dist.ProcessGroupNCCL(prefixed, rank, config.world_size, options)
        except (RuntimeError, dist.DistError) as e:
            raise SyncTimeoutError(
                f"rank {rank} could not form the group within {config.timeout_s:g}s "
                f"(are world_size, port and group_name the same on every rank?): {e}",
                peer=peer,
            ) from e
        self._dist = dist

    def broadcast(self, tensor: torch.Tensor):
        """Start a broadcast from rank 0; returns its Work (``.wait()`` raises past the deadline)."""
        return self.pg.broadcast([tensor], self._dist.BroadcastOptions())


def _pack_run(bucket, seg: Segment, tensors: dict, out: torch.Tensor) -> None:
    """Pack the small tensors of ``seg`` into ``out`` (``out[0]`` is bucket byte ``seg.start``)."""
    for spec in bucket.tensors:
        if seg.start <= spec.offset and spec.offset + spec.nbytes <= seg.end and spec.nbytes:
            at = spec.offset - seg.start
            out[at : at + spec.nbytes].copy_(_wire_bytes(tensors[spec.name], str(out.device)))


class DistPublisher:
    """Rank 0: serves the store and broadcasts each published version."""

    def __init__(self, config: DistSyncConfig):
        self.config = config
        self.version: int | None = None
        self._store = open_store(
            config.host, config.port, serve=True, prefix=config.group_name,
            timeout_s=config.timeout_s, peer=config.where,
        )  # fmt: skip
        self._generation = 0
        self._group: _Group | None = None
        self._buffers: list = []
        self._posted: list[int] = []  # versions whose keys are still on the store
        self._plan_key: tuple | None = None
        self._manifest: Manifest | None = None
        self._layout_id = 0
        self._whole = WholeVersions("this publisher")

    def _ensure_group(self) -> _Group:
        if self._group is None:
            self._group = _Group(self.config, 0, self._store, self._generation)
        return self._group

    def _staging(self, size: int) -> list:
        torch = require("torch", "torch.distributed weight sync")
        if len(self._buffers) != 2 or self._buffers[0].numel() < size:
            self._buffers = [
                torch.empty(size, dtype=torch.uint8, device=self.config.device) for _ in range(2)
            ]
        return self._buffers

    def _broadcast(self, group: _Group, manifest: Manifest, tensors: dict) -> None:
        """Header, then every segment: large tensors straight from ``tensors``, packed
        runs through two staging buffers (run i+1 is packed while run i is on the wire)."""
        torch = require("torch", "torch.distributed weight sync")
        device, direct = self.config.device, self.config.direct_bytes
        plan = segments(manifest, direct)
        packed = [s.end - s.start for s in plan if s.name is None]
        staging = self._staging(max(packed)) if packed else []
        header = [manifest.version, len(manifest.buckets), direct, self._layout_id]
        header = torch.tensor(header, dtype=torch.int64).to(device)
        works: list = [None, None]  # the last broadcast out of each staging buffer
        direct_works: list = [group.broadcast(header)]  # not waited for: ops stay in order
        slot = 0
        for seg in plan:
            if seg.name is not None:
                direct_works.append(group.broadcast(_wire_bytes(tensors[seg.name], device)))
                continue
            if works[slot] is not None:
                works[slot].wait()  # this buffer's previous broadcast must be done
            buf = staging[slot][: seg.end - seg.start]
            _pack_run(manifest.buckets[seg.bucket], seg, tensors, buf)
            works[slot] = group.broadcast(buf)
            slot = 1 - slot
        for work in [*direct_works, *works]:
            if work is not None:
                work.wait()

    def publish(self, named_tensors: Mapping | Iterable, version: int) -> None:
        """Broadcast ``version`` to every receiver; blocks until each has it staged."""
        named = named_list(named_tensors)
        check_version(version, self.version, peer="this publisher")
        self._whole.check(layout_of(named), version)  # every tensor of the first version
        manifest = self._plan(named, version)
        if self._group is None:
            self._generation += 1  # receivers join the generation named in ``latest``
        self.version = version
        self._posted.append(version)
        self._store.set("latest", f"{self._generation}:{version}")
        group = self._ensure_group()
        try:
            self._broadcast(group, manifest, dict(named))
        except RuntimeError as e:
            self._group = None  # a failed collective poisons the group: re-form next time
            raise WeightSyncError(
                f"broadcast of version {version} failed; ranks without a completed receive: "
                f"{self._missing(version)}: {e}",
                peer=f"{self.config.where}, generation {group.generation}",
            ) from e
        self._wait_done(version, group.generation)
        self._collect(version)

    def _plan(self, named: list, version: int) -> Manifest:
        """This version's manifest; its layout is posted once (``layout/<id>``), so an
        unchanged layout costs no store write and receivers that know it no read."""
        key = (self.config.bucket_bytes, [(n, t.dtype, tuple(t.shape)) for n, t in named])
        if key != self._plan_key:
            manifest = plan_buckets(named, self.config.bucket_bytes, version)
            self._layout_id = layout_id(manifest)
            self._store.set(f"layout/{self._layout_id}", manifest.to_json())
            self._plan_key, self._manifest = key, manifest
        return dataclasses.replace(self._manifest, version=version)

    def _collect(self, version: int) -> None:
        """Every receiver confirmed ``version``: now and then, delete the confirmations
        of older versions (nobody reads them again), so the store does not grow."""
        if len(self._posted) < COLLECT_EVERY:
            return
        for old in (v for v in self._posted if v != version):
            for rank in range(1, self.config.world_size):
                self._store.delete_key(f"done/{old}/{rank}")
        self._posted = [version]

    def _missing(self, version: int) -> list[int]:
        ranks = range(1, self.config.world_size)
        return [r for r in ranks if store_get(self._store, f"done/{version}/{r}") is None]

    def _wait_done(self, version: int, generation: int) -> None:
        """Receivers mark a version done once staged; wait for all (the store wakes us
        when the keys appear, no polling), within the deadline."""
        keys = [f"done/{version}/{r}" for r in range(1, self.config.world_size)]
        try:
            self._store.wait(keys, datetime.timedelta(seconds=self.config.timeout_s))
        except RuntimeError:  # DistStoreError too: past the deadline, or the store failed
            missing = self._missing(version)
            if not missing:
                return
            raise SyncTimeoutError(
                f"ranks {missing} did not confirm version {version} "
                f"within {self.config.timeout_s:g}s",
                peer=f"{self.config.where}, generation {generation}",
            ) from None

    def close(self) -> None:
        self._group = None
        self._buffers = []


class DistReceiver:
    """Rank ``rank`` (1..world_size-1): joins the publisher's group and stages versions."""

    def __init__(self, config: DistSyncConfig, rank: int):
        if not 0 < rank < config.world_size:
            raise ValueError(f"a receiver's rank must be in 1..{config.world_size - 1}, got {rank}")
        self.config = config
        self.rank = rank
        self.peer = f"rank 0 of {config.where}"
        self._store = None
        self._group: _Group | None = None
        self._buffers: list = []
        self._tensors: dict = {}  # views into _buffers, one per tensor of the layout
        self._manifest: Manifest | None = None
        self._layout_id: int | None = None
        self._layout: tuple | None = None
        self._whole = WholeVersions(self.peer)

    def _board(self):
        if self._store is None:
            cfg = self.config
            self._store = open_store(
                cfg.host, cfg.port, serve=False, prefix=cfg.group_name,
                timeout_s=cfg.timeout_s, peer=self.peer,
            )  # fmt: skip
        return self._store

    def _latest(self) -> tuple[int, int] | None:
        try:
            raw = store_get(self._board(), "latest")
        except RuntimeError as e:  # the publisher (and its store) went away
            self._store = self._group = None
            raise WeightSyncError(f"lost the store: {e}", peer=self.peer) from e
        if raw is None:
            return None
        generation, version = raw.decode().split(":")
        return int(generation), int(version)

    async def latest_version(self) -> int | None:
        latest = await asyncio.to_thread(self._latest)
        return None if latest is None else latest[1]

    async def receive(self, after: int | None) -> tuple[int, Mapping[str, torch.Tensor]]:
        return await asyncio.to_thread(self._receive, after)

    def _receive(self, after: int | None) -> tuple[int, dict[str, torch.Tensor]]:
        latest = self._latest()
        if latest is None:
            raise WeightSyncError("nothing was published yet", peer=self.peer)
        generation, version = latest
        if self._group is None or self._group.generation != generation:
            self._group = _Group(self.config, self.rank, self._board(), generation)
        try:
            return self._stage(after)
        except IncompleteVersionError:
            raise  # received in full: the group is in step, only the version is refused
        except RuntimeError as e:
            self._group = None
            self._store = None  # reconnect: a restarted publisher serves a new store
            raise WeightSyncError(f"receiving version {version} failed: {e}", peer=self.peer) from e

    def _stage(self, after: int | None) -> tuple[int, dict[str, torch.Tensor]]:
        torch = require("torch", "torch.distributed weight sync")
        header = torch.zeros(4, dtype=torch.int64, device=self.config.device)
        self._group.broadcast(header).wait()
        version, count, direct, layout = (int(x) for x in header.tolist())
        check_version(version, after, peer=self.peer)
        if layout != self._layout_id:  # a new layout: fetch it once
            self._manifest = Manifest.from_json(self._store.get(f"layout/{layout}"))
            self._layout_id = layout
        manifest = dataclasses.replace(self._manifest, version=version)
        if len(manifest.buckets) != count:
            raise WeightSyncError(
                f"version {version}: header says {count} buckets, manifest {len(manifest.buckets)}",
                peer=self.peer,
            )
        if manifest.layout() != self._layout:
            self._buffers = alloc_buckets(manifest, self.config.device)
            self._tensors = {}
            for bucket, buf in zip(manifest.buckets, self._buffers, strict=True):
                self._tensors.update(unpack_bucket(bucket, buf))  # views, made once
            self._layout = manifest.layout()
        works = [
            self._group.broadcast(self._buffers[seg.bucket][seg.start : seg.end])
            for seg in segments(manifest, direct)
        ]
        for work in works:
            work.wait()
        # received in full (the group stays in step), but a version lacking tensors of the
        # first one is not staged: no ``done``, and the engine keeps its version
        self._whole.check(manifest_layout(manifest), version)
        tensors = dict(self._tensors)
        self._store.set(f"done/{version}/{self.rank}", "1")
        return version, tensors

    def close(self) -> None:
        self._group = None
        self._store = None
        self._buffers = []
        self._tensors = {}
