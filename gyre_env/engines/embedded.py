"""EmbeddedEngine: a transformers causal LM served in-process, with continuous batching.

The default engine: it loads any local Hugging Face model folder (the built-in tiny model
when none is given), runs on CPU by default and on CUDA when present, and decodes
concurrent requests together. One background thread owns the model: it admits queued
requests (prefilling each alone, then merging its KV cache into the running batch, see
``kv_batch``), decodes one token for every running row per step, and hands tokens to each
request's asyncio queue. Greedy outputs of a request are the same whether it ran alone or
batched (up to float rounding, far below the tiny model's logit gaps).

Semantics the proxy relies on:

- ``pause()``: new requests raise ``EnginePausedError`` at once (the proxy's router waits
  and retries); requests already accepted, running or queued, finish.
- ``update_weights()`` / ``release_memory()`` wait until the requests accepted before the
  call have finished (later ones queue meanwhile, as SGLang's update lock does), so every
  request is sampled by exactly one weight version: the one in its result.
- ``release_memory()`` implies ``pause()``; ``resume_memory()`` reloads the weights and
  undoes that implied pause (an explicit earlier ``pause()`` stays in force).
- ``export_inflight()`` pauses and takes every unfinished request out between two decode
  steps (running ones with their KV); ``import_inflight()`` on another engine in the same
  process continues them: their callers keep reading the same stream (KV migration).
- A prompt that leaves no room for one new token raises ``ContextLengthError``; generation
  stops with ``finish_reason="length"`` at ``max_new_tokens`` or at the context length.
- Logprobs follow ``sampling`` (temperature-scaled, before top-p/top-k truncation).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import gc
import inspect
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gyre_env._optional import require
from gyre_env.engines.base import (
    ContextLengthError,
    EngineError,
    EnginePausedError,
    GenerateResult,
    SamplingParams,
    TokenChunk,
)
from gyre_env.engines.kv_batch import KVBatch, cache_is_mergeable, filled_cache, new_cache
from gyre_env.engines.kv_migration import MigratingRequest
from gyre_env.engines.prefix_cache import PrefixCache
from gyre_env.engines.sampling import make_generator, sample_rows, validate_params


@dataclass(kw_only=True)
class EmbeddedEngineConfig:
    """How to load and serve the model."""

    model_path: str | None = None
    """A local Hugging Face model folder; None uses the built-in tiny model."""
    name: str = "embedded"
    """Replica name shown in records, health and metrics."""
    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: str = "auto"
    """``auto`` (float32 on CPU; the checkpoint's dtype on CUDA), ``float32``, ``bfloat16``, ``float16``."""
    max_batch_size: int = 16
    """Most sequences decoded together; 1 disables batching."""
    context_length: int | None = None
    """Prompt + output limit in tokens; None uses the model's ``max_position_embeddings``."""
    prefill_chunk_tokens: int = 4096
    """Prompts are prefilled in chunks of this many tokens to bound activation memory."""
    prefix_cache_tokens: int = 16384
    """KV of recent prompts kept (tokens in all, least recently used out) so that a prompt
    sharing a prefix with one of them prefills only the rest (``prefix_cache``); 0 turns
    it off. Dropped when the weights change."""
    num_threads: int | None = None
    """torch CPU threads (process-wide: ``torch.set_num_threads``). None: 1 for a model under
    50M parameters on CPU, whose ops are too small to gain from threads and which slow down
    10-50x when its threads contend with other processes for the cores; else unchanged."""


class _Mailbox:
    """Hands items from the worker thread to one event loop, waking it at most once per drain.

    A wake-up (``call_soon_threadsafe``) costs a GIL hand-off between threads, which is
    slow on busy cores; tokens produced while a drain is already scheduled ride along.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._items: list = []
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, queue: asyncio.Queue, item) -> None:
        """Worker side; raises RuntimeError when the loop is closed."""
        with self._lock:
            self._items.append((queue, item))
            if self._scheduled:
                return
            self._scheduled = True
        if self.loop.is_closed():
            raise RuntimeError("event loop is closed")
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        for queue, item in items:
            queue.put_nowait(item)


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    mailbox: _Mailbox
    queue: asyncio.Queue
    max_new: int
    generator: object = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    cancelled: bool = False
    seq: int = 0
    """Acceptance order; control actions wait for requests accepted before them."""
    weight_version: int = 0
    prefill_s: float = 0.0
    decode_started: float = 0.0
    decode_s: float = 0.0
    kv: tuple | None = None
    """Migrated in: (keys, values) of ``prompt_ids + output_ids[:-1]``, joined at admission."""
    accepted: float = field(default_factory=time.perf_counter)
    queued_s: float | None = None
    """Seconds from acceptance to the first admission into the batch."""


_LOAD_LOCK = threading.Lock()
"""``from_pretrained`` is not thread-safe (it initialises on the meta device under global
context managers): engines of one process resuming at once load one after another."""

_DONE = object()  # queue sentinel: the request finished (its last chunk carried the reason)


class EmbeddedEngine:
    """The Engine protocol over an in-process transformers model (see the module docstring)."""

    def __init__(self, config: EmbeddedEngineConfig | None = None, **overrides):
        if config is not None and overrides:
            raise TypeError("pass either an EmbeddedEngineConfig or keyword overrides, not both")
        self.config = config or EmbeddedEngineConfig(**overrides)
        if self.config.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.config.max_batch_size}")
        self._torch = require("torch", "the embedded engine")
        require("transformers", "the embedded engine")
        self.name = self.config.name
        self.model_path = self._resolve_path(self.config.model_path)
        self.device = self._resolve_device(self.config.device)
        self._model = self._load(self.model_path)
        self._set_threads()
        model_cfg = self._model.config
        self.vocab_size = int(self._model.get_input_embeddings().weight.shape[0])
        eos = getattr(self._model.generation_config, "eos_token_id", None)
        self.eos_token_ids: list[int] = [eos] if isinstance(eos, int) else list(eos or [])
        """The model's end-of-turn ids; not applied unless passed in ``stop_token_ids``."""
        max_pos = getattr(model_cfg, "max_position_embeddings", None)
        self.context_length = int(self.config.context_length or max_pos or 4096)
        mergeable = cache_is_mergeable(model_cfg)
        self._max_batch = self.config.max_batch_size if mergeable else 1
        self._weight_version = 0
        self._paused = False
        self._pause_implied = False
        self._released = False
        self._weights_modified = False  # state-dict updates since loading model_path
        self._offloaded: dict | None = None  # those weights, kept on CPU while released
        self._parked = None  # the released model, its weights in host buffers (on CUDA)
        self._park_on_release = self.device.type == "cuda"
        self._stash = None  # those buffers (gyre_env.host_stash), reused at every release
        self._cond = threading.Condition()
        self._pending: collections.deque[_Request] = collections.deque()
        self._control: collections.deque = collections.deque()  # (fn, future, barrier seq)
        self._urgent: collections.deque = collections.deque()  # (fn, future): no barrier
        self._next_seq = 0
        self._batch = KVBatch()
        self._prefix = PrefixCache(self.config.prefix_cache_tokens) if mergeable else None
        self._mailboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name=f"gyre-{self.name}", daemon=True)
        self._worker.start()

    # ---------------------------------------------------------------- loading

    @staticmethod
    def _resolve_path(path: str | None) -> Path:
        if path is None:
            from gyre_env.engines.tiny import tiny_model_path

            return tiny_model_path()
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"not a Hugging Face model folder (no config.json): {folder}")
        return folder

    def _resolve_device(self, device: str):
        torch = self._torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        if device != "cpu" and not device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
        return torch.device(device)

    def _set_threads(self) -> None:
        threads = self.config.num_threads
        if threads is None and self.device.type == "cpu":
            small = sum(p.numel() for p in self._model.parameters()) < 50_000_000
            threads = 1 if small else None
        if threads is not None:
            if threads < 1:
                raise ValueError(f"num_threads must be >= 1, got {threads}")
            self._torch.set_num_threads(threads)

    def _dtype(self):
        torch = self._torch
        choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if self.config.dtype == "auto":
            return torch.float32 if self.device.type == "cpu" else "auto"
        if self.config.dtype not in choices:
            raise ValueError(
                f"dtype must be auto or one of {sorted(choices)}, got {self.config.dtype!r}"
            )
        return choices[self.config.dtype]

    def _load(self, folder: Path):
        transformers = require("transformers", "the embedded engine")
        hf_logging = transformers.utils.logging
        bar_was_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            with _LOAD_LOCK:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(folder), dtype=self._dtype()
                )
        except Exception as e:
            raise EngineError(f"cannot load model from {folder}: {e}") from e
        finally:
            if bar_was_on:
                hf_logging.enable_progress_bar()
        model = model.to(self.device).eval()
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.2x names the cache argument `cache`; older ones `past_key_values`
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keep_arg = "logits_to_keep" in params
        return model

    # ---------------------------------------------------------------- public API

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def start(self) -> EmbeddedEngine:
        """Nothing to wait for (the model loads in the constructor); mirrors SGLangEngine."""
        return self

    async def aclose(self) -> None:
        """``close()`` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        req = self._submit(prompt_ids, params)
        finish = "abort"
        try:
            while (item := await req.queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                finish = item.finish_reason
        finally:
            req.cancelled = True  # no-op when finished; aborts it when the caller went away
        return GenerateResult(
            output_ids=list(req.output_ids),
            output_logprobs=list(req.output_logprobs),
            finish_reason=finish,
            weight_version=req.weight_version,
            prefill_s=req.prefill_s,
            decode_s=req.decode_s,
        )

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        """Yield one chunk per sampled token; the last one carries ``finish_reason``."""
        req = self._submit(prompt_ids, params)
        try:
            while (item := await req.queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            req.cancelled = True

    async def pause(self) -> None:
        with self._cond:
            self._paused = True
            self._pause_implied = False

    async def resume(self) -> None:
        with self._cond:
            if self._released:
                raise EngineError(f"{self.name}: memory is released; call resume_memory() first")
            self._paused = False
            self._pause_implied = False

    async def release_memory(self) -> None:
        """Pause, wait for accepted requests to finish, then drop the weights."""
        with self._cond:
            if self._released:
                return
            if not self._paused:
                self._paused, self._pause_implied = True, True
        await self._run_control(self._do_release)

    async def resume_memory(self) -> None:
        if not self._released:
            return
        await self._run_control(self._do_resume_memory)
        with self._cond:
            if self._pause_implied:
                self._paused, self._pause_implied = False, False

    async def update_weights(self, source: object, version: int) -> None:
        """Load weights from a state dict, a model folder or an ``nn.Module``; set ``version``.

        Waits for accepted requests to finish first; requests arriving meanwhile queue.
        """
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version must be an int, got {version!r}")
        if self._released:
            raise EngineError(f"{self.name}: memory is released; call resume_memory() first")
        await self._run_control(lambda: self._do_update(source, version))

    async def export_inflight(self) -> list[MigratingRequest]:
        """Pause, then take every accepted, unfinished request out of this engine between two
        decode steps: running ones with a copy of their KV, queued ones without."""
        await self.pause()
        return await self._run_now(self._do_export)

    async def import_inflight(self, items: list[MigratingRequest]) -> None:
        """Continue requests exported by another engine of this process (same model): those
        with KV join the batch as they are, the others are prefilled from their token ids
        (prompt + output so far). Accepted even while paused: they were accepted before."""
        with self._cond:
            if self._closed:
                raise EngineError(f"{self.name} is closed")
            for item in items:
                req = item.request
                req.kv = None if item.keys is None else (item.keys, item.values)
                req.seq, self._next_seq = self._next_seq, self._next_seq + 1
                self._pending.append(req)
            self._cond.notify_all()

    async def health(self) -> dict:
        with self._cond:
            status = "released" if self._released else "paused" if self._paused else "ok"
            return {
                "name": self.name,
                "status": status,
                "alive": self._worker.is_alive() and not self._closed,
                "weight_version": self._weight_version,
                "running": len(self._batch),
                "queued": len(self._pending),
                "device": str(self.device),
                "context_length": self.context_length,
                "max_batch_size": self._max_batch,
                "model_path": str(self.model_path),
                "prefix_cache": self._prefix.stats() if self._prefix is not None else None,
            }

    def close(self) -> None:
        """Stop the worker; requests not yet finished fail with EngineError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join(timeout=30)

    # ---------------------------------------------------------------- submission

    def _submit(self, prompt_ids: list[int], params: SamplingParams) -> _Request:
        validate_params(params)
        self._validate_prompt(prompt_ids)
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise ContextLengthError(
                f"prompt has {len(prompt_ids)} tokens; {self.name} has a context of "
                f"{self.context_length}, leaving no room for output"
            )
        req = _Request(
            prompt_ids=list(prompt_ids),
            params=params,
            mailbox=self._mailbox_for(asyncio.get_running_loop()),
            queue=asyncio.Queue(),
            max_new=min(params.max_new_tokens, room),
        )
        with self._cond:
            if self._closed:
                raise EngineError(f"{self.name} is closed")
            if self._paused:
                raise EnginePausedError(f"{self.name} is paused")
            req.seq, self._next_seq = self._next_seq, self._next_seq + 1
            self._pending.append(req)
            self._cond.notify_all()
        return req

    def _mailbox_for(self, loop: asyncio.AbstractEventLoop) -> _Mailbox:
        with self._cond:
            box = self._mailboxes.get(loop)
            if box is None:
                box = self._mailboxes[loop] = _Mailbox(loop)
            return box

    def _validate_prompt(self, prompt_ids: list[int]) -> None:
        if not isinstance(prompt_ids, list | tuple) or not prompt_ids:
            raise ValueError("prompt_ids must be a non-empty list of token ids")
        for i, t in enumerate(prompt_ids):
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"prompt_ids[{i}] = {t!r} is not a token id in [0, {self.vocab_size})"
                )

    async def _run_control(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the worker once every request accepted before this call has finished."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise EngineError(f"{self.name} is closed")
            self._control.append((fn, future, self._next_seq))
            self._cond.notify_all()
        await asyncio.wrap_future(future)

    async def _run_now(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` on the worker between two decode steps (no barrier) and return its result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise EngineError(f"{self.name} is closed")
            self._urgent.append((fn, future))
            self._cond.notify_all()
        return await asyncio.wrap_future(future)

    # ---------------------------------------------------------------- worker thread

    def _run(self) -> None:
        torch = self._torch
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._has_work():
                        self._cond.wait()
                    if self._closed:
                        break
                    control, admit = self._next_work()
                if control is not None:
                    self._run_control_item(*control)
                    continue
                for req in admit:
                    try:
                        self._admit(req)
                    except Exception as e:  # noqa: BLE001 - fail this request, keep serving
                        self._post(req, self._error(e, "prefill"))
                try:
                    if self._batch.rows:
                        self._decode_step()
                except Exception as e:  # noqa: BLE001 - fail the batch, keep serving
                    self._fail_all(self._error(e, "decode"))
        self._fail_all(EngineError(f"{self.name} is closed"))

    def _error(self, e: Exception, stage: str) -> EngineError:
        return EngineError(f"{self.name} failed in {stage}: {type(e).__name__}: {e}")

    def _has_work(self) -> bool:
        return bool(
            self._closed or self._batch.rows or self._control or self._pending or self._urgent
        )

    def _next_work(self) -> tuple[tuple | None, list[_Request]]:
        """Under the lock: a control action to run now, or the requests to prefill now.

        A waiting control action is a barrier: requests accepted before it are served
        first, later ones wait until it has run (the queue is in acceptance order).
        """
        if self._urgent:
            return self._urgent.popleft(), []
        barrier = None
        if self._control:
            barrier = self._control[0][2]
            older_pending = bool(self._pending) and self._pending[0].seq < barrier
            if not self._batch.rows and not older_pending:
                fn, future, _ = self._control.popleft()
                return (fn, future), []
        admit = []
        while (
            self._pending
            and not self._released  # imported into a released engine: wait for resume_memory
            and len(self._batch) + len(admit) < self._max_batch
        ):
            if barrier is not None and self._pending[0].seq >= barrier:
                break
            req = self._pending.popleft()
            if not req.cancelled:
                admit.append(req)
        return None, admit

    def _run_control_item(self, fn, future) -> None:
        """Run one control action unless its caller already gave up (a cancelled wait, a
        timeout): then it never starts, so nothing is half-done. Once started, the caller
        can no longer cancel it (``set_running_or_notify_cancel``): it completes whole,
        and only the caller stops waiting. Either way the worker keeps serving."""
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting caller
            future.set_exception(e)
        else:
            future.set_result(result)

    def _admit(self, req: _Request) -> None:
        """Start a request: prefill it, or let its migrated KV join the batch."""
        if req.queued_s is None:
            req.queued_s = time.perf_counter() - req.accepted
        if req.kv is None:
            self._prefill(req)
            return
        keys, values = req.kv
        req.kv = None
        device = self.device
        keys = [k.to(device) for k in keys]
        values = [v.to(device) for v in values]
        req.weight_version = self._weight_version
        cache = filled_cache(self._model.config, keys, values)
        self._batch.add(req, cache, len(req.prompt_ids) + len(req.output_ids) - 1)

    def _do_export(self) -> list[MigratingRequest]:
        with self._cond:
            queued = [r for r in self._pending if not r.cancelled]
            self._pending.clear()
        out = [
            MigratingRequest(r, k, v) for r, k, v in self._batch.export_rows() if not r.cancelled
        ]
        for r in queued:
            keys, values = r.kv if r.kv is not None else (None, None)
            r.kv = None
            out.append(MigratingRequest(r, keys, values))
        return out

    def _prefill(self, req: _Request) -> None:
        """Prefill the prompt (and, for a request migrated without KV, its output so far)
        and sample the next token."""
        torch = self._torch
        start = time.perf_counter()
        if req.generator is None:
            req.generator = make_generator(req.params, self.device)
        req.weight_version = self._weight_version
        context = req.prompt_ids + req.output_ids
        hit = self._prefix.lookup(context) if self._prefix is not None else None
        if hit is None:
            cache, done = new_cache(self._model.config), 0
        else:
            done, keys, values = hit
            cache = filled_cache(self._model.config, keys, values)
        ids = torch.tensor([context], device=self.device)  # [1, context]
        chunk = max(1, self.config.prefill_chunk_tokens)
        kwargs = {self._cache_arg: cache, "use_cache": True}
        if self._keep_arg:
            kwargs["logits_to_keep"] = 1  # a 128k prompt needs only its last position's logits
        for lo in range(done, ids.shape[1], chunk):
            out = self._model(input_ids=ids[:, lo : lo + chunk], **kwargs)
        if self._prefix is not None:
            self._prefix.insert(
                context,
                [layer.keys for layer in cache.layers],
                [layer.values for layer in cache.layers],
            )
        tokens, logprobs = sample_rows(out.logits[:, -1, :], [req.params], [req.generator])
        req.prefill_s += time.perf_counter() - start
        if not req.output_ids:
            req.decode_started = time.perf_counter()
        if self._emit(req, tokens[0], logprobs[0]):
            self._batch.add(req, cache, len(context))

    def _decode_step(self) -> None:
        batch = self._batch
        live = [i for i, r in enumerate(batch.rows) if not r.cancelled]
        batch.remove(live)
        if not batch.rows:
            return
        inputs = batch.step_inputs([r.output_ids[-1] for r in batch.rows])
        out = self._model(**inputs, **{self._cache_arg: batch.cache})
        tokens, logprobs = sample_rows(
            out.logits[:, -1, :], [r.params for r in batch.rows], [r.generator for r in batch.rows]
        )
        keep = [
            i
            for i, (r, t, lp) in enumerate(zip(batch.rows, tokens, logprobs, strict=True))
            if self._emit(r, t, lp)
        ]
        batch.remove(keep)

    def _emit(self, req: _Request, token: int, logprob: float) -> bool:
        """Record and send one token; returns whether the request goes on."""
        req.output_ids.append(token)
        req.output_logprobs.append(logprob)
        finish = None
        if token in req.params.stop_token_ids:
            finish = "stop"
        elif len(req.output_ids) >= req.max_new:
            finish = "length"
        if finish is not None:
            req.decode_s = time.perf_counter() - req.decode_started
        chunk = TokenChunk(
            ids=[token], logprobs=[logprob], finish_reason=finish, weight_version=req.weight_version,
            queued_s=req.queued_s if len(req.output_ids) == 1 else None,
        )  # fmt: skip
        self._post(req, chunk)
        if finish is not None:
            self._post(req, _DONE)
        return finish is None and not req.cancelled

    def _post(self, req: _Request, item) -> None:
        try:
            req.mailbox.post(req.queue, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            req.cancelled = True

    def _fail_all(self, error: EngineError) -> None:
        """Fail running requests (and, once closed, queued ones and control actions)."""
        with self._cond:
            victims = list(self._batch.rows)
            controls = []
            if self._closed:
                victims += list(self._pending)
                controls = list(self._control) + [(fn, fut, None) for fn, fut in self._urgent]
                self._pending.clear()
                self._control.clear()
                self._urgent.clear()
        self._batch = KVBatch()
        for req in victims:
            self._post(req, error)
        for _, future, _ in controls:
            if future.set_running_or_notify_cancel():  # a cancelled one has nobody waiting
                future.set_exception(error)

    # ---------------------------------------------------------------- control actions (worker)

    def _do_update(self, source: object, version: int) -> None:
        torch = self._torch
        if isinstance(source, str | Path):
            # Loaded beside the old weights, so a bad folder leaves the engine serving.
            folder = self._resolve_path(str(source))
            model = self._load(folder)
            old, new = self._model.config.model_type, model.config.model_type
            vocab = int(model.get_input_embeddings().weight.shape[0])
            if (old, self.vocab_size) != (new, vocab):
                raise ValueError(
                    f"update_weights: {folder} holds a {new} model with vocab {vocab}; this "
                    f"engine serves {old} with vocab {self.vocab_size} (start a new engine "
                    "for another model)"
                )
            self._swap_model(model)
            self.model_path = folder
            self._weights_modified = False
        else:
            if isinstance(source, torch.nn.Module):
                source = source.state_dict()
            if not isinstance(source, Mapping):
                raise TypeError(
                    "update_weights source must be a state dict, a model folder path or an "
                    f"nn.Module, got {type(source).__name__}"
                )
            self._load_state(source)
        self._weight_version = version
        if self._prefix is not None:
            self._prefix.clear()  # its KV was computed by the old weights

    def _load_state(self, state: Mapping) -> None:
        own = self._model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise ValueError(f"update_weights: unknown parameter names {unknown[:5]}")
        for name, tensor in state.items():  # everything is checked before anything is copied
            if not isinstance(tensor, self._torch.Tensor) or tensor.device.type == "meta":
                raise TypeError(f"update_weights: {name} is not a tensor with data")
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(own[name].shape)}"
                )
        self._check_whole(state)
        with self._torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].device, own[name].dtype))
        self._weights_modified = True

    def _check_whole(self, state: Mapping) -> None:
        """A new version is accepted only whole: every parameter of the model present (a
        tied one under any of its names), else the engine would serve a mix of two versions
        under the new number. Raises naming the first few missing; nothing is copied."""
        aliases: dict[int, list[str]] = {}
        for name, param in self._model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(name)
        missing = [names[0] for names in aliases.values() if not any(n in state for n in names)]
        if missing:
            more = ", ..." if len(missing) > 5 else ""
            raise ValueError(
                f"update_weights: a version is accepted only whole; {len(missing)} of the "
                f"model's {len(aliases)} parameters are missing ({', '.join(missing[:5])}"
                f"{more}); the engine keeps version {self._weight_version}"
            )

    def _do_release(self) -> None:
        """Free the device memory. On CUDA the model is parked: its weights go to host
        buffers allocated at the first release and pinned (``gyre_env.host_stash``), and
        come back from them on resume, with no disk read and no rebuild (an H200 switch
        spent 2.8 s releasing a 1.5B engine through pageable copies and 1.3 s reloading
        it). Elsewhere the weights are dropped; updated ones are first copied to CPU
        (reloading model_path would lose them), unmodified ones are reloaded on resume."""
        if self._prefix is not None:
            self._prefix.clear()
        if self._park_on_release:
            from gyre_env.host_stash import HostStash, module_slots, park

            self._stash = self._stash or HostStash()
            park(self._stash, module_slots("engine", self._model))
            self._parked, self._model = self._model, None
        else:
            if self._weights_modified:
                self._offloaded = {
                    k: v.detach().to("cpu", copy=True) for k, v in self._model.state_dict().items()
                }
            self._swap_model(None)
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()
        self._released = True

    def _swap_model(self, model) -> None:
        """Serve ``model`` (None: no model) and free the old one's weights: reference
        counting frees them once dropped; a full collection (200 ms in a process that has
        transformers loaded) runs only when a reference cycle still holds them."""
        old = weakref.ref(self._model)
        self._model = model
        if old() is not None:
            gc.collect()

    def _do_resume_memory(self) -> None:
        if self._parked is not None:
            from gyre_env.host_stash import module_slots, unpark

            unpark(self._stash, module_slots("engine", self._parked), self.device)
            self._model, self._parked = self._parked, None
            self._released = False
            return
        self._model = self._load(self.model_path)
        if self._offloaded is not None:
            self._load_state(self._offloaded)
            self._offloaded = None
        self._released = False
