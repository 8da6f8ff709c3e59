"""Model hosting for rollouts: the proxy, its engine, its record tap and its sandbox route.

``ModelService`` starts Gyre's proxy in-process in front of an engine (the embedded
engine with the built-in tiny model by default, or any local HF model folder), or in
front of an upstream API (passthrough), and gives each episode its own session:
``endpoint(session)`` is the ``ModelEndpoint`` an agent uses. Agents never build engines
or proxies; they only get that endpoint. Every call's TITO record goes to a JSONL file
through a ``RecordTap``, which also lets a CLI agent see its session's calls as they
finish (model-turn boundaries).

Sandboxes reach the proxy through a Unix socket (``route_socket``) that the proxy serves
itself (``ProxyConfig.sandbox_socket``) and a sandbox mounts read-only at ``/run/gyre``
(see ``gyre_env.sandbox.route``). Each episode's endpoint carries a key of its own
(``ModelEndpoint.api_key``, minted by the proxy per session): a request on that socket must
name its session and carry that session's key, so a sandbox cannot post into a sibling
episode, end it, or read the proxy's metrics. ``release`` retires the key when the episode
is over and lets the proxy evict the session.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gyre_env.proxy.endpoint import API_KINDS, ModelEndpoint
from gyre_env.proxy.records import CallRecord, JsonlSink, RecordSink

log = logging.getLogger(__name__)


class RecordTap:
    """A record sink that forwards to ``inner`` and keeps, per session, the records'
    timings so agents can wait for their next model call (thread-safe)."""

    def __init__(self, *inner: RecordSink):
        self.inner = [sink for sink in inner if sink is not None]
        self._cond = threading.Condition()
        self._calls: dict[str, list[dict]] = defaultdict(list)
        self._inflight: dict[str, int] = defaultdict(int)

    def write(self, record: CallRecord) -> None:
        for sink in self.inner:
            sink.write(record)
        summary = {
            "call_index": record.call_index,
            "branch": record.branch,
            "role": record.role,
            "prompt_tokens": len(record.prompt_ids),
            "output_tokens": len(record.output_ids),
            "seconds": float(record.timings.get("total", 0.0)),
            "finish": record.finish_reason,
        }
        with self._cond:
            self._calls[record.session].append(summary)
            self._cond.notify_all()

    def begin(self, session: str) -> None:
        """A model call of ``session`` arrived (see ``InflightCounter``)."""
        with self._cond:
            self._inflight[session] += 1

    def end(self, session: str) -> None:
        with self._cond:
            self._inflight[session] -= 1
            if self._inflight[session] <= 0:
                del self._inflight[session]

    def inflight(self, session: str) -> int:
        """Model calls of ``session`` in flight right now."""
        with self._cond:
            return self._inflight.get(session, 0)

    def calls(self, session: str) -> list[dict]:
        """Summaries of the session's finished calls, in the order they finished."""
        with self._cond:
            return list(self._calls.get(session, ()))

    def wait_for(self, session: str, count: int, timeout: float) -> int:
        """Block until the session has more than ``count`` calls or ``timeout`` passes;
        returns the number of calls."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._calls.get(session, ())) > count, timeout)
            return len(self._calls.get(session, ()))

    def forget(self, session: str) -> None:
        """Drop a finished session's summaries."""
        with self._cond:
            self._calls.pop(session, None)

    def close(self) -> None:
        for sink in self.inner:
            sink.close()


_MODEL_CALL = re.compile(r"^/s/([^/]+)/v1/(chat/completions|messages|responses)$")


class InflightCounter:
    """ASGI wrapper around the proxy app: counts each session's model calls in flight, so
    the episode's clock knows when a black-box agent is waiting on the model."""

    def __init__(self, app, tap: RecordTap):
        self.app, self.tap = app, tap

    async def __call__(self, scope, receive, send):
        match = _MODEL_CALL.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None:
            return await self.app(scope, receive, send)
        session = match.group(1)
        self.tap.begin(session)
        try:
            return await self.app(scope, receive, send)
        finally:
            self.tap.end(session)


@dataclass(kw_only=True)
class ModelServiceConfig:
    """Which model serves the episodes and where records go."""

    model: str | None = None
    """A local Hugging Face model folder; None or ``tiny`` is the built-in tiny model."""
    records_path: str | None = None
    """JSONL file for TITO records; None keeps none on disk (the tap still counts calls)."""
    max_batch_size: int = 16
    """Sequences the embedded engine decodes together."""
    context_length: int | None = None
    """Cap on the model's context (None: the model's own)."""
    sandbox_port: int = 8765
    """Port of the proxy route inside sandboxes."""
    upstream_base_url: str | None = None
    """Forward every call to this OpenAI/Anthropic-compatible API instead of an engine
    (the proxy's passthrough: text-level records; token ids only if the upstream gives them)."""
    upstream_api: str = "openai"
    """``openai`` or ``anthropic``: the upstream's API."""
    upstream_api_key: str | None = None
    """The upstream's key (None: ``$GYRE_UPSTREAM_API_KEY``, else none is sent)."""


class ModelService:
    """Proxy + embedded engine + record tap + sandbox route, started and stopped together."""

    def __init__(
        self,
        config: ModelServiceConfig | None = None,
        *,
        engines=None,
        tokenizer=None,
        sinks: tuple[RecordSink, ...] = (),
    ):
        """``engines``/``tokenizer``: serve these instead of the embedded model; ``sinks``:
        more record sinks (e.g. a ``TrajectoryStore``), closed with the service."""
        self.config = config or ModelServiceConfig()
        self._engines, self._tokenizer = engines, tokenizer
        self.proxy = None
        self._dir: str | None = None
        sink = JsonlSink(self.config.records_path) if self.config.records_path else None
        self.tap = RecordTap(sink, *sinks)

    def start(self) -> ModelService:
        from gyre_env.proxy.server import ProxyConfig

        engines, tokenizer = self._engines, self._tokenizer
        path = None if self.config.model in (None, "tiny") else self.config.model
        if engines is None and path is not None and not Path(path).is_dir():
            raise FileNotFoundError(f"model {path!r} is not a local model folder")
        # the sandboxes' socket, in a folder of its own that they mount read-only
        self._dir = tempfile.mkdtemp(prefix="gyre-route-")  # short: AF_UNIX paths < 108 bytes
        os.chmod(self._dir, 0o755)
        proxy_config = ProxyConfig(sandbox_socket=os.path.join(self._dir, "proxy.sock"))
        try:
            return self._start(proxy_config, engines, tokenizer, path)
        except BaseException:
            self.stop()
            raise

    def _start(self, proxy_config, engines, tokenizer, path: str | None) -> ModelService:
        from gyre_env.proxy.server import ProxyServer

        if self.config.upstream_base_url is not None:
            self.proxy = ProxyServer(proxy_config, sink=self.tap, upstream=self._upstream())
            return self._start_proxy()
        if engines is None:
            from gyre_env.engines.embedded import EmbeddedEngine, EmbeddedEngineConfig
            from gyre_env.engines.tiny import load_tokenizer

            engines = [
                EmbeddedEngine(
                    EmbeddedEngineConfig(
                        model_path=path,
                        max_batch_size=self.config.max_batch_size,
                        context_length=self.config.context_length,
                    )
                )
            ]
            tokenizer = tokenizer or load_tokenizer(path)
        self.proxy = ProxyServer(proxy_config, engines=engines, tokenizer=tokenizer, sink=self.tap)
        return self._start_proxy()

    def _upstream(self):
        from gyre_env.proxy.passthrough import UpstreamConfig

        cfg = self.config
        key = cfg.upstream_api_key or os.environ.get("GYRE_UPSTREAM_API_KEY")
        return UpstreamConfig(base_url=cfg.upstream_base_url, api=cfg.upstream_api, api_key=key)

    def _start_proxy(self) -> ModelService:
        self.proxy.app = InflightCounter(self.proxy.app, self.tap)
        self.proxy.start()
        return self

    @property
    def route_socket(self) -> str:
        """Host Unix socket of the proxy, for ``SandboxConfig.proxy_socket``."""
        if self.proxy is None:
            raise RuntimeError("the model service is not started")
        return self.proxy.config.sandbox_socket

    @property
    def context_length(self) -> int:
        """The engine's context (an upstream's is unknown: ``config.context_length`` or 128k)."""
        if self.proxy.core is None:
            return int(self.config.context_length or 131072)
        return int(self.proxy.core.context_length)

    @property
    def api(self) -> str:
        """The API endpoints speak by default: the upstream's in passthrough, else ``openai``."""
        return self.config.upstream_api if self.config.upstream_base_url else "openai"

    def serves(self, api: str) -> bool:
        """Whether sessions answer ``api``: an engine serves both, a passthrough only its
        upstream's."""
        if api not in API_KINDS:
            raise ValueError(f"api must be one of {API_KINDS}, got {api!r}")
        return self.config.upstream_base_url is None or api == self.config.upstream_api

    def endpoint(self, session: str, model: str = "tiny", api: str | None = None) -> ModelEndpoint:
        """The episode's endpoint: its own proxy session, from the host and from a sandbox,
        speaking ``api`` (default: ``self.api``)."""
        if self.proxy is None:
            raise RuntimeError("the model service is not started")
        api = api or self.api
        if not self.serves(api):
            raise ValueError(
                f"this model service forwards to a {self.config.upstream_api} upstream; "
                f"it cannot serve the {api} API"
            )
        base_url = (
            self.proxy.openai_base_url(session)
            if api == "openai"
            else self.proxy.anthropic_base_url(session)
        )
        return ModelEndpoint(
            base_url=base_url,
            api=api,
            model=model,
            api_key=self.proxy.bind_session(session),
            session=session,
            sandbox_base_url=f"http://127.0.0.1:{self.config.sandbox_port}/s/{session}",
            context_length=self.context_length,
            calls=self.tap,
        )

    def release(self, session: str) -> None:
        """The episode of ``session`` is over: retire its key (later calls with it are
        refused), free the proxy's prefix cache and the tap's summaries. Its records are
        already in the sinks."""
        self.tap.forget(session)
        if self.proxy is not None:
            self.proxy.release_session(session)

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()  # closes the tap (and its JSONL sink)
            self.proxy = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ModelService:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
