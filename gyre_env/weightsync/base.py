"""The weight-sync contract: versioned, bucketed, dtype-preserving transfers with deadlines.

A trainer-side *publisher* takes ``publish(named_tensors, version)``: Hugging Face names and
full tensors (``Trainer.named_parameters()``), versions strictly increasing. Networked
transports flatten the tensors into *buckets* (flat ``uint8`` buffers of at most
``bucket_bytes``, one per transfer) described by a :class:`Manifest`: name, dtype, shape
and byte offset of every tensor, so the bytes arrive exactly as sent, bf16 stays bf16.

An engine-side *receiver* stages every bucket of one version in its own buffers and only
then hands the tensors to ``Engine.update_weights``, which swaps them in between decode
steps: an engine serves the old weights or the new ones, never a mix. Every blocking step
has a deadline; a failure raises :class:`WeightSyncError` naming the peer, never a hang.

Nothing here imports torch at module import; tensors are only touched inside functions.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from gyre_env._optional import require
from gyre_env.engines.base import EngineError

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

ALIGN = 64
"""Byte alignment of every tensor inside a bucket (any dtype can be viewed at it)."""


class WeightSyncError(EngineError):
    """A weight transfer failed. ``peer`` names the other side (an engine, a rank, a URL)."""

    def __init__(self, message: str, *, peer: str):
        super().__init__(f"weight sync with {peer}: {message}")
        self.peer = peer


class SyncTimeoutError(WeightSyncError):
    """A transfer or collective did not finish within its deadline."""


class VersionOrderError(WeightSyncError, ValueError):
    """A version that is not newer than the last one published or loaded."""


class IncompleteVersionError(WeightSyncError, ValueError):
    """A version that lacks some of the model's tensors, or carries one of another shape or
    dtype: refused whole, so the previous version stays (a partial update would serve a
    mix of two versions under the new version's number)."""


Layout = dict[str, tuple[tuple[int, ...], str]]
"""Tensor name -> (shape, dtype name without ``torch.``): what makes a version whole."""


def layout_of(named: Iterable | Mapping) -> Layout:
    """The ``Layout`` of ``(name, tensor)`` pairs (or a mapping of them)."""
    items = named.items() if isinstance(named, Mapping) else named
    return {n: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in items}


def check_whole(got: Layout, expected: Layout, *, version: int, peer: str) -> None:
    """Raise ``IncompleteVersionError`` unless ``got`` has exactly ``expected``'s tensors,
    shapes and dtypes; the error names the first few missing, unknown and mismatched."""
    missing = [n for n in expected if n not in got]
    unknown = [n for n in got if n not in expected]
    wrong = [
        f"{n}: {got[n]} not {expected[n]}"
        for n in expected
        if got.get(n, expected[n]) != expected[n]
    ]
    problems = []
    if missing:
        more = ", ..." if len(missing) > 5 else ""
        problems.append(
            f"{len(missing)} of its {len(expected)} tensors missing ({', '.join(missing[:5])}{more})"
        )
    if unknown:
        problems.append(f"unknown tensors {unknown[:5]}")
    if wrong:
        problems.append(f"shape/dtype mismatch {wrong[:3]}")
    if problems:
        raise IncompleteVersionError(
            f"version {version} refused, a version is accepted only whole: " + "; ".join(problems),
            peer=peer,
        )


def manifest_layout(manifest: Manifest) -> Layout:
    """The ``Layout`` a manifest describes."""
    return {t.name: (tuple(t.shape), t.dtype) for b in manifest.buckets for t in b.tensors}


class WholeVersions:
    """The layout of the first version a publisher sends or a receiver stages; every later
    version must have the same tensors, shapes and dtypes (``check_whole``). A trainer
    publishes all its parameters every time, so a version with fewer is a bug upstream."""

    def __init__(self, peer: str):
        self.peer = peer
        self.layout: Layout | None = None

    def check(self, layout: Layout, version: int) -> None:
        """Accept ``layout`` as the first, or check it against the first."""
        if self.layout is None:
            self.layout = dict(layout)
            return
        check_whole(layout, self.layout, version=version, peer=self.peer)


@dataclass(kw_only=True)
class SyncConfig:
    """Knobs every transport shares."""

    bucket_bytes: int = 128 << 20
    """Most bytes per bucket (one transfer or collective each); a larger tensor gets a
    bucket of its own. Bigger buckets mean fewer round trips, more staging memory."""
    timeout_s: float = 60.0
    """Deadline of each transfer, collective or engine swap; past it a SyncTimeoutError
    naming the peer is raised (the default ~ 1 GB over a slow link, with slack)."""

    def __post_init__(self) -> None:
        if not isinstance(self.bucket_bytes, int) or self.bucket_bytes < ALIGN:
            raise ValueError(f"bucket_bytes must be an int >= {ALIGN}, got {self.bucket_bytes!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor sits in its bucket."""

    name: str
    dtype: str
    """torch dtype name without ``torch.``: ``float32``, ``bfloat16``, ..."""
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BucketSpec:
    nbytes: int
    tensors: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class Manifest:
    """The layout of one published version: what a receiver needs to unpack the bytes."""

    version: int
    buckets: tuple[BucketSpec, ...]

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def names(self) -> list[str]:
        return [t.name for b in self.buckets for t in b.tensors]

    def layout(self) -> tuple:
        """Everything but the version: equal layouts can reuse the same buffers."""
        return tuple((b.nbytes, b.tensors) for b in self.buckets)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        buckets = tuple(
            BucketSpec(
                nbytes=b["nbytes"],
                tensors=tuple(
                    TensorSpec(**{**t, "shape": tuple(t["shape"])}) for t in b["tensors"]
                ),
            )
            for b in data["buckets"]
        )
        return cls(version=int(data["version"]), buckets=buckets)


def _torch():
    return require("torch", "weight sync")


def check_version(version: object, last: int | None, *, peer: str) -> int:
    """``version`` as an int, or VersionOrderError when it is not newer than ``last``."""
    if not isinstance(version, int) or isinstance(version, bool):
        raise TypeError(f"version must be an int, got {version!r}")
    if last is not None and version <= last:
        raise VersionOrderError(
            f"version {version} is not newer than {last} (versions must strictly increase)",
            peer=peer,
        )
    return version


def named_list(named_tensors: Mapping | Iterable) -> list[tuple[str, torch.Tensor]]:
    """Validate ``(name, tensor)`` pairs (or a mapping): unique names, dense CPU/CUDA tensors."""
    torch = _torch()
    items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
    if not items:
        raise ValueError("publish needs at least one named tensor")
    seen: set[str] = set()
    for entry in items:
        if not (isinstance(entry, tuple | list) and len(entry) == 2):
            raise TypeError(f"expected (name, tensor) pairs, got {type(entry).__name__}")
        name, tensor = entry
        if not isinstance(name, str) or not name:
            raise TypeError(f"tensor names must be non-empty strings, got {name!r}")
        if name in seen:
            raise ValueError(f"tensor name {name!r} appears twice")
        seen.add(name)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided or tensor.device.type == "meta":
            raise ValueError(f"{name}: only dense tensors with data can be synced")
    return [(n, t) for n, t in items]


def plan_buckets(
    named: list[tuple[str, torch.Tensor]], bucket_bytes: int, version: int
) -> Manifest:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (64-byte aligned)."""
    buckets: list[BucketSpec] = []
    specs: list[TensorSpec] = []
    used = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        start = -(-used // ALIGN) * ALIGN
        if specs and start + nbytes > bucket_bytes:
            buckets.append(BucketSpec(nbytes=used, tensors=tuple(specs)))
            specs, start = [], 0
        dtype = str(tensor.dtype).removeprefix("torch.")
        specs.append(TensorSpec(name, dtype, tuple(tensor.shape), start, nbytes))
        used = start + nbytes
    buckets.append(BucketSpec(nbytes=used, tensors=tuple(specs)))
    return Manifest(version=version, buckets=tuple(buckets))


def pack_bucket(bucket: BucketSpec, tensors: Mapping[str, torch.Tensor], out: torch.Tensor) -> None:
    """Copy the bucket's tensors, byte for byte, into the flat ``uint8`` buffer ``out``."""
    for spec in bucket.tensors:
        src = tensors[spec.name].detach()
        if not src.is_contiguous():
            src = src.contiguous()
        out[spec.offset : spec.offset + spec.nbytes].copy_(src.reshape(-1).view(_torch().uint8))


def unpack_bucket(bucket: BucketSpec, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of the bucket's tensors inside ``buffer`` (no copy), with their own dtypes."""
    torch = _torch()
    out = {}
    for spec in bucket.tensors:
        raw = buffer[spec.offset : spec.offset + spec.nbytes]
        out[spec.name] = raw.view(getattr(torch, spec.dtype)).view(spec.shape)
    return out


def alloc_buckets(manifest: Manifest, device: str = "cpu") -> list[torch.Tensor]:
    """One flat ``uint8`` buffer per bucket (at least one byte each)."""
    torch = _torch()
    return [
        torch.empty(max(b.nbytes, 1), dtype=torch.uint8, device=device) for b in manifest.buckets
    ]


def call_with_deadline(fn: Callable[[], T], *, timeout_s: float, peer: str, what: str) -> T:
    """Run a blocking ``fn`` (a native transfer that has no timeout of its own) on a
    daemon thread and wait at most ``timeout_s``. Past it, SyncTimeoutError: the thread
    may still finish later, so ``fn`` must only write into buffers nobody else reads."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            future.set_exception(e)

    threading.Thread(target=run, name=f"gyre-sync-{what}", daemon=True).start()
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise SyncTimeoutError(f"{what} did not finish within {timeout_s:g}s", peer=peer) from None


@runtime_checkable
class WeightPublisher(Protocol):
    """Trainer side of a transport."""

    def publish(self, named_tensors: Mapping | Iterable, version: int) -> None:
        """Make ``version`` of these tensors available to (or pushed into) every engine."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class WeightReceiver(Protocol):
    """Engine side of a transport: stages a whole version, then the engine swaps it in."""

    peer: str
    """Who the weights come from (shown in errors)."""

    async def latest_version(self) -> int | None:
        """The newest version available to pull (None when nothing was published yet)."""
        ...

    async def receive(self, after: int | None) -> tuple[int, Mapping[str, torch.Tensor]]:
        """Stage the newest version newer than ``after`` and return it with its tensors."""
        ...

    def close(self) -> None: ...


def open_store(host: str, port: int, *, serve: bool, prefix: str, timeout_s: float, peer: str):
    """A ``torch.distributed`` TCPStore under its own key prefix: the board where a
    publisher posts versions and layouts. ``serve`` hosts it (the publisher's side), listening
    on ``host`` only (see :func:`tcp_store`)."""
    dist = require("torch.distributed", "weight sync")
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"store prefix must be a non-empty string, got {prefix!r}")
    try:
        store = tcp_store(host, port, serve=serve, timeout_s=timeout_s)
    except (RuntimeError, OSError) as e:
        what = "serve" if serve else "reach"
        raise WeightSyncError(f"could not {what} the store at {host}:{port}: {e}", peer=peer) from e
    return dist.PrefixStore(prefix, store)


def tcp_store(
    host: str, port: int, *, serve: bool, timeout_s: float, world_size: int | None = None
):
    """A TCPStore at ``host:port``; ``serve`` hosts it, listening on exactly that address.

    torch's own server listens on every interface whatever ``host`` says, and a store has no
    authentication: anyone who reaches the port can read and write its keys. So the server
    side binds its listening socket here, to ``host`` alone, and hands it to torch."""
    import datetime
    import os
    import socket

    dist = require("torch.distributed", "a TCPStore")
    timeout = datetime.timedelta(seconds=timeout_s)
    if not serve:
        return dist.TCPStore(host, port, world_size, False, timeout=timeout, wait_for_workers=False)
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(512)
        bound_port = listener.getsockname()[1]
    except OSError:
        listener.close()
        raise
    fd = listener.detach()  # the store owns the socket from here (it closes it)
    try:
        return dist.TCPStore(
            host, bound_port, world_size, True, timeout=timeout, wait_for_workers=False,
            master_listen_fd=fd,
        )  # fmt: skip
    except BaseException:
        os.close(fd)
        raise


def store_get(store, key: str) -> bytes | None:
    """The value at ``key``, or None when it is not set (never blocks)."""
    return store.get(key) if store.check([key]) else None
