"""SGLangEngine: the Engine protocol as an async HTTP client of an SGLang server.

SGLang serves on GPUs; Gyre talks to its native HTTP API (``sglang.srt.entrypoints.
http_server``), token ids only, and never its OpenAI layer (the proxy owns tokenization):

- ``POST /generate`` with ``input_ids``, ``sampling_params`` and ``return_logprob: true``;
  ids and logprobs come from ``meta_info.output_token_logprobs`` (``[logprob, id, text]``);
  streaming is SSE (``data: {...}`` lines, ``data: [DONE]``), cumulative or incremental
  (``--incremental-streaming-output``): ``meta_info.completion_tokens`` says how many are new.
- ``/pause_generation`` (``{"mode": ...}``), ``/continue_generation``,
  ``/release_memory_occupation``, ``/resume_memory_occupation``,
  ``/update_weights_from_disk | _from_tensor | _from_distributed`` (each with
  ``weight_version``, a string in SGLang: Gyre sends ``str(int)``), ``/get_weight_version``
  (``/get_model_info`` on older servers), ``/health``, ``/v1/models`` (context length).

Differences from the embedded engine, by SGLang's design:
- SGLang also stops at the model's own EOS ids (its ``ignore_eos`` would disable
  ``stop_token_ids`` too), so pass the end-of-turn id in ``stop_token_ids`` anyway.
- ``pause()`` holds running requests in place (``pause_mode="in_place"``) until ``resume()``
  instead of letting them finish; new requests raise ``EnginePausedError`` locally.
- Logprobs are SGLang's default: temperature-scaled, before top-p/top-k (as embedded).

It can launch ``python -m sglang.launch_server`` itself or attach to a running server.
Nothing here imports sglang except the default tensor serializer for
``update_weights_from_tensor`` (SGLang's ``MultiprocessingSerializer``: CUDA IPC handles,
so the trainer must share the GPU host).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
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
from gyre_env.engines.sampling import validate_params

PAUSE_MODES = ("in_place", "retract", "abort")


@dataclass(kw_only=True)
class SGLangEngineConfig:
    """Where the server is, or how to launch it."""

    url: str | None = None
    """Attach to this server (e.g. ``http://10.0.0.5:30000``); None launches one."""
    model_path: str | None = None
    """Model folder for a launched server."""
    name: str = "sglang"
    """Replica name shown in records, health and metrics."""
    host: str = "127.0.0.1"
    port: int = 30000
    launch_command: list[str] = field(
        default_factory=lambda: [sys.executable, "-m", "sglang.launch_server"]
    )
    """Program that starts the server; ``--model-path/--host/--port`` are appended."""
    launch_args: list[str] = field(default_factory=list)
    """Extra server flags, e.g. ``["--tp", "2", "--mem-fraction-static", "0.7"]``."""
    launch_timeout_s: float = 900.0
    request_timeout_s: float = 3600.0
    context_length: int | None = None
    """None asks the server (``/v1/models`` ``max_model_len``)."""
    pause_mode: str = "in_place"
    """SGLang's ``/pause_generation`` mode: ``in_place`` | ``retract`` | ``abort``."""
    tp_size: int = 1
    """Tensor-parallel size: ``update_weights_from_tensor`` sends one payload per rank."""
    api_key: str | None = None
    """Sent as a bearer token when the server was launched with ``--api-key``."""
    drain_timeout_s: float = 600.0
    """How long ``release_memory`` waits for this client's running requests."""
    max_batch_size: int = 16
    """Concurrent requests this server is counted for (its capacity to a scheduler); the
    server's own limit is its ``--max-running-requests``."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of a launched server, e.g. ``{"CUDA_VISIBLE_DEVICES": "2,3"}``."""


@dataclass(kw_only=True)
class DistributedWeights:
    """Metadata of tensors the trainer broadcasts through a group opened with
    ``init_weights_update_group``; pass it to ``update_weights`` while broadcasting."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True


def _default_serializer(named_tensors: list) -> str:
    utils = require("sglang.srt.utils", "update_weights_from_tensor")
    return utils.MultiprocessingSerializer.serialize(named_tensors, output_str=True)


class SGLangEngine:
    """The Engine protocol over SGLang's HTTP API (see the module docstring)."""

    def __init__(
        self,
        config: SGLangEngineConfig | None = None,
        *,
        tensor_serializer: Callable[[list], str] | None = None,
        **overrides,
    ):
        if config is not None and overrides:
            raise TypeError("pass either an SGLangEngineConfig or keyword overrides, not both")
        self.config = config or SGLangEngineConfig(**overrides)
        if self.config.pause_mode not in PAUSE_MODES:
            raise ValueError(
                f"pause_mode must be one of {PAUSE_MODES}, got {self.config.pause_mode!r}"
            )
        if self.config.url is None and self.config.model_path is None:
            raise ValueError("SGLangEngine needs url (attach) or model_path (launch)")
        self._httpx = require("httpx", "the SGLang engine client")
        self.name = self.config.name
        self.url = (self.config.url or f"http://{self.config.host}:{self.config.port}").rstrip("/")
        self.context_length = self.config.context_length or 0
        self._serializer = tensor_serializer or _default_serializer
        self._weight_version = 0
        self._paused = False
        self._pause_implied = False
        self._released = False
        self._inflight = 0
        self._aborted = 0
        self._process: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self._client_cache: tuple[object, object] | None = None  # (event loop, AsyncClient)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> SGLangEngine:
        """Launch the server if configured to, wait until healthy, read context and version."""
        if self.config.url is None and self._process is None:
            self._launch()
        try:
            await self._wait_healthy(self.config.launch_timeout_s if self._process else 30.0)
            if not self.config.context_length:
                models = await self._request("GET", "/v1/models")
                self.context_length = int(models["data"][0]["max_model_len"])
            await self.refresh_weight_version()
        except BaseException:
            self.close()  # a server we launched must not outlive a failed start
            raise
        return self

    def _launch(self) -> None:
        cfg = self.config
        cmd = [*cfg.launch_command, "--model-path", str(cfg.model_path)]
        cmd += ["--host", cfg.host, "--port", str(cfg.port), *cfg.launch_args]
        fd, log = tempfile.mkstemp(prefix=f"gyre-{self.name}-", suffix=".log")
        self._log_path = Path(log)
        env = {**os.environ, **cfg.env} if cfg.env else None
        with os.fdopen(fd, "wb") as out:
            self._process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )

    async def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise EngineError(
                    f"{self.name}: server exited with code {self._process.returncode}; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                resp = await self._client().get(self.url + "/health", timeout=10.0)
                if resp.status_code == 200:
                    return
                last = f"HTTP {resp.status_code}"
            except self._httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            await asyncio.sleep(0.5)
        raise EngineError(f"{self.name}: {self.url} not healthy after {timeout_s:.0f}s ({last})")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of a launched server's log ('' when attached)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    async def aclose(self) -> None:
        """Close this loop's HTTP connections, then ``close()``."""
        if self._client_cache is not None and self._client_cache[0] is asyncio.get_running_loop():
            await self._client_cache[1].aclose()
            self._client_cache = None
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop a launched server (its whole process group); attached servers are left alone."""
        proc, self._process = self._process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    # ---------------------------------------------------------------- HTTP plumbing

    def _client(self):
        """An AsyncClient bound to the running event loop (httpx pools are per loop)."""
        loop = asyncio.get_running_loop()
        if self._client_cache is None or self._client_cache[0] is not loop:
            headers = (
                {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            )
            timeout = self._httpx.Timeout(self.config.request_timeout_s, connect=10.0)
            self._client_cache = (loop, self._httpx.AsyncClient(timeout=timeout, headers=headers))
        return self._client_cache[1]

    async def _request(self, method: str, path: str, body: dict | None = None):
        try:
            resp = await self._client().request(method, self.url + path, json=body)
        except self._httpx.HTTPError as e:
            raise EngineError(
                f"{self.name}: {method} {path} failed: {type(e).__name__}: {e}"
            ) from e
        if resp.status_code >= 400:
            self._raise_for(resp.status_code, resp.text, path)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    def _raise_for(self, status: int, text: str, path: str) -> None:
        message = text
        try:
            data = json.loads(text)
            err = data.get("error", data) if isinstance(data, dict) else data
            message = err.get("message", text) if isinstance(err, dict) else str(err)
        except ValueError:
            pass
        lowered = message.lower()
        if status == 400 and ("context length" in lowered or "longer than" in lowered):
            raise ContextLengthError(f"{self.name}: {message}")
        raise EngineError(f"{self.name}: {path} answered HTTP {status}: {message[:500]}")

    # ---------------------------------------------------------------- generation

    @property
    def weight_version(self) -> int:
        return self._weight_version

    def _payload(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> dict:
        validate_params(params)
        if not isinstance(prompt_ids, list | tuple) or not prompt_ids:
            raise ValueError("prompt_ids must be a non-empty list of token ids")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt_ids):
            raise ValueError("prompt_ids must hold non-negative int token ids")
        if self.context_length and len(prompt_ids) >= self.context_length:
            raise ContextLengthError(
                f"prompt has {len(prompt_ids)} tokens; {self.name} has a context of "
                f"{self.context_length}, leaving no room for output"
            )
        sampling = {
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "min_p": params.min_p,
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        return {
            "input_ids": list(prompt_ids),
            "sampling_params": sampling,
            "return_logprob": True,
            "stream": stream,
        }

    def _admit(self) -> None:
        if self._paused:
            raise EnginePausedError(f"{self.name} is paused")
        self._inflight += 1

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        payload = self._payload(prompt_ids, params, stream=False)
        self._admit()
        start = time.perf_counter()
        try:
            out = await self._request("POST", "/generate", payload)
        finally:
            self._inflight -= 1
        if not isinstance(out, dict) or "meta_info" not in out:
            raise EngineError(
                f"{self.name}: /generate returned an unexpected body: {str(out)[:200]}"
            )
        meta = out["meta_info"]
        ids, logprobs = _parse_logprobs(meta.get("output_token_logprobs") or [], self.name)
        finish = _finish_reason(meta.get("finish_reason"))
        self._aborted += finish == "abort"
        return GenerateResult(
            output_ids=ids,
            output_logprobs=logprobs,
            finish_reason=finish,
            weight_version=self._version_of(meta),
            decode_s=time.perf_counter() - start,
        )

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        """Yield new tokens as SGLang streams them; the last chunk carries ``finish_reason``."""
        payload = self._payload(prompt_ids, params, stream=True)
        self._admit()
        try:
            async with self._client().stream("POST", self.url + "/generate", json=payload) as resp:
                if resp.status_code >= 400:
                    self._raise_for(
                        resp.status_code, (await resp.aread()).decode(errors="replace"), "/generate"
                    )
                seen, finished = 0, False
                async for line in resp.aiter_lines():
                    chunk, seen = self._parse_event(line, seen)
                    if chunk is not None:
                        finished = chunk.finish_reason is not None
                        self._aborted += chunk.finish_reason == "abort"
                        yield chunk
                if not finished:
                    raise EngineError(f"{self.name}: stream ended without a finish reason")
        except self._httpx.HTTPError as e:
            raise EngineError(
                f"{self.name}: /generate stream failed: {type(e).__name__}: {e}"
            ) from e
        finally:
            self._inflight -= 1

    def _parse_event(self, line: str, seen: int) -> tuple[TokenChunk | None, int]:
        """One SSE line -> the chunk of tokens not yet seen (None for other lines)."""
        if not line.startswith("data:"):
            return None, seen
        data = line[5:].strip()
        if data == "[DONE]" or not data:
            return None, seen
        try:
            event = json.loads(data)
        except ValueError as e:
            raise EngineError(f"{self.name}: bad stream event {data[:200]!r}") from e
        if "error" in event:
            err = event["error"]
            message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            raise EngineError(f"{self.name}: generation failed: {message}")
        meta = event.get("meta_info", {})
        entries = meta.get("output_token_logprobs") or []
        total = int(meta.get("completion_tokens", seen + len(entries)))
        new = total - seen
        if new < 0 or new > len(entries):
            raise EngineError(
                f"{self.name}: stream event has {len(entries)} logprob entries for {new} new tokens"
            )
        ids, logprobs = _parse_logprobs(entries[len(entries) - new :] if new else [], self.name)
        reason = meta.get("finish_reason")
        finish = _finish_reason(reason) if reason is not None else None
        if not ids and finish is None:
            return None, total
        chunk = TokenChunk(
            ids=ids, logprobs=logprobs, finish_reason=finish, weight_version=self._version_of(meta)
        )
        return chunk, total

    def _version_of(self, meta: dict) -> int:
        version = parse_version(meta.get("weight_version"))
        return self._weight_version if version is None else version

    # ---------------------------------------------------------------- control

    async def pause(self) -> None:
        """Reject new requests here and pause the server's scheduler (``pause_mode``)."""
        self._paused, self._pause_implied = True, False
        await self._request("POST", "/pause_generation", {"mode": self.config.pause_mode})

    async def abort_inflight(self) -> int:
        """Hand this client's running requests back to their callers: pause the server with
        ``mode: abort`` (each running request ends with ``finish_reason`` ``abort`` and the
        tokens it produced) and wait until their streams have ended. SGLang exports no KV,
        so the proxy's router continues each one on another replica from its token ids
        (prompt + output so far: a re-prefill). Returns how many of this client's requests
        the server ended with ``abort`` since the last call (by this or by an
        ``abort``-mode ``pause``)."""
        self._paused = True
        await self._request("POST", "/pause_generation", {"mode": "abort"})
        await self._drain("after an abort")
        aborted, self._aborted = self._aborted, 0
        return aborted

    async def _drain(self, what: str) -> None:
        """Wait up to ``drain_timeout_s`` for this client's running requests to end."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._inflight:
            raise EngineError(f"{self.name}: {self._inflight} requests still running {what}")

    async def model_info(self) -> dict:
        """The server's ``/get_model_info`` (``model_path``, ``weight_version``, ...)."""
        out = await self._request("GET", "/get_model_info")
        if not isinstance(out, dict):
            raise EngineError(f"{self.name}: /get_model_info returned {str(out)[:200]!r}")
        return out

    async def resume(self) -> None:
        if self._released:
            raise EngineError(f"{self.name}: memory is released; call resume_memory() first")
        await self._request("POST", "/continue_generation", {})
        self._paused, self._pause_implied = False, False

    async def release_memory(self) -> None:
        """Stop admitting, wait for this client's running requests, then release GPU memory."""
        if self._released:
            return
        if not self._paused:
            self._paused, self._pause_implied = True, True
        await self._drain("after drain timeout")
        await self._request("POST", "/release_memory_occupation", {"tags": None})
        self._released = True

    async def resume_memory(self) -> None:
        if not self._released:
            return
        await self._request("POST", "/resume_memory_occupation", {"tags": None})
        self._released = False
        if self._pause_implied:
            self._paused, self._pause_implied = False, False

    async def update_weights(self, source: object, version: int) -> None:
        """Load weights: a folder path (from disk), a state dict or ``[(name, tensor)]``
        (from tensor), or ``DistributedWeights`` (from distributed, while the trainer broadcasts)."""
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"version must be an int, got {version!r}")
        if isinstance(source, str | Path):
            body = {"model_path": str(source), "weight_version": str(version)}
            out = await self._request("POST", "/update_weights_from_disk", body)
        elif isinstance(source, DistributedWeights):
            body = {
                "names": source.names,
                "dtypes": source.dtypes,
                "shapes": source.shapes,
                "group_name": source.group_name,
                "flush_cache": source.flush_cache,
                "weight_version": str(version),
            }
            out = await self._request("POST", "/update_weights_from_distributed", body)
        elif isinstance(source, Mapping | list):
            named = list(source.items()) if isinstance(source, Mapping) else list(source)
            payload = self._serializer(named)
            body = {
                "serialized_named_tensors": [payload] * self.config.tp_size,
                "flush_cache": True,
                "weight_version": str(version),
            }
            out = await self._request("POST", "/update_weights_from_tensor", body)
        else:
            raise TypeError(
                "update_weights source must be a model folder path, a state dict, a list of "
                f"(name, tensor) or DistributedWeights, got {type(source).__name__}"
            )
        if isinstance(out, dict) and out.get("success") is False:
            raise EngineError(f"{self.name}: weight update failed: {out.get('message')}")
        self._weight_version = version

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> None:
        """Open the torch.distributed group that ``DistributedWeights`` updates broadcast over."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        out = await self._request("POST", "/init_weights_update_group", body)
        if isinstance(out, dict) and out.get("success") is False:
            raise EngineError(
                f"{self.name}: init_weights_update_group failed: {out.get('message')}"
            )

    async def refresh_weight_version(self) -> int:
        """Read the server's weight version (``/get_weight_version``, else ``/get_model_info``)."""
        try:
            out = await self._request("GET", "/get_weight_version")
        except EngineError:
            out = await self._request("GET", "/get_model_info")
        version = parse_version(out.get("weight_version") if isinstance(out, dict) else None)
        if version is not None:
            self._weight_version = version
        return self._weight_version

    async def health(self) -> dict:
        """Probe ``/health`` (SGLang answers it by generating one token), except while
        released, when only a launched server's process is checked."""
        if self._released:
            alive = self._process is None or self._process.poll() is None
            code: int | str = "not probed (released)"
        else:
            try:
                resp = await self._client().get(self.url + "/health", timeout=30.0)
                alive, code = resp.status_code == 200, resp.status_code
            except self._httpx.HTTPError as e:
                alive, code = False, type(e).__name__
        status = "released" if self._released else "paused" if self._paused else "ok"
        return {
            "name": self.name,
            "status": status if alive else "down",
            "alive": alive,
            "http": code,
            "weight_version": self._weight_version,
            "running": self._inflight,
            "url": self.url,
            "context_length": self.context_length,
        }


def _parse_logprobs(entries: list, name: str) -> tuple[list[int], list[float]]:
    ids, logprobs = [], []
    for entry in entries:
        try:
            logprob, token = entry[0], entry[1]
            ids.append(int(token))
            logprobs.append(float(logprob) if logprob is not None else float("nan"))
        except (TypeError, ValueError, IndexError) as e:
            raise EngineError(f"{name}: bad output_token_logprobs entry {entry!r}") from e
    return ids, logprobs


def _finish_reason(reason) -> str:
    """SGLang's ``{"type": "stop"|"length"|"abort", ...}`` -> ``stop`` | ``length`` | ``abort``."""
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return kind if kind in ("stop", "length", "abort") else "abort"


def parse_version(value) -> int | None:
    """A weight version as SGLang reports it (``"3"``, ``3``, missing) -> ``int`` or None."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
