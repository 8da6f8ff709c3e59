"""The proxy's HTTP server (FastAPI on uvicorn) and an in-process handle to run it.

Routes, each also under ``/s/<session>`` (the session of an episode, chosen by base URL):
``POST /v1/chat/completions`` (OpenAI), ``POST /v1/responses`` and
``GET /v1/responses/{id}`` (OpenAI Responses), ``POST /v1/messages`` (Anthropic,
``?beta=true`` accepted), ``POST /v1/messages/count_tokens``, ``GET /v1/models``; and
``GET /health``, ``GET /metrics`` (Prometheus text), ``DELETE /s/<session>`` (forget a
finished episode).

Without a path prefix the session is the API key (``Authorization: Bearer`` or
``x-api-key``) when ``sessions_by_api_key`` is on, else ``default``. With ``auth_token``
set, every request (``/health``, ``/metrics`` and ``DELETE`` too) must present that token
as its key, or ``<token>:<session>``. A session given a key (:meth:`ProxyServer.bind_session`)
answers only requests with that key (or the token). Without a token the proxy refuses to
listen beyond loopback unless ``insecure`` (see ``gyre_env.proxy.auth``).

Start one in-process::

    proxy = ProxyServer(ProxyConfig(), engines=[engine], tokenizer=tok, sink=JsonlSink(p))
    proxy.start()
    OpenAI(base_url=proxy.openai_base_url("episode-1"), api_key="x")
    Anthropic(base_url=proxy.anthropic_base_url("episode-1"), api_key="x")
    proxy.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import threading
from dataclasses import dataclass

from gyre_env._optional import require
from gyre_env.engines.base import Engine
from gyre_env.proxy.auth import SessionKeys, is_loopback
from gyre_env.proxy.core import ProxyCore
from gyre_env.proxy.passthrough import Passthrough, UpstreamConfig
from gyre_env.proxy.routes import Routes
from gyre_env.proxy.sessions import BranchClassifier, default_classifier
from gyre_env.trajectory.records import RecordSink, RecordWriter

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ProxyConfig:
    """How the proxy listens and behaves. Engines, tokenizer and sink are passed separately."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default so nothing outside the machine reaches it."""
    port: int = 0
    """TCP port; 0 picks a free one (read it back from ``ProxyServer.port``)."""
    auth_token: str | None = None
    """If set, every request must carry it as its API key (or ``<token>:<session>``), on
    every route. Required to listen beyond loopback (unless ``insecure``)."""
    insecure: bool = False
    """Allow listening beyond loopback without ``auth_token``: anyone who reaches the port
    can then use the model (or spend the upstream's key). Only on a network you trust."""
    sandbox_socket: str | None = None
    """Also serve this Unix socket, for sandboxes: a request there must name a session that
    has a key (:meth:`ProxyServer.bind_session`) and carry that key, and reaches only the
    model routes."""
    sessions_by_api_key: bool = True
    """Without a ``/s/<session>`` prefix, use the API key as the session name."""
    max_request_bytes: int = 64 * 1024 * 1024
    """Larger bodies get 413 (a 128k-token conversation is a few MB)."""
    default_max_tokens: int = 1024
    """Generation limit when an OpenAI request gives none (always capped by the context)."""
    max_new_tokens_cap: int | None = None
    """If set, no call generates more than this, whatever it asks (a rollout budget:
    Claude Code asks for 128000)."""
    wait_timeout_s: float = 600.0
    """How long a call waits for a replica while all are paused before it gets 503."""
    ping_interval_s: float = 5.0
    """Keep-alive interval of streaming responses while waiting."""
    probe_interval_s: float = 0.5
    """How often a replica that refused (paused) is tried again."""
    replica_down_s: float = 5.0
    """After a replica fails a call it gets no calls for this long (then it is tried again)."""
    affinity_slack: int = 2
    """A session stays on its last replica unless that one has this many more calls in flight."""
    max_sessions: int = 4096
    """Sessions kept. Only released ones (``DELETE /s/<session>``) are evicted, least
    recently released first; with this many live sessions a new one gets 503."""
    max_calls_per_session: int = 512
    """Calls per session kept for prefix matching (oldest dropped)."""
    verify_render: bool = False
    """Also render whole conversations and use them, counting where the constant-cost
    suffix rendering disagreed (``gyre_proxy_render_mismatch_total``). For debugging."""
    model_name: str = "gyre"
    """Model id listed by ``GET /v1/models`` (requests may name any model)."""


def check_exposure(config: ProxyConfig) -> None:
    """Refuse (ValueError) to listen beyond loopback without a token, unless ``insecure``."""
    if config.auth_token or config.insecure or is_loopback(config.host):
        return
    raise ValueError(
        f"refusing to serve the proxy on {config.host!r} without an auth token: anyone who "
        "reaches the port could use the model, or spend the upstream's API key. Set a token "
        "(ProxyConfig.auth_token; `gyre proxy serve --auth-token-env VAR`), listen on "
        "127.0.0.1, or accept the risk with ProxyConfig.insecure / --insecure"
    )


def create_app(
    config: ProxyConfig,
    core: ProxyCore | None,
    passthrough: Passthrough | None = None,
    keys: SessionKeys | None = None,
):
    """The FastAPI application serving ``core`` (token-level engines) or ``passthrough``."""
    fastapi = require("fastapi", "the proxy server")
    app = fastapi.FastAPI(title="gyre proxy", docs_url=None, redoc_url=None, openapi_url=None)
    Routes(config, core, passthrough, keys).install(app)
    return app


class ProxyServer:
    """Runs the proxy on its own event loop in a background thread (or in the foreground
    with :meth:`serve`). Engines are called from that loop."""

    def __init__(
        self,
        config: ProxyConfig,
        *,
        engines: list[Engine] | None = None,
        tokenizer=None,
        sink: RecordSink | None = None,
        classifier: BranchClassifier = default_classifier,
        upstream: UpstreamConfig | None = None,
    ):
        if upstream is not None and engines:
            raise ValueError(
                "give either engines (token-level) or upstream (passthrough), not both"
            )
        if upstream is None and (not engines or tokenizer is None):
            raise ValueError("ProxyServer needs engines and their tokenizer (or an upstream)")
        check_exposure(config)
        self.config = config
        self.keys = SessionKeys()
        # records are written on the writer's thread, never on the server's event loop;
        # stop() flushes it, closes ``sink`` and raises if any record could not be written
        self.sink = RecordWriter(sink) if sink is not None else None
        self.core: ProxyCore | None = None
        self.passthrough: Passthrough | None = None
        if upstream is not None:
            self.passthrough = Passthrough(upstream, sink=self.sink, classifier=classifier)
            self.app = create_app(config, None, self.passthrough, self.keys)
            self._init_server_state()
            return
        self.core = ProxyCore(
            engines=engines,
            tokenizer=tokenizer,
            sink=self.sink,
            classifier=classifier,
            default_max_tokens=config.default_max_tokens,
            max_new_tokens_cap=config.max_new_tokens_cap,
            verify_render=config.verify_render,
            max_sessions=config.max_sessions,
            max_calls_per_session=config.max_calls_per_session,
            router_options={
                "wait_timeout_s": config.wait_timeout_s,
                "ping_interval_s": config.ping_interval_s,
                "probe_interval_s": config.probe_interval_s,
                "down_s": config.replica_down_s,
                "affinity_slack": config.affinity_slack,
            },
        )
        self.app = create_app(config, self.core, keys=self.keys)
        self._init_server_state()

    def _init_server_state(self) -> None:
        self._sock: socket.socket | None = None
        self._unix: socket.socket | None = None
        self._server = None
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError("the proxy is not started")
        return self._sock.getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def openai_base_url(self, session: str) -> str:
        """Base URL for an OpenAI client of this session (``.../s/<session>/v1``)."""
        return f"{self.base_url}/s/{session}/v1"

    def anthropic_base_url(self, session: str) -> str:
        """Base URL for an Anthropic client or ``ANTHROPIC_BASE_URL`` (``.../s/<session>``)."""
        return f"{self.base_url}/s/{session}"

    def bind_session(self, session: str) -> str:
        """Give ``session`` a key (minted once; unguessable) and return it: from now on the
        session answers only requests that carry it as their API key (or the auth token)."""
        return self.keys.bind(session)

    def release_session(self, session: str) -> bool:
        """The episode of ``session`` is over: retire its key and let it be evicted (what
        ``DELETE /s/<session>`` does). Returns whether the proxy held the session."""
        self.keys.unbind(session)
        return self.core.sessions.release(session) if self.core is not None else False

    def _sockets(self) -> list[socket.socket]:
        return [s for s in (self._sock, self._unix) if s is not None]

    def _bind(self) -> None:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets whose proto is TCP,
        # and without it small responses wait ~40 ms for delayed ACKs (Nagle).
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.config.host, self.config.port))
        path = self.config.sandbox_socket
        if path is not None:
            self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._unix.bind(path)
            os.chmod(path, 0o666)  # a sandbox may run as another user

    def _uvicorn_server(self):
        uvicorn = require("uvicorn", "the proxy server")
        cfg = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30
        )
        return uvicorn.Server(cfg)

    def start(self, timeout: float = 30.0) -> ProxyServer:
        """Start serving in a daemon thread; returns once the port accepts connections."""
        self._bind()
        self._server = self._uvicorn_server()
        started = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(started.set)
            self.loop.run_until_complete(self._server.serve(sockets=self._sockets()))

        self._thread = threading.Thread(target=run, name="gyre-proxy", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise RuntimeError("the proxy did not start")
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the proxy server exited while starting")
            threading.Event().wait(0.01)
        return self

    def serve(self, before=None) -> None:
        """Serve in the foreground until interrupted; ``before`` is an optional coroutine
        function run on the server's loop first (e.g. starting engines). Meant for a process
        that is the server (``gyre proxy serve``): it freezes the GC's view of the startup
        heap (``gc.freeze``); :meth:`start` (in-process) leaves the GC alone."""
        self._bind()
        self._server = self._uvicorn_server()

        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            if before is not None:
                await before()
            # This process is the server: move everything loaded so far (torch, transformers,
            # models) out of the cyclic GC's reach, so its full collections do not walk
            # millions of long-lived objects (tens of ms of stalled requests each time).
            gc.collect()
            gc.freeze()
            serving = asyncio.create_task(self._server.serve(sockets=self._sockets()))
            # Say so once the port accepts connections, not before: a client that connected
            # on the line (a script, the test) was refused while uvicorn was still starting.
            while not self._server.started and not serving.done():
                await asyncio.sleep(0.01)
            if self._server.started:
                print(f"gyre proxy listening on {self.base_url}", flush=True)
            await serving

        try:
            asyncio.run(main())
        finally:
            if self.sink is not None:
                self.sink.close()

    def call(self, coro, timeout: float = 60.0):
        """Run a coroutine on the proxy's loop from another thread (e.g. ``core.router.pause()``)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self.passthrough is not None and self.loop is not None and self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.passthrough.aclose(), self.loop).result(timeout)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        for sock in self._sockets():
            sock.close()
        if self._unix is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.sandbox_socket)
        if self.sink is not None:
            self.sink.close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
