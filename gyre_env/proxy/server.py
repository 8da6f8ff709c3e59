"""The proxy's HTTP server (FastAPI on uvicorn) and an in-process handle to run it.

Routes, each also under ``/s/<session>`` (the session of an episode, chosen by base URL):
``POST /v1/chat/completions`` (OpenAI), ``POST /v1/messages`` (Anthropic, ``?beta=true``
accepted), ``POST /v1/messages/count_tokens``, ``GET /v1/models``; and ``GET /health``,
``GET /metrics`` (Prometheus text), ``DELETE /s/<session>`` (forget a finished episode).

Without a path prefix the session is the API key (``Authorization: Bearer`` or
``x-api-key``) when ``sessions_by_api_key`` is on, else ``default``. With ``auth_token``
set, a request must present that token as its key, or ``<token>:<session>``.

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
import json
import logging
import re
import socket
import threading
from dataclasses import dataclass

from gyre_env._optional import require
from gyre_env.engines.base import Engine
from gyre_env.proxy import anthropic_api, openai_api
from gyre_env.proxy.chat import ChatRequest, RequestError
from gyre_env.proxy.core import Finished, ProxyCore
from gyre_env.proxy.passthrough import Passthrough, UpstreamConfig
from gyre_env.proxy.records import RecordSink
from gyre_env.proxy.render import ToolCall
from gyre_env.proxy.router import PING
from gyre_env.proxy.sessions import BranchClassifier, default_classifier

log = logging.getLogger(__name__)
_SESSION_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")

try:  # orjson parses large bodies several times faster; the stdlib is the fallback
    import orjson

    _loads = orjson.loads
    _dumps = orjson.dumps
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

    def _dumps(obj) -> bytes:
        return json.dumps(obj, ensure_ascii=False).encode()


@dataclass(kw_only=True)
class ProxyConfig:
    """How the proxy listens and behaves. Engines, tokenizer and sink are passed separately."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default so nothing outside the machine reaches it."""
    port: int = 0
    """TCP port; 0 picks a free one (read it back from ``ProxyServer.port``)."""
    auth_token: str | None = None
    """If set, every request must carry it as its API key (or ``<token>:<session>``)."""
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
    """Sessions kept for prefix reuse (least recently used dropped)."""
    max_calls_per_session: int = 512
    """Calls per session kept for prefix matching (oldest dropped)."""
    verify_render: bool = False
    """Also render whole conversations and use them, counting where the constant-cost
    suffix rendering disagreed (``gyre_proxy_render_mismatch_total``). For debugging."""
    model_name: str = "gyre"
    """Model id listed by ``GET /v1/models`` (requests may name any model)."""


def _resolve_session(config: ProxyConfig, headers, path_session: str | None) -> str:
    key = headers.get("x-api-key") or ""
    auth = headers.get("authorization") or ""
    if not key and auth.lower().startswith("bearer "):
        key = auth[7:].strip()
    session = path_session
    if config.auth_token:
        token = config.auth_token
        if key == token:
            pass
        elif key.startswith(token + ":") and len(key) > len(token) + 1:
            session = session or key[len(token) + 1 :]
        else:
            raise RequestError("invalid or missing API key", status=401)
    elif session is None and config.sessions_by_api_key and key:
        session = key
    session = session or "default"
    if not _SESSION_RE.match(session):
        raise RequestError(
            f"bad session name {session[:40]!r}: use letters, digits and ._:-", status=400
        )
    return session


def create_app(config: ProxyConfig, core: ProxyCore | None, passthrough: Passthrough | None = None):
    """The FastAPI application serving ``core`` (token-level engines) or ``passthrough``."""
    fastapi = require("fastapi", "the proxy server")
    responses = require("fastapi.responses", "the proxy server")
    Response, StreamingResponse = responses.Response, responses.StreamingResponse
    app = fastapi.FastAPI(title="gyre proxy", docs_url=None, redoc_url=None, openapi_url=None)
    apis = {"openai": openai_api, "anthropic": anthropic_api}

    def error(api: str, err: RequestError):
        return Response(
            _dumps(apis[api].error_body(err)), status_code=err.status, media_type="application/json"
        )

    async def read_json(request) -> dict:
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > config.max_request_bytes:
            raise RequestError(
                f"request body is {length} bytes; the limit is {config.max_request_bytes}",
                status=413,
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > config.max_request_bytes:
                raise RequestError(
                    f"request body exceeds {config.max_request_bytes} bytes", status=413
                )
            chunks.append(chunk)
        try:
            body = _loads(b"".join(chunks))
        except ValueError as e:
            raise RequestError(f"request body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        return body

    def json_response(data: dict, status: int = 200):
        return Response(_dumps(data), status_code=status, media_type="application/json")

    async def forward(request, api: str):
        try:
            session = _resolve_session(config, request.headers, request.path_params.get("session"))
            body = await read_json(request)
            req = apis[api].parse_request(body)
            headers = {k.lower(): v for k, v in request.headers.items()}
            status, result = await passthrough.forward(api, session, body, req, headers)
        except RequestError as err:
            return error(api, err)
        if isinstance(result, dict):
            return json_response(result, status)
        return StreamingResponse(result, status_code=status, media_type="text/event-stream")

    async def chat(request, api: str):
        if passthrough is not None:
            return await forward(request, api)
        try:
            session = _resolve_session(config, request.headers, request.path_params.get("session"))
            req = apis[api].parse_request(await read_json(request))
            prep = await core.prepare(
                req, session, {k.lower(): v for k, v in request.headers.items()}
            )
        except RequestError as err:
            return error(api, err)
        if req.stream:
            return StreamingResponse(
                _sse(core, prep, api),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        try:
            return json_response(await _complete(core, prep, api))
        except RequestError as err:
            return error(api, err)

    async def openai_chat(request):
        return await chat(request, "openai")

    async def anthropic_chat(request):
        return await chat(request, "anthropic")

    async def count_tokens(request):
        try:
            _resolve_session(config, request.headers, request.path_params.get("session"))
            body = await read_json(request)
            body.setdefault("max_tokens", 1)
            req = anthropic_api.parse_request(body)
            if core is None:
                raise RequestError(
                    "count_tokens needs a local tokenizer; this proxy forwards upstream"
                )
            text = core.renderer.render(req.messages, req.tools)
            return json_response({"input_tokens": len(core.renderer.encode(text))})
        except RequestError as err:
            return error("anthropic", err)

    async def models(request):
        card = {
            "id": config.model_name,
            "object": "model",
            "owned_by": "gyre",
            "type": "model",
            "display_name": config.model_name,
            "created": 0,
        }
        return json_response({"object": "list", "data": [card]})

    replicas = core.router.replicas if core is not None else []

    async def health(request):
        reports = {}
        if passthrough is not None:
            reports["upstream"] = {
                "base_url": passthrough.upstream.base_url,
                "api": passthrough.upstream.api,
            }
        for r in replicas:
            try:
                reports[r.name] = await asyncio.wait_for(r.engine.health(), 5)
            except Exception as e:
                reports[r.name] = {"error": f"{type(e).__name__}: {e}"}
        sessions = len(core.sessions) if core is not None else 0
        return json_response({"status": "ok", "replicas": reports, "sessions": sessions})

    async def metrics(request):
        if core is None:
            return Response("", media_type="text/plain; version=0.0.4")
        inflight = {r.name: r.inflight for r in replicas}
        text = core.metrics.render(inflight, waiting=core.router.waiting)
        return Response(text, media_type="text/plain; version=0.0.4")

    async def drop_session(request):
        session = request.path_params["session"]
        dropped = core.sessions.drop(session) if core is not None else False
        return json_response({"session": session, "dropped": dropped})

    for prefix in ("", "/s/{session}"):
        app.add_route(prefix + "/v1/chat/completions", openai_chat, methods=["POST"])
        app.add_route(prefix + "/v1/messages", anthropic_chat, methods=["POST"])
        app.add_route(prefix + "/v1/messages/count_tokens", count_tokens, methods=["POST"])
        app.add_route(prefix + "/v1/models", models, methods=["GET"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/metrics", metrics, methods=["GET"])
    app.add_route("/s/{session}", drop_session, methods=["DELETE"])

    @app.exception_handler(Exception)
    async def crash(request, exc: Exception):  # the last resort: answer, never die
        log.exception("unhandled error on %s", request.url.path)
        api = "anthropic" if "/messages" in request.url.path else "openai"
        return error(api, RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500))

    return app


async def _complete(core: ProxyCore, prep, api: str) -> dict:
    pieces: list[str | ToolCall] = []
    async with contextlib.aclosing(core.events(prep)) as events:
        async for ev in events:
            if isinstance(ev, Finished):
                usage = (ev.prompt_tokens, ev.output_tokens)
                if api == "openai":
                    reason = openai_api.finish_reason(ev.finish, ev.tool_calls)
                    return openai_api.completion(prep.req, ev.text, ev.tool_calls, reason, usage)
                return anthropic_api.message(prep.req, pieces, ev.finish, ev.stop_sequence, usage)
            if ev is not PING:
                pieces.append(ev)
    raise RequestError("generation ended without a result", status=500)


async def _sse(core: ProxyCore, prep, api: str):
    req: ChatRequest = prep.req
    writer = openai_api.ChunkWriter(req) if api == "openai" else anthropic_api.EventWriter(req)
    yield writer.start() if api == "openai" else writer.start(len(prep.plan.prompt_ids))
    try:
        async with contextlib.aclosing(core.events(prep)) as events:
            async for ev in events:
                yield _sse_event(writer, api, ev)
    except RequestError as err:  # headers are sent: the error travels as an event
        yield writer.error(err)


def _sse_event(writer, api: str, ev) -> bytes:
    if ev is PING:
        return writer.ping()
    if isinstance(ev, str):
        return writer.text(ev) if ev else b""
    if isinstance(ev, ToolCall):
        return writer.tool_call(ev)
    usage = (ev.prompt_tokens, ev.output_tokens)
    if api == "openai":
        return writer.finish(openai_api.finish_reason(ev.finish, ev.tool_calls), usage)
    return writer.finish(ev.finish, ev.stop_sequence, usage)


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
        self.config = config
        self.sink = sink
        self.core: ProxyCore | None = None
        self.passthrough: Passthrough | None = None
        if upstream is not None:
            if engines:
                raise ValueError(
                    "give either engines (token-level) or upstream (passthrough), not both"
                )
            self.passthrough = Passthrough(upstream, sink=sink, classifier=classifier)
            self.app = create_app(config, None, self.passthrough)
            self._init_server_state()
            return
        if not engines or tokenizer is None:
            raise ValueError("ProxyServer needs engines and their tokenizer (or an upstream)")
        self.core = ProxyCore(
            engines=engines,
            tokenizer=tokenizer,
            sink=sink,
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
        self.app = create_app(config, self.core)
        self._init_server_state()

    def _init_server_state(self) -> None:
        self._sock: socket.socket | None = None
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

    def _bind(self) -> None:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets whose proto is TCP,
        # and without it small responses wait ~40 ms for delayed ACKs (Nagle).
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.config.host, self.config.port))

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
            self.loop.run_until_complete(self._server.serve(sockets=[self._sock]))

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
            print(f"gyre proxy listening on {self.base_url}", flush=True)
            await self._server.serve(sockets=[self._sock])

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
        if self._sock is not None:
            self._sock.close()
        if self.sink is not None:
            self.sink.close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
