"""HTTP endpoints of the proxy (Starlette-style: request in, response out).

One :class:`Routes` object serves either token-level engines (``core``) or an upstream
(``passthrough``). Requests are read and checked here; every failure becomes an error in
the API's own shape, never an unhandled exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re

from gyre_env._optional import require
from gyre_env.proxy import anthropic_api, openai_api, responses_api
from gyre_env.proxy.auth import SessionKeys, authorize, check_operator
from gyre_env.proxy.bodies import BodyMemo
from gyre_env.proxy.chat import RequestError
from gyre_env.proxy.core import FLUSH, Finished, ProxyCore
from gyre_env.proxy.passthrough import Passthrough
from gyre_env.proxy.render import ToolCall
from gyre_env.proxy.router import PING

log = logging.getLogger(__name__)
_SESSION_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_APIS = {"openai": openai_api, "anthropic": anthropic_api, "responses": responses_api}
_PROMETHEUS = "text/plain; version=0.0.4"

try:  # orjson parses large bodies several times faster; the stdlib is the fallback
    import orjson

    _loads = orjson.loads
    _dumps = orjson.dumps
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

    def _dumps(obj) -> bytes:
        return json.dumps(obj, ensure_ascii=False).encode()


def resolve_session(config, keys: SessionKeys, headers, path_session, *, sandbox=False) -> str:
    """The session of a request: its ``/s/<session>`` path, else its API key (see
    :class:`~gyre_env.proxy.server.ProxyConfig`), else ``default``; 401 when the request
    may not use it (:func:`~gyre_env.proxy.auth.authorize`)."""
    session = authorize(
        config.auth_token,
        keys,
        headers,
        path_session,
        sessions_by_api_key=config.sessions_by_api_key,
        sandbox=sandbox,
    )
    session = session or "default"
    if not _SESSION_RE.match(session):
        raise RequestError(f"bad session name {session[:40]!r}: use letters, digits and ._:-")
    return session


class Routes:
    """The endpoints; :meth:`install` adds them to a FastAPI/Starlette app."""

    def __init__(
        self,
        config,
        core: ProxyCore | None,
        passthrough: Passthrough | None,
        keys: SessionKeys | None = None,
    ):
        responses = require("fastapi.responses", "the proxy server")
        self._Response, self._Streaming = responses.Response, responses.StreamingResponse
        self.config, self.core, self.passthrough = config, core, passthrough
        self.keys = keys if keys is not None else SessionKeys()
        self.replicas = core.router.replicas if core is not None else []

    def install(self, app) -> None:
        for prefix in ("", "/s/{session}"):
            app.add_route(prefix + "/v1/chat/completions", self.openai_chat, methods=["POST"])
            app.add_route(prefix + "/v1/messages", self.anthropic_chat, methods=["POST"])
            app.add_route(prefix + "/v1/responses", self.openai_responses, methods=["POST"])
            app.add_route(
                prefix + "/v1/responses/{response_id}", self.stored_response, methods=["GET"]
            )
            app.add_route(prefix + "/v1/messages/count_tokens", self.count_tokens, methods=["POST"])
            app.add_route(prefix + "/v1/models", self.models, methods=["GET"])
        app.add_route("/health", self.health, methods=["GET"])
        app.add_route("/metrics", self.metrics, methods=["GET"])
        app.add_route("/s/{session}", self.drop_session, methods=["DELETE"])
        app.add_exception_handler(Exception, self.crash)

    # -- helpers --------------------------------------------------------------------------------
    def from_sandbox(self, request) -> bool:
        """Whether the request came in on the sandbox socket. Fails closed: with that socket
        configured, any connection without a TCP address counts as a sandbox's."""
        if self.config.sandbox_socket is None:
            return False
        server = request.scope.get("server")
        return not server or server[1] is None or server[0] == self.config.sandbox_socket

    def session(self, request) -> str:
        """The request's session, checked against its key (raises 401)."""
        return resolve_session(
            self.config,
            self.keys,
            request.headers,
            request.path_params.get("session"),
            sandbox=self.from_sandbox(request),
        )

    def operator(self, request):
        """None when the request may use a service route, else the error response."""
        try:
            check_operator(
                self.config.auth_token, request.headers, sandbox=self.from_sandbox(request)
            )
        except RequestError as err:
            return self.error("openai", err)
        return None

    def json(self, data: dict, status: int = 200):
        return self._Response(_dumps(data), status_code=status, media_type="application/json")

    def error(self, api: str, err: RequestError):
        return self.json(_APIS[api].error_body(err), err.status)

    async def read_json(self, request, memo: BodyMemo | None = None) -> dict:
        """The request's JSON object (through the session's ``memo`` when given)."""
        limit = self.config.max_request_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise RequestError(f"request body is {length} bytes; the limit is {limit}", status=413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(f"request body exceeds {limit} bytes", status=413)
            chunks.append(chunk)
        try:
            raw = b"".join(chunks)
            body = memo.loads(raw) if memo is not None else _loads(raw)
        except ValueError as e:
            raise RequestError(f"request body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        return body

    # -- chat -----------------------------------------------------------------------------------
    async def openai_chat(self, request):
        return await self.chat(request, "openai")

    async def anthropic_chat(self, request):
        return await self.chat(request, "anthropic")

    async def openai_responses(self, request):
        return await self.chat(request, "responses")

    async def stored_response(self, request):
        """``GET /v1/responses/{id}``: a response the session stored (404 if none)."""
        try:
            session = self.session(request)
            if self.core is None:
                raise RequestError("this proxy forwards to an upstream: it stores no responses")
            log = self.core.sessions.get(session).responses
            return self.json(log.get(request.path_params["response_id"], param=None).response)
        except RequestError as err:
            return self.error("responses", err)

    async def chat(self, request, api: str):
        if self.passthrough is not None:
            return await self.forward(request, api)
        try:
            session = self.session(request)
            state = self.core.sessions.get(session)
            again = state.calls > 0  # memos pay off from a session's second call on
            body = await self.read_json(request, state.body_memo(api) if again else None)
            memo = state.memo(api) if again else None
            if api == "responses":  # may continue the session's stored responses
                req = responses_api.parse_request(body, state.responses, memo)
            else:
                req = _APIS[api].parse_request(body, memo)
            prep = await self.core.prepare(req, session, dict(request.headers))
        except RequestError as err:
            return self.error(api, err)
        if req.stream:
            return await self.stream(prep, api)
        try:
            return self.json(await _complete(self.core, prep, api))
        except RequestError as err:
            return self.error(api, err)

    async def stream(self, prep, api: str):
        """An SSE response. Its first write waits for the first engine chunk (or a
        keep-alive ping while queued or prefilling); a call whose whole answer came in that
        chunk is sent as one plain response, without a streaming task per call."""
        headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        end = _End()
        events = _sse(self.core, prep, api, end)
        first = await anext(events, b"")
        if end.reached:
            await events.aclose()
            return self._Response(first, media_type="text/event-stream", headers=headers)
        return self._Streaming(
            _then(first, events), media_type="text/event-stream", headers=headers
        )

    async def forward(self, request, api: str):
        try:
            session = self.session(request)
            if api == "responses":
                raise RequestError(
                    "the Responses API needs the proxy's own engine: this proxy forwards "
                    f"calls to a {self.passthrough.upstream.api} upstream (use its API)"
                )
            body = await self.read_json(request)
            req = _APIS[api].parse_request(body)
            status, result = await self.passthrough.forward(
                api, session, body, req, dict(request.headers)
            )
        except RequestError as err:
            return self.error(api, err)
        if isinstance(result, dict):
            return self.json(result, status)
        return self._Streaming(result, status_code=status, media_type="text/event-stream")

    async def count_tokens(self, request):
        try:
            self.session(request)
            body = await self.read_json(request)
            body.setdefault("max_tokens", 1)
            req = anthropic_api.parse_request(body)
            if self.core is None:
                raise RequestError(
                    "count_tokens needs a local tokenizer; this proxy forwards upstream"
                )
            text = self.core.renderer.render(req.messages, req.tools)
            return self.json({"input_tokens": len(self.core.renderer.encode(text))})
        except RequestError as err:
            return self.error("anthropic", err)

    # -- service --------------------------------------------------------------------------------
    async def models(self, request):
        try:
            self.session(request)
        except RequestError as err:
            return self.error("openai", err)
        name = self.config.model_name
        card = {
            "id": name,
            "object": "model",
            "owned_by": "gyre",
            "type": "model",
            "display_name": name,
            "created": 0,
        }
        return self.json({"object": "list", "data": [card]})

    async def health(self, request):
        if (refused := self.operator(request)) is not None:
            return refused
        reports = {}
        if self.passthrough is not None:
            up = self.passthrough.upstream
            reports["upstream"] = {"base_url": up.base_url, "api": up.api}
        for r in self.replicas:
            try:
                reports[r.name] = await asyncio.wait_for(r.engine.health(), 5)
            except Exception as e:  # a health report, not a failure of this endpoint
                reports[r.name] = {"error": f"{type(e).__name__}: {e}"}
        sessions = len(self.core.sessions) if self.core is not None else 0
        live = self.core.sessions.live() if self.core is not None else 0
        body = {"status": "ok", "replicas": reports, "sessions": sessions, "live_sessions": live}
        return self.json(body)

    async def metrics(self, request):
        if (refused := self.operator(request)) is not None:
            return refused
        if self.core is None:
            return self._Response("", media_type=_PROMETHEUS)
        inflight = {r.name: r.inflight for r in self.replicas}
        sync = {r.name: (r.excluded is not None, r.sync_failures) for r in self.replicas}
        text = self.core.metrics.render(inflight, waiting=self.core.router.waiting, sync=sync)
        return self._Response(text, media_type=_PROMETHEUS)

    async def drop_session(self, request):
        """End a finished episode's session: its key is retired and it may be evicted (its
        call count is kept until then, so a later call under its name continues it)."""
        if (refused := self.operator(request)) is not None:
            return refused
        session = request.path_params["session"]
        self.keys.unbind(session)
        released = self.core.sessions.release(session) if self.core is not None else False
        return self.json({"session": session, "released": released})

    async def crash(self, request, exc: Exception):  # the last resort: answer, never die
        log.exception("unhandled error on %s", request.url.path)
        api = "anthropic" if "/messages" in request.url.path else "openai"
        return self.error(
            api, RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500)
        )


async def _complete(core: ProxyCore, prep, api: str) -> dict:
    if api == "responses":  # the stream's writer builds the Response object
        writer = _writer(prep, api)
        async with contextlib.aclosing(core.events(prep)) as events:
            async for ev in events:
                if ev is not PING and ev is not FLUSH:
                    _sse_event(writer, api, ev)
        if not writer.response:
            raise RequestError("generation ended without a result", status=500)
        return writer.response
    pieces: list[str | ToolCall] = []
    async with contextlib.aclosing(core.events(prep)) as events:
        async for ev in events:
            if isinstance(ev, Finished):
                usage = (ev.prompt_tokens, ev.output_tokens)
                if api == "openai":
                    reason = openai_api.finish_reason(ev.finish, ev.tool_calls)
                    return openai_api.completion(prep.req, ev.text, ev.tool_calls, reason, usage)
                return anthropic_api.message(prep.req, pieces, ev.finish, ev.stop_sequence, usage)
            if ev is not PING and ev is not FLUSH:
                pieces.append(ev)
    raise RequestError("generation ended without a result", status=500)


class _End:
    """Set by :func:`_sse` just before it yields its last bytes."""

    reached = False


async def _then(first: bytes, rest):
    """``first``, then the items of ``rest`` (closed when this generator is)."""
    async with contextlib.aclosing(rest):
        yield first
        async for item in rest:
            yield item


async def _sse(core: ProxyCore, prep, api: str, end: _End):
    """The call's SSE bytes: the events of one engine chunk (and the opening events before
    the first) go out in one write, a ping or the end at once."""
    writer = _writer(prep, api)
    out = writer.start(len(prep.plan.prompt_ids)) if api == "anthropic" else writer.start()
    try:
        async with contextlib.aclosing(core.events(prep)) as events:
            async for ev in events:
                if ev is FLUSH:
                    if out:
                        yield out
                        out = b""
                    continue
                out += _sse_event(writer, api, ev)
                if ev is PING:
                    yield out
                    out = b""
    except RequestError as err:  # headers may be sent: the error travels as an event
        out += writer.error(err)
    end.reached = True
    if out:
        yield out


def _writer(prep, api: str):
    if api == "openai":
        return openai_api.ChunkWriter(prep.req)
    if api == "anthropic":
        return anthropic_api.EventWriter(prep.req)
    return responses_api.ResponseWriter(prep.req, prep.session.responses, prep.plan.prefix_len)


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
    if api == "responses":
        return writer.finish(ev.finish, usage, ev.text, ev.tool_calls)
    return writer.finish(ev.finish, ev.stop_sequence, usage)
