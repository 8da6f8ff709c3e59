"""SGLang weight sync: the trainer pushes each version into SGLang servers over their API.

Three ways in, by ``SGLangSyncConfig.mode``:

- ``tensor``: ``/update_weights_from_tensor``, one call per bucket (the trainer shares the
  GPU host: SGLang's serializer passes CUDA IPC handles).
- ``distributed``: ``/init_weights_update_group`` once, then per version one
  ``/update_weights_from_distributed`` call while this process broadcasts every tensor
  (rank 0 of the group; the server's ranks follow). The group is TCPStore + PrefixStore
  (``group_name``) + a gloo/NCCL group, as SGLang's ``init_custom_process_group`` builds it.
- ``disk``: a Hugging Face folder per version under ``export_dir`` (safetensors, written to
  a temporary folder and renamed), then ``/update_weights_from_disk``.

Atomicity: the server is paused (``/pause_generation``, in place) before the first bucket
and continued only after the last, so no token is sampled from a partial update; every
call carries ``weight_version`` and afterwards the server's ``/get_weight_version`` must
read the new version (an endpoint that answers 200 without loading is caught). A failed
update leaves the server paused and out of routing until a full resync succeeds.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gyre_env._optional import require
from gyre_env.weightsync.base import (
    SyncConfig,
    SyncTimeoutError,
    WeightSyncError,
    WholeVersions,
    check_version,
    layout_of,
    named_list,
    plan_buckets,
    tcp_store,
)
from gyre_env.weightsync.replicas import RoutingGuard, push_all

if TYPE_CHECKING:
    from gyre_env.engines.sglang import SGLangEngine
    from gyre_env.proxy.router import Router

log = logging.getLogger(__name__)

MODES = ("tensor", "distributed", "disk")


@dataclass(kw_only=True)
class SGLangSyncConfig(SyncConfig):
    """How weights reach the servers."""

    mode: str = "tensor"
    """``tensor`` | ``distributed`` | ``disk`` (see the module docstring)."""
    master_address: str = "127.0.0.1"
    """``distributed``: where this process serves the group's store (reachable by servers)."""
    master_port: int = 29670
    group_name: str = "weight_update_group"
    backend: str = "gloo"
    """``distributed``: ``nccl`` on GPUs; ``gloo`` for CPU tensors."""
    export_dir: str | None = None
    """``disk``: versions are written to ``<export_dir>/v<version>``."""
    base_model_path: str | None = None
    """``disk``: a model folder whose config and tokenizer files are copied beside the weights."""
    keep_exports: int = 2
    """``disk``: newest version folders kept; older ones are deleted."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "disk" and (self.export_dir is None or self.base_model_path is None):
            raise ValueError("mode 'disk' needs export_dir and base_model_path")


async def _server_version(engine: SGLangEngine) -> int | None:
    """The weight version the server itself reports (not the client's cached one)."""
    from gyre_env.engines.base import EngineError
    from gyre_env.engines.sglang import parse_version

    try:
        out = await engine._request("GET", "/get_weight_version")
    except EngineError:  # older servers
        out = await engine._request("GET", "/get_model_info")
    return parse_version(out.get("weight_version") if isinstance(out, dict) else None)


def _untied(named: list) -> dict:
    """CPU copies of ``named`` for safetensors, a tied tensor (``lm_head.weight`` sharing
    ``model.embed_tokens.weight``'s memory) once, under its first name, as
    ``save_pretrained`` writes it (the loader ties it back)."""
    out, seen = {}, set()
    for name, tensor in named:
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous().cpu()
    return out


class SGLangPublisher:
    """Pushes every version to a list of SGLang servers (see the module docstring)."""

    def __init__(
        self,
        engines: list[SGLangEngine],
        config: SGLangSyncConfig | None = None,
        *,
        router: Router | None = None,
    ):
        if not engines:
            raise ValueError("SGLangPublisher needs at least one engine")
        self.engines = list(engines)
        self.config = config or SGLangSyncConfig()
        self.guard = RoutingGuard(router)
        self.version: int | None = None
        self._group = None
        self._whole = WholeVersions("SGLang publisher")

    async def apublish(self, named_tensors: Mapping | Iterable, version: int) -> None:
        """Load ``version`` into every server; raises the first failure after trying all."""
        named = named_list(named_tensors)
        check_version(version, self.version, peer="SGLang publisher")
        self._whole.check(layout_of(named), version)  # every tensor of the first version
        self.version = version
        if self.config.mode == "distributed":
            await self._ensure_group()
            for engine in self.engines:  # one broadcast group: servers are fed in turn
                await push_all([engine], self._updater(named, version), version,
                               guard=self.guard, timeout_s=self.config.timeout_s)  # fmt: skip
            return
        if self.config.mode == "disk":
            folder = await asyncio.to_thread(self._export, named, version)
            named = [("__folder__", folder)]
        await push_all(
            self.engines, self._updater(named, version), version,
            guard=self.guard, timeout_s=self.config.timeout_s,
        )  # fmt: skip

    def _updater(self, named: list, version: int):
        def make(engine: SGLangEngine):
            async def update() -> None:
                await engine.pause()
                await self._load(engine, named, version)
                loaded = await _server_version(engine)
                if loaded != version:
                    raise WeightSyncError(
                        f"the server reports weight version {loaded!r} after loading {version} "
                        "(the update answered success without loading)",
                        peer=f"{engine.name} ({engine.url})",
                    )
                await engine.resume()  # only after a whole version: never on failure

            return update

        return make

    async def _load(self, engine: SGLangEngine, named: list, version: int) -> None:
        mode = self.config.mode
        if mode == "disk":
            await engine.update_weights(named[0][1], version)
        elif mode == "tensor":
            manifest = plan_buckets(named, self.config.bucket_bytes, version)
            tensors = dict(named)
            for bucket in manifest.buckets:
                await engine.update_weights(
                    [(t.name, tensors[t.name]) for t in bucket.tensors], version
                )
        else:
            await self._load_distributed(engine, named, version)

    async def _load_distributed(self, engine: SGLangEngine, named: list, version: int) -> None:
        from gyre_env.engines.sglang import DistributedWeights

        meta = DistributedWeights(
            names=[n for n, _ in named],
            dtypes=[str(t.dtype).removeprefix("torch.") for _, t in named],
            shapes=[list(t.shape) for _, t in named],
            group_name=self.config.group_name,
        )
        request = asyncio.ensure_future(engine.update_weights(meta, version))
        try:
            await asyncio.to_thread(self._broadcast, [t for _, t in named])
        except RuntimeError as e:
            request.cancel()
            self._group = None
            raise WeightSyncError(f"broadcast of version {version} failed: {e}",
                                  peer=f"{engine.name} ({engine.url})") from e  # fmt: skip
        await request

    def _broadcast(self, tensors: list) -> None:
        dist = require("torch.distributed", "SGLang distributed weight sync")
        for tensor in tensors:
            self._group.broadcast([tensor.detach().contiguous()], dist.BroadcastOptions()).wait()

    async def _ensure_group(self) -> None:
        """Open one group per server (rank 0 here, the server's ranks after it)."""
        if self._group is not None:
            return
        if len(self.engines) != 1:
            raise ValueError("mode 'distributed' drives one server per publisher (one group)")
        engine = self.engines[0]
        cfg = self.config
        world = 1 + engine.config.tp_size
        joined = asyncio.ensure_future(
            engine.init_weights_update_group(
                master_address=cfg.master_address, master_port=cfg.master_port, rank_offset=1,
                world_size=world, group_name=cfg.group_name, backend=cfg.backend,
            )
        )  # fmt: skip
        try:
            self._group = await asyncio.to_thread(self._form_group, world)
        except BaseException:
            joined.cancel()
            raise
        await asyncio.wait_for(joined, cfg.timeout_s)

    def _form_group(self, world: int):
        dist = require("torch.distributed", "SGLang distributed weight sync")
        cfg = self.config
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        peer = f"group {cfg.group_name!r} at {cfg.master_address}:{cfg.master_port}"
        try:
            store = tcp_store(
                cfg.master_address, cfg.master_port, serve=True, timeout_s=cfg.timeout_s,
                world_size=world,
            )  # fmt: skip
            prefixed = dist.PrefixStore(cfg.group_name, store)
            if cfg.backend == "gloo":
                return dist.ProcessGroupGloo(prefixed, 0, world, timeout)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            return dist.ProcessGroupNCCL(prefixed, 0, world, options)
        except (RuntimeError, OSError, dist.DistError) as e:
            raise SyncTimeoutError(f"the server did not join within {cfg.timeout_s:g}s: {e}",
                                   peer=peer) from e  # fmt: skip

    def _export(self, named: list, version: int) -> str:
        """Write a Hugging Face folder for ``version``; keep the newest ``keep_exports``."""
        st = require("safetensors.torch", "SGLang disk weight sync")
        root = Path(self.config.export_dir)
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"v{version}"
        tmp = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=root))
        base = Path(self.config.base_model_path)
        for item in base.iterdir():
            if item.is_file() and not item.name.endswith((".safetensors", ".bin", ".pt")):
                shutil.copy2(item, tmp / item.name)
        (tmp / "model.safetensors.index.json").unlink(missing_ok=True)
        st.save_file(_untied(named), str(tmp / "model.safetensors"))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        versions = sorted(int(p.name[1:]) for p in root.glob("v*") if p.name[1:].isdigit())
        for old in versions[: -self.config.keep_exports]:
            shutil.rmtree(root / f"v{old}", ignore_errors=True)
        return str(final)

    def publish(self, named_tensors: Mapping | Iterable, version: int) -> None:
        """Blocking :meth:`apublish` (runs its own event loop)."""
        asyncio.run(self.apublish(named_tensors, version))

    def close(self) -> None:
        self._group = None


class SyncedSGLangEngine:
    """One SGLang server as an engine whose ``update_weights(named_tensors, version)``
    goes through its own :class:`SGLangPublisher` (``config.mode``: atomic, verified
    against the server's ``/get_weight_version``), so that the cells and the training
    loop, which push a trainer's named tensors, reach SGLang over its update API. Every
    other attribute is the wrapped :class:`~gyre_env.engines.sglang.SGLangEngine`'s.

    A failed update leaves the server paused and excluded from the router's routing by
    name (``attach_router``); the next update, of the same version or a newer one, is a
    full resync and brings it back."""

    def __init__(self, engine: SGLangEngine, config: SGLangSyncConfig):
        self.engine = engine
        self.publisher = SGLangPublisher([engine], config)
        self._good: int | None = None  # the last version this server loaded whole

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def attach_router(self, router: Router) -> None:
        """Failed updates take the server out of ``router``'s routing, resyncs readmit it."""
        self.publisher.guard.router = router

    @property
    def excluded(self) -> bool:
        """Whether the last update failed (the server is out of routing until a resync)."""
        return self.engine.name in self.publisher.guard.excluded

    def close(self) -> None:
        """Stop a launched server; hand an attached one back serving (its memory resumed,
        generation continued), as it was found, for whoever uses it next."""
        if self.engine.config.url is not None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                try:
                    asyncio.run(self._hand_back())
                except Exception as e:  # noqa: BLE001 - closing must not fail the run
                    log.warning("%s: could not resume the server on close: %s", self.name, e)
            else:
                log.warning("%s: closed inside an event loop; server left as it is", self.name)
        self.engine.close()

    async def _hand_back(self) -> None:
        try:
            await self.engine.resume_memory()
            await self.engine.resume()
        finally:
            await self.engine.aclose()

    async def update_weights(self, source: object, version: int) -> None:
        """Named tensors (a mapping or pairs) through the publisher; a folder path or
        ``DistributedWeights`` straight to the server (the caller moves the bytes)."""
        from gyre_env.engines.sglang import DistributedWeights

        if isinstance(source, str | Path | DistributedWeights):
            await self.engine.update_weights(source, version)
            return
        try:
            await self.publisher.apublish(source, version)
        except BaseException:
            self.publisher.version = self._good  # the resync may send this version again
            raise
        self._good = version
