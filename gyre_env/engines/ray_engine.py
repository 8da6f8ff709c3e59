"""A cell's engine as a Ray actor: the embedded engine served from the cell's bundle.

``RayEngine`` is the Engine protocol (plus ``export_inflight`` / ``import_inflight``, what a
KV migration calls) over an :class:`EngineActor` that holds an :class:`EmbeddedEngine` in
its own process, placed where the caller says (the cell's placement-group bundle, next to
its trainer rank). The proxy's router, the cells and ``migrate`` use it exactly as they
use an in-process engine:

- ``stream`` is a Ray streaming generator: one object per sampled token, in order;
- a migration exports a request's state (its ids, sampler state and KV) out of the source
  actor, whose stream of that request then ends with a *moved* marker; importing it into
  the target actor starts a stream there, and the caller's iterator, which sees the
  marker, carries on from the target's stream (the two handles meet in this process);
- errors come back as the engine's own (``EnginePausedError``, ``ContextLengthError``,
  ``EngineError``), so the router retries and refuses as it does in-process.

KV bytes travel through Ray's object store via this process here (export, then import);
a Mooncake read between the actors' nodes is what would replace that on a cluster.

Needs the ``ray`` extra; the actor process needs the ``train`` extra (torch, transformers).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gyre_env._optional import require
from gyre_env.engines.base import EngineError, GenerateResult, SamplingParams, TokenChunk


@dataclass
class RequestState:
    """An exported request, as plain data: what the target needs to continue it exactly."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    max_new: int
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    weight_version: int = 0
    generator_state: object = None
    """``torch.Generator.get_state()`` of a seeded request (None: unseeded)."""
    prefill_s: float = 0.0
    decode_s: float = 0.0
    queued_s: float | None = None


@dataclass(frozen=True)
class Moved:
    """The source actor's last item for a request it exported."""

    rid: str


@dataclass(frozen=True)
class Finished:
    """The actor's last item for a finished request: its timings."""

    prefill_s: float
    decode_s: float


@dataclass(frozen=True)
class Adopted:
    """The target actor's first item for an imported request: it is in its queue."""

    rid: str


class EngineActor:
    """The actor body (``ray.remote(EngineActor)``; async, so calls interleave)."""

    def __init__(self, config: dict):
        from gyre_env.engines.embedded import EmbeddedEngine, EmbeddedEngineConfig

        self.engine = EmbeddedEngine(EmbeddedEngineConfig(**config))
        self._live: dict[int, str] = {}  # id(request) -> rid, while its stream is followed
        self._ids = itertools.count()

    async def info(self) -> dict:
        return {
            "name": self.engine.name,
            "context_length": self.engine.context_length,
            "weight_version": self.engine.weight_version,
            "pid": os.getpid(),
            "device": str(self.engine.device),
            **actor_placement(),
        }

    async def stream(self, prompt_ids: list[int], params: SamplingParams):
        req = self.engine._submit(prompt_ids, params)
        rid = f"{self.engine.name}.{next(self._ids)}.{os.getpid()}"
        async for item in self._follow(rid, req):
            yield item

    async def adopt(self, state: RequestState, keys, values):
        """Continue an exported request here; the first item says it is queued."""
        from gyre_env.engines.kv_migration import MigratingRequest

        req = self._request(state)
        await self.engine.import_inflight([MigratingRequest(req, keys, values)])
        yield Adopted(state.rid)
        async for item in self._follow(state.rid, req):
            yield item

    async def _follow(self, rid: str, req) -> AsyncIterator:
        from gyre_env.engines.embedded import _DONE

        self._live[id(req)] = rid
        try:
            while (item := await req.queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Moved):
                    return
            yield Finished(req.prefill_s, req.decode_s)
        finally:
            self._live.pop(id(req), None)
            req.cancelled = True  # no-op when finished or moved; aborts it when abandoned

    async def export(self) -> list[tuple[RequestState, object, object]]:
        """Take every unfinished request out (``EmbeddedEngine.export_inflight``): their
        states and KV; each one's stream here ends with a :class:`Moved` marker."""
        moved = await self.engine.export_inflight()
        out = []
        for m in moved:
            req = m.request
            rid = self._live.get(id(req))
            if rid is None:  # its caller is gone: nothing to continue
                continue
            out.append((_state(rid, req), m.keys, m.values))
            req.mailbox.post(req.queue, Moved(rid))
        return out

    def _request(self, state: RequestState):
        from gyre_env.engines.embedded import _Request
        from gyre_env.engines.sampling import make_generator

        req = _Request(
            prompt_ids=list(state.prompt_ids), params=state.params,
            mailbox=self.engine._mailbox_for(asyncio.get_running_loop()), queue=asyncio.Queue(),
            max_new=state.max_new, output_ids=list(state.output_ids),
            output_logprobs=list(state.output_logprobs), weight_version=state.weight_version,
            prefill_s=state.prefill_s, decode_s=state.decode_s, queued_s=state.queued_s,
        )  # fmt: skip
        if state.generator_state is not None:
            req.generator = make_generator(state.params, self.engine.device)
            req.generator.set_state(state.generator_state)
        return req

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self) -> None:
        await self.engine.resume()

    async def release_memory(self) -> None:
        await self.engine.release_memory()

    async def resume_memory(self) -> None:
        await self.engine.resume_memory()

    async def update_weights(self, tensors, version: int) -> int:
        await self.engine.update_weights(tensors, version)
        return self.engine.weight_version

    async def health(self) -> dict:
        return await self.engine.health()

    async def close(self) -> None:
        await self.engine.aclose()


def _state(rid: str, req) -> RequestState:
    gen = req.generator
    return RequestState(
        rid=rid, prompt_ids=list(req.prompt_ids), params=req.params, max_new=req.max_new,
        output_ids=list(req.output_ids), output_logprobs=list(req.output_logprobs),
        weight_version=req.weight_version,
        generator_state=None if gen is None else gen.get_state(),
        prefill_s=req.prefill_s, decode_s=req.decode_s, queued_s=req.queued_s,
    )  # fmt: skip


def actor_placement() -> dict:
    """Where this actor runs: its Ray node and the GPUs Ray gave it (none outside Ray)."""
    try:
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "gpus": ray.get_gpu_ids()}
    except Exception:  # noqa: BLE001 - outside Ray (a unit test of the body)
        return {"node": None, "gpus": []}


class _Handoff:
    """Where a moved request's two halves meet in this process: the source's iterator
    waits under the request id for the stream the target's import started. A stream
    nobody takes (its caller left while it moved) is cancelled after ``timeout_s``."""

    def __init__(self):
        self._futures: dict[str, asyncio.Future] = {}

    def _future(self, rid: str) -> asyncio.Future:
        fut = self._futures.get(rid)
        if fut is None:
            fut = self._futures[rid] = asyncio.get_running_loop().create_future()
        return fut

    def offer(self, rid: str, stream, cancel, timeout_s: float) -> None:
        fut = self._future(rid)
        if not fut.done():
            fut.set_result(stream)
        asyncio.get_running_loop().call_later(timeout_s, self._reap, rid, fut, cancel)

    def _reap(self, rid: str, fut: asyncio.Future, cancel) -> None:
        if self._futures.get(rid) is fut:  # offered, never taken
            del self._futures[rid]
            cancel(fut.result())

    async def take(self, rid: str, timeout_s: float):
        try:
            return await asyncio.wait_for(asyncio.shield(self._future(rid)), timeout_s)
        except asyncio.TimeoutError:
            raise EngineError(
                f"request {rid} was exported but no engine imported it within {timeout_s:g}s"
            ) from None
        finally:
            self._futures.pop(rid, None)


_HANDOFF = _Handoff()


@dataclass(kw_only=True)
class RayEngineOptions:
    """Where and how the actor runs."""

    num_cpus: float = 0.0
    """CPUs the actor reserves (0: it shares its bundle with the cell's trainer rank)."""
    num_gpus: float = 0.0
    scheduling_strategy: object = None
    """E.g. ``PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)``."""
    timeout_s: float = 600.0
    """Longest wait for one control call (pause, weights, export...)."""
    handoff_timeout_s: float = 60.0
    """Longest a moved request waits for its import."""


class RayEngine:
    """The Engine protocol over an :class:`EngineActor` (see the module docstring)."""

    def __init__(self, config: dict, options: RayEngineOptions | None = None, *, wait=True):
        """Start the actor (``config``: ``EmbeddedEngineConfig`` fields, checked here
        first) and, with ``wait``, wait until its model is loaded; :meth:`launch` starts
        several at once."""
        from gyre_env.engines.embedded import EmbeddedEngineConfig

        self._ray = require("ray", "engines as Ray actors")
        self.config = EmbeddedEngineConfig(**config)  # a bad field fails before any actor
        self.options = opts = options or RayEngineOptions()
        remote = self._ray.remote(EngineActor).options(
            num_cpus=opts.num_cpus, num_gpus=opts.num_gpus,
            scheduling_strategy=opts.scheduling_strategy, max_concurrency=1000,
        )  # fmt: skip
        self.actor = remote.remote(dict(config))
        self._info = self.actor.info.remote()
        if wait:
            self._wait_started()

    def _wait_started(self) -> None:
        try:
            self._started(self._get(self._info))
        except BaseException:
            self._ray.kill(self.actor)  # a failed start leaves no actor behind
            raise

    def _started(self, info: dict) -> None:
        self.name: str = info["name"]
        self.context_length: int = info["context_length"]
        self._version: int = info["weight_version"]
        self.node_id: str | None = info["node"]
        self.pid: int = info["pid"]
        self.device: str = info["device"]
        self.gpu_ids: list = info["gpus"]
        """The GPUs Ray gave the actor (``ray.get_gpu_ids()``); empty on CPUs."""

    @classmethod
    def launch(cls, specs) -> list[RayEngine]:
        """Start one actor per ``(config, options)`` together, then wait for all (a
        model loads in each at the same time)."""
        engines = [cls(config, options, wait=False) for config, options in specs]
        try:
            for e in engines:
                e._wait_started()
        except BaseException:
            for e in engines:
                e._ray.kill(e.actor)
            raise
        return engines

    # ---- plumbing
    @contextlib.contextmanager
    def _errors(self):
        """Ray's errors as the engine's own: a task's exception is re-raised as it was
        raised in the actor; a dead actor (or one that failed to start) is an EngineError
        naming the engine and the cause's last line, not a page of Ray's traceback."""
        try:
            yield
        except self._ray.exceptions.RayTaskError as e:
            raise _unwrap(e) from None
        except self._ray.exceptions.RayActorError as e:
            text = str(getattr(e, "error_msg", None) or e)
            why = [line for line in text.splitlines() if line.strip()][-1:] or [text]
            raise EngineError(
                f"engine actor {self.config.name!r} failed: {why[0].strip()}"
            ) from None

    def _get(self, ref):
        with self._errors():
            return self._ray.get(ref, timeout=self.options.timeout_s)

    async def _call(self, method: str, *args):
        ref = getattr(self.actor, method).remote(*args)
        with self._errors():
            return await asyncio.wait_for(_await_ref(ref), self.options.timeout_s)

    async def _first(self, gen):
        with self._errors():
            return await (await gen.__anext__())

    async def _items(self, gen) -> AsyncIterator:
        with self._errors():
            async for ref in gen:
                yield await ref

    # ---- the Engine protocol
    @property
    def weight_version(self) -> int:
        return self._version

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenChunk]:
        return self._stream(list(prompt_ids), params, None)

    async def _stream(self, prompt_ids, params, timings: list | None):
        gen = self.actor.stream.remote(prompt_ids, params)
        try:
            while True:
                moved = None
                async for item in self._items(gen):
                    if isinstance(item, TokenChunk):
                        yield item
                    elif isinstance(item, Moved):
                        moved = item.rid
                    elif isinstance(item, Finished) and timings is not None:
                        timings[:] = [item.prefill_s, item.decode_s]
                if moved is None:
                    return
                gen = await _HANDOFF.take(moved, self.options.handoff_timeout_s)
        finally:
            self._cancel(gen)  # abandoned: the actor aborts the request

    def _cancel(self, gen) -> None:
        with contextlib.suppress(Exception):  # it finished: nothing to cancel
            self._ray.cancel(gen)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        ids: list[int] = []
        logprobs: list[float] = []
        timings = [0.0, 0.0]
        finish, version = "abort", self._version
        async for chunk in self._stream(list(prompt_ids), params, timings):
            ids.extend(chunk.ids)
            logprobs.extend(chunk.logprobs)
            finish, version = chunk.finish_reason or finish, chunk.weight_version
        return GenerateResult(
            output_ids=ids, output_logprobs=logprobs, finish_reason=finish,
            weight_version=version, prefill_s=timings[0], decode_s=timings[1],
        )  # fmt: skip

    async def pause(self) -> None:
        await self._call("pause")

    async def resume(self) -> None:
        await self._call("resume")

    async def release_memory(self) -> None:
        await self._call("release_memory")

    async def resume_memory(self) -> None:
        await self._call("resume_memory")

    async def update_weights(self, source: object, version: int) -> None:
        """``source``: a state dict (sent through the object store), a model folder the
        actor's node can read, or an ``nn.Module`` (its state dict is sent)."""
        if hasattr(source, "state_dict") and callable(source.state_dict):
            source = {k: v.detach() for k, v in source.state_dict().items()}
        self._version = await self._call("update_weights", source, version)

    async def health(self) -> dict:
        h = await self._call("health")
        self._version = h["weight_version"]
        return {**h, "actor_pid": self.pid, "node_id": self.node_id}

    # ---- KV migration (``gyre_env.scheduler.migration.migrate``)
    async def export_inflight(self) -> list:
        from gyre_env.engines.kv_migration import MigratingRequest

        return [MigratingRequest(s, k, v) for s, k, v in await self._call("export")]

    async def import_inflight(self, items: list) -> None:
        """Continue exported requests here (from any ``RayEngine`` of this process)."""
        for item in items:
            state = item.request
            if not isinstance(state, RequestState):
                raise EngineError(
                    f"{self.name}: can import only requests a RayEngine exported, "
                    f"got {type(state).__name__}"
                )
            gen = self.actor.adopt.remote(state, item.keys, item.values)
            first = await self._first(gen)
            if first != Adopted(state.rid):
                raise EngineError(f"{self.name}: adopting {state.rid} returned {first!r}")
            _HANDOFF.offer(state.rid, gen, self._cancel, self.options.handoff_timeout_s)

    # ---- lifetime
    def close(self) -> None:
        with contextlib.suppress(Exception):  # a dead actor: kill it anyway
            self._ray.get(self.actor.close.remote(), timeout=60)
        self._ray.kill(self.actor)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


async def _await_ref(ref):
    return await ref


def _unwrap(error) -> Exception:
    """The engine's own exception inside a ``RayTaskError`` (else an EngineError)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, Exception):
        return cause
    return EngineError(str(error))
