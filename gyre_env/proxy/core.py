"""One model call, API-independent: plan the prompt ids, route, stream, parse, record.

:class:`ProxyCore` is what both HTTP APIs call. ``prepare`` (synchronous checks: session,
branch, prompt ids, context length) raises :class:`RequestError` before any response is
started; ``events`` then yields text pieces, tool calls, pings and one final
:class:`Finished`, and writes the call's :class:`CallRecord` however it ends. A completed
call's record is written (on the sink's writer thread, see ``RecordWriter``) before its
``Finished`` is yielded, so a client that has its answer finds the record stored; the loop
serves other calls meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass

from gyre_env.engines.base import ContextLengthError, Engine, SamplingParams
from gyre_env.proxy.chat import ChatRequest, RequestError
from gyre_env.proxy.metrics import ProxyMetrics
from gyre_env.proxy.render import (
    ChatRenderer,
    IncrementalDecoder,
    StopStringMatcher,
    ToolCall,
    ToolCallParser,
    reply_key,
    split_output,
)
from gyre_env.proxy.router import PING, NoReplicaError, Router, RouteTrace
from gyre_env.proxy.sessions import (
    BranchClassifier,
    CallContext,
    PromptPlan,
    Session,
    SessionStore,
    default_classifier,
)
from gyre_env.trajectory.records import CallRecord, RecordSink, record_written, submit_record

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Finished:
    """Last event of a call."""

    finish: str
    """Engine-level reason: ``stop`` or ``length``."""
    stop_sequence: str | None
    prompt_tokens: int
    output_tokens: int
    text: str
    tool_calls: list[ToolCall]


FLUSH = object()
"""Yielded by :meth:`ProxyCore.events` after the pieces of one engine chunk: a stream
sends what it has gathered since the last flush in one write."""


@dataclass(kw_only=True)
class Prepared:
    req: ChatRequest
    session: Session
    plan: PromptPlan
    call_index: int
    params: SamplingParams
    created: float
    t0: float
    render_s: float


class ProxyCore:
    """Sessions, rendering, routing and recording for every call."""

    def __init__(
        self,
        *,
        engines: list[Engine],
        tokenizer,
        sink: RecordSink | None = None,
        classifier: BranchClassifier = default_classifier,
        default_max_tokens: int = 1024,
        max_new_tokens_cap: int | None = None,
        verify_render: bool = False,
        max_sessions: int = 4096,
        max_calls_per_session: int = 512,
        router_options: dict | None = None,
        offload_chars: int = 65536,
    ):
        self.renderer = ChatRenderer(tokenizer)
        self.router = Router(engines, **(router_options or {}))
        self.sessions = SessionStore(max_sessions=max_sessions, max_nodes=max_calls_per_session)
        self.sink = sink
        self.classifier = classifier
        self.default_max_tokens = default_max_tokens
        self.max_new_tokens_cap = max_new_tokens_cap
        self.verify_render = verify_render
        self.offload_chars = offload_chars
        self.metrics = ProxyMetrics()

    @property
    def context_length(self) -> int:
        return self.router.context_length

    async def prepare(
        self, req: ChatRequest, session_name: str, headers: dict[str, str]
    ) -> Prepared:
        """Decide branch and prompt ids; raise RequestError if the call cannot run.

        Rendering and tokenizing more than ``offload_chars`` of text (a long first call)
        runs in a worker thread, so other sessions' streams do not stall meanwhile."""
        created, t0 = time.time(), time.perf_counter()
        session = self.sessions.get(session_name)
        role = self.classifier(
            CallContext(session=session_name, messages=req.messages, headers=headers, api=req.api)
        )
        match = session.match(req.messages, req.tools, role)
        if self.verify_render or match.render_chars > self.offload_chars:
            plan = await asyncio.to_thread(
                session.build, self.renderer, match, verify=self.verify_render
            )
        else:
            plan = session.build(self.renderer, match)
        self.metrics.render_mismatches += int(plan.render_mismatch)
        limit = self.context_length
        room = limit - len(plan.prompt_ids)
        if room < 1:
            session.abandon(plan)
            raise RequestError(
                f"prompt is {len(plan.prompt_ids)} tokens; the model's context is {limit} tokens "
                "(prompt plus at least one generated token)",
                param="messages",
                code="context_length_exceeded",
            )
        wanted = req.max_tokens or self.default_max_tokens
        if self.max_new_tokens_cap is not None:
            wanted = min(wanted, self.max_new_tokens_cap)
        params = SamplingParams(
            max_new_tokens=min(wanted, room),
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            stop_token_ids=self.renderer.stop_token_ids,
            seed=req.seed,
        )
        self.metrics.new_branches += int(plan.new_branch)
        return Prepared(
            req=req,
            session=session,
            plan=plan,
            call_index=session.next_call_index(),
            params=params,
            created=created,
            t0=t0,
            render_s=time.perf_counter() - t0,
        )

    async def events(self, prep: Prepared) -> AsyncIterator[object]:
        """Yield ``PING``, text pieces (str), ToolCall s and ``FLUSH`` marks, then one
        Finished."""
        decoder = IncrementalDecoder(self.renderer)
        stops = StopStringMatcher(prep.req.stop)
        parser = ToolCallParser(enabled=prep.req.parse_tools)
        trace = RouteTrace()
        out_ids: list[int] = []
        logprobs: list[float] = []
        pieces: list[str | ToolCall] = []
        finish, error, done, recorded = "abort", None, False, False
        try:
            stream = self.router.stream(prep.session.name, prep.plan.prompt_ids, prep.params, trace)
            if prep.req.stream:  # keep the client's connection alive through a long prefill
                stream = with_pings(stream, self.router.ping_interval_s)
            async with contextlib.aclosing(stream):
                async for item in stream:
                    if item is PING:
                        yield PING
                        continue
                    out_ids += item.ids
                    logprobs += item.logprobs
                    for piece in parser.push(stops.push(decoder.push(item.ids))):
                        pieces.append(piece)
                        yield piece
                    if stops.matched is not None or item.finish_reason:
                        finish = "stop" if stops.matched is not None else item.finish_reason
                        break
                    yield FLUSH  # nothing more until the engine's next chunk
            tail = stops.push(decoder.flush()) + stops.flush()
            for piece in parser.push(tail) + parser.flush():
                pieces.append(piece)
                yield piece
            text, calls = split_output(pieces)
            done = True  # the call is complete even if the consumer stops at Finished
            recorded = True
            written = self._finish(prep, trace, out_ids, logprobs, finish, pieces, stops.matched)
            if written is not None:
                await record_written(written)
            yield Finished(
                finish=finish,
                stop_sequence=stops.matched,
                prompt_tokens=len(prep.plan.prompt_ids),
                output_tokens=len(out_ids),
                text=text,
                tool_calls=calls,
            )
        except ContextLengthError as e:
            finish, error = "error", str(e)
            raise RequestError(str(e), param="messages", code="context_length_exceeded") from e
        except NoReplicaError as e:
            finish, error = "error", str(e)
            raise RequestError(str(e), status=503, code="no_replica") from e
        except (asyncio.CancelledError, GeneratorExit):
            if not done:
                finish, error = "abort", "client went away"
            raise
        except Exception as e:
            finish, error = "error", f"{type(e).__name__}: {e}"
            log.exception("call %s/%d failed", prep.session.name, prep.call_index)
            raise RequestError(f"internal error: {error}", status=500) from e
        finally:
            if not recorded:  # failed or aborted: recorded behind the call, not awaited
                self._finish(prep, trace, out_ids, logprobs, finish, pieces, stops.matched, error)

    def _finish(
        self,
        prep: Prepared,
        trace: RouteTrace,
        out_ids: list[int],
        logprobs: list[float],
        finish: str,
        pieces: list,
        stop_seq: str | None,
        error: str | None = None,
    ) -> Future | None:
        """Remember the call in its session (if it completed), count it, and hand its
        record to the sink; returns the write's future (None without a sink)."""
        text, calls = split_output(pieces)
        ok = finish in ("stop", "length")
        if ok:
            calls_key = [(c.name, c.arguments) for c in calls]
            closing = self.renderer.closing_after(out_ids)
            prep.session.commit(
                prep.plan, prep.call_index, out_ids, reply_key(text, calls_key), closing
            )
        else:
            prep.session.abandon(prep.plan)
        total = time.perf_counter() - prep.t0
        self.metrics.observe(
            session=prep.session.name,
            replica=",".join(trace.replicas),
            prompt=len(prep.plan.prompt_ids),
            output=len(out_ids),
            reused=prep.plan.prefix_len,
            queue_s=trace.queue_s,
            latency_s=total,
            error=not ok,
        )
        if self.sink is None:
            return None
        extra: dict = {"model": prep.req.model}
        if stop_seq is not None:
            extra["stop_sequence"] = stop_seq
        if trace.retries:
            extra["retries"] = trace.retries
        if error:
            extra["error"] = error
        record_finish = "tool_calls" if (finish == "stop" and calls) else finish
        record = self._record(prep, trace, out_ids, logprobs, record_finish, total, extra)
        # a failing sink must not take calls down with it: the failure is logged (and a
        # RecordWriter raises it at flush/close), the call goes on
        return submit_record(self.sink, record)

    def _record(
        self,
        prep: Prepared,
        trace: RouteTrace,
        out_ids: list[int],
        logprobs: list[float],
        finish: str,
        total: float,
        extra: dict,
    ) -> CallRecord:
        versions = sorted(set(trace.weight_versions))
        if len(versions) > 1:  # a continuation on another replica with other weights
            extra["weight_versions"] = versions
        p, plan = prep.params, prep.plan
        return CallRecord(
            session=prep.session.name,
            call_index=prep.call_index,
            branch=plan.branch,
            parent=plan.parent.call_index if plan.parent is not None else None,
            role=plan.role,
            prompt_ids=plan.prompt_ids,
            output_ids=out_ids,
            output_logprobs=logprobs,
            weight_version=versions[-1]
            if versions
            else self.router.replicas[0].engine.weight_version,
            sampling={
                "temperature": p.temperature,
                "top_p": p.top_p,
                "top_k": p.top_k,
                "min_p": p.min_p,
                "max_new_tokens": p.max_new_tokens,
                "stop": prep.req.stop,
                "stop_token_ids": p.stop_token_ids,
                "seed": p.seed,
            },
            finish_reason=finish,
            timings={
                "queue": trace.queue_s,
                "engine_queue": trace.engine_queue_s,
                "prefill": trace.first_token_s,
                "decode": max(trace.engine_s - trace.first_token_s, 0.0),
                "render": prep.render_s,
                "total": total,
            },
            replica=",".join(trace.replicas),
            api=prep.req.api,
            created=prep.created,
            extra=extra,
            prefix_len=plan.prefix_len,
        )


async def with_pings(items: AsyncIterator, interval_s: float) -> AsyncIterator:
    """``items``, with ``PING`` yielded while the first item takes longer than
    ``interval_s`` (a prefill; the pending item is awaited, never cancelled). Later items
    pass straight through: one task per token would cost more than the gaps it covers."""
    pending: asyncio.Future | None = None
    try:
        while True:
            pending = asyncio.ensure_future(items.__anext__())
            await asyncio.sleep(0)  # an item that is ready at once needs no timer
            done = pending.done() or (await asyncio.wait({pending}, timeout=interval_s))[0]
            while not done:
                yield PING
                done, _ = await asyncio.wait({pending}, timeout=interval_s)
            task, pending = pending, None
            try:
                first = task.result()
            except StopAsyncIteration:
                return
            yield first
            if first is not PING:  # the router's own pings: still queued, keep watching
                break
        async for item in items:
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await items.aclose()
