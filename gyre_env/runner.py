"""The rollout runner: many episodes at once, each at its own pace.

Episodes run on a thread pool (their work is I/O: sandbox commands and model calls) up to
a concurrency limit; none waits for another (no lockstep). Each episode gets a fresh env,
a model endpoint of its own (a proxy session) and an :class:`EpisodeClock` that splits its
wall time into setup, model, tool, scoring and agent time. A :class:`PhaseCounts` counts,
live, how many episodes wait on the model vs run tools: a scheduler reads ``snapshot()``.

Limits and failures:

- a per-episode time limit: at the limit the episode is cancelled (the agent stops at its
  next step or model call) and graded; ``hard_kill_grace_s`` later its env is closed,
  which frees whatever it was blocked on;
- ``cancel()`` stops starting episodes and cancels running ones (they are not graded);
- an episode whose outcome is ``infra_error`` (the grader crashed, a container died, the
  model endpoint failed) is run again, at most ``max_retries`` times; its score is never
  counted as 0 — it is ``None`` and ``reward_valid`` is False;
- every final result goes to the sink (JSONL now) as soon as its episode ends.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gyre_env.agents.base import (
    Agent,
    AgentResult,
    AgentStop,
    EndReason,
    EpisodeClock,
)
from gyre_env.agents.context import EpisodeContext
from gyre_env.phases import PhaseCounts
from gyre_env.proxy.endpoint import ModelEndpoint

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class RunnerConfig:
    """How episodes are run."""

    parallel: int = 4
    """Episodes running at once."""
    time_limit_s: float | None = None
    """Wall-clock limit per episode attempt; None: the task's own ``wall_clock_s`` (from
    the reset ``info``) plus ``hard_kill_grace_s``, else 1800."""
    hard_kill_grace_s: float = 30.0
    """After the time limit, how long an episode may take to stop before its env is closed."""
    max_retries: int = 2
    """Extra attempts for an episode that ended as ``infra_error``."""
    wait_warn_fraction: float = 0.3
    """Warn when an episode waits on the model for more than this share of its wall time."""

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {self.parallel}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be > 0, got {self.time_limit_s}")


@dataclass(kw_only=True)
class EpisodeSpec:
    """One episode to run."""

    episode_id: str
    env_id: str
    env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of ``gym.make``."""
    reset_options: dict = field(default_factory=dict)
    """``options`` of ``reset`` (e.g. ``{"task_id": ...}``)."""
    seed: int | None = None
    group: str = ""
    """GRPO group: the attempts of one task in one iteration share it (empty: its own)."""


@dataclass(kw_only=True)
class EpisodeResult:
    """The final result of one episode (its last attempt)."""

    episode_id: str
    task_id: str = ""
    group: str = ""
    """The spec's GRPO group."""
    agent: str = ""
    session: str = ""
    """The proxy session of the final attempt (its model calls' ``CallRecord.session``)."""
    retried_sessions: list[str] = field(default_factory=list)
    """Sessions of earlier attempts that ended as ``infra_error``."""
    outcome: str = "infra_error"
    """One of ``gyre_env.scoring.OUTCOMES``."""
    score: float | None = None
    """Final score in [0, 1]; None when the reward is not valid (infra error, cancelled)."""
    reward_valid: bool = False
    total_reward: float = 0.0
    """Sum of the step rewards (equals the score in ``potential`` mode)."""
    end_reason: str = ""
    """The agent's ``EndReason`` value."""
    message: str = ""
    steps: int = 0
    model_calls: int = 0
    tokens: int = 0
    attempts: int = 1
    infra_errors: list[str] = field(default_factory=list)
    """Why earlier attempts were retried."""
    times: dict[str, float] = field(default_factory=dict)
    """Seconds: ``wall``, ``setup``, ``model``, ``tool``, ``scoring``, ``agent``."""
    wait_fraction: float = 0.0
    """``times["model"] / times["wall"]``."""
    trace: list[dict] = field(default_factory=list)
    """Per step: ``tool``, ``reward``, ``cumulative``, ``partial``, ``seconds``."""
    info: dict = field(default_factory=dict)
    """JSON-safe part of the env's last ``info`` (reward breakdown, test counts)."""
    agent_extra: dict = field(default_factory=dict)
    """What the agent reported besides its reason (a CLI's exit code and output...)."""

    def to_dict(self) -> dict:
        return asdict(self)

    def episode_infos(self, run: str = ""):
        """The ``EpisodeInfo``s of this result's attempts, as training reads them: retried
        attempts as ``infra_error`` (never trained on), the final one with its outcome,
        score and the step rewards after each model call. The one place they are built."""
        from gyre_env.trajectory.tree import EpisodeInfo

        infos = [
            EpisodeInfo(
                session=s, run=run, task=self.task_id, group=self.group, outcome="infra_error"
            )
            for s in self.retried_sessions
        ]
        if self.session:  # empty: cancelled before it started, nothing was recorded
            steps: dict[int, float] = {}
            for step in self.trace:
                if step.get("after_call") is not None:
                    call = step["after_call"]
                    steps[call] = steps.get(call, 0.0) + step["reward"]
            infos.append(
                EpisodeInfo(
                    session=self.session,
                    run=run,
                    task=self.task_id,
                    group=self.group,
                    outcome=self.outcome,
                    reward=self.score if self.score is not None else 0.0,
                    step_rewards=steps,
                )
            )
        return infos


class ResultSink(Protocol):
    def write(self, result: EpisodeResult) -> None: ...

    def close(self) -> None: ...


class JsonlResultSink:
    """One JSON line per finished episode, flushed as written (thread-safe)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, result: EpisodeResult) -> None:
        line = json.dumps(result.to_dict(), default=str) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()


class StoreResultSink:
    """Episode outcomes into the trajectory store (``gyre_env.trajectory.store``), next to
    the calls the proxy wrote there: the final attempt's session gets the outcome, score
    and per-call step rewards; retried attempts' sessions are marked ``infra_error`` so
    training leaves them out."""

    def __init__(self, store, *, run: str = "", close_store: bool = False):
        self.store, self.run, self.close_store = store, run, close_store

    def begin(self, session: str, task_id: str, group: str = "") -> None:
        """Register an attempt's session before its calls arrive (run, task, group)."""
        self.store.begin_episode(session=session, run=self.run, task=task_id, group=group)

    def write(self, result: EpisodeResult) -> None:
        for info in result.episode_infos(self.run):
            self.store.add_episode(info)

    def close(self) -> None:
        if self.close_store:
            self.store.close()


class MultiSink:
    """Writes each result to several sinks."""

    def __init__(self, *sinks: ResultSink):
        self.sinks = sinks

    def begin(self, session: str, task_id: str, group: str = "") -> None:
        for sink in self.sinks:
            if hasattr(sink, "begin"):
                sink.begin(session, task_id, group)

    def write(self, result: EpisodeResult) -> None:
        for sink in self.sinks:
            sink.write(result)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


EndpointFactory = Callable[[str], ModelEndpoint]
"""Gives an attempt its model endpoint from a session name (unique per attempt)."""


class _InfraFailure(Exception):
    """The env or the model endpoint failed in a way the agent cannot cause."""


class Runner:
    """Runs ``EpisodeSpec``s with one ``agent`` (its ``run`` must be thread-safe)."""

    def __init__(
        self,
        agent: Agent,
        config: RunnerConfig | None = None,
        *,
        endpoint_factory: EndpointFactory | None = None,
        sink: ResultSink | None = None,
        on_result: Callable[[EpisodeResult], None] | None = None,
        waterlevel: PhaseCounts | None = None,
        release_endpoint: Callable[[str], None] | None = None,
    ):
        """``endpoint_factory(session)`` gives each attempt its model endpoint and
        ``release_endpoint(session)`` is called when the attempt is over (e.g.
        ``ModelService.endpoint`` / ``ModelService.release``)."""
        self.agent = agent
        self.release_endpoint = release_endpoint
        self.config = config or RunnerConfig()
        self.endpoint_factory = endpoint_factory
        self.sink = sink
        self.on_result = on_result
        self.waterlevel = waterlevel or PhaseCounts()
        self._cancel = threading.Event()
        self._active: dict[str, tuple[EpisodeContext, float]] = {}
        self._active_lock = threading.Lock()
        self._sink_lock = threading.Lock()
        self._closers: list[threading.Thread] = []

    # ------------------------------------------------------------------ public

    def cancel(self) -> None:
        """Start no more episodes and cancel the running ones: they end ``cancelled``,
        ungraded, and their envs are closed at once (which ends a blocked tool call)."""
        self._cancel.set()
        with self._active_lock:
            active = list(self._active.values())
        for ctx, _ in active:
            ctx.cancel_reason = EndReason.CANCELLED
            ctx.cancel.set()
            ctx.killed = True
            self._closers.append(_close_in_background(ctx.env))

    def run(self, specs: Iterable[EpisodeSpec]) -> list[EpisodeResult]:
        """Run every spec; returns the results in the order of ``specs``."""
        specs = list(specs)
        ids = [s.episode_id for s in specs]
        if len(set(ids)) != len(ids):
            raise ValueError("episode ids must be unique")
        pending = [len(specs)]
        pending_lock = threading.Lock()
        self.waterlevel.set_queued(len(specs))

        def one(spec: EpisodeSpec) -> EpisodeResult:
            with pending_lock:
                pending[0] -= 1
                self.waterlevel.set_queued(pending[0])
            result = self._run_with_retries(spec)
            self._emit(result)
            return result

        watchdog = threading.Thread(target=self._watchdog, name="gyre-runner-watchdog", daemon=True)
        stop_watchdog = threading.Event()
        self._stop_watchdog = stop_watchdog
        watchdog.start()
        try:
            with ThreadPoolExecutor(
                self.config.parallel, thread_name_prefix="gyre-episode"
            ) as pool:
                futures = [pool.submit(one, spec) for spec in specs]
                try:
                    return [f.result() for f in futures]
                except BaseException:  # KeyboardInterrupt, SIGTERM turned into one, a bug
                    self.cancel()  # before the pool's exit waits for the running episodes
                    for f in futures:
                        f.cancel()
                    raise
        finally:
            stop_watchdog.set()
            watchdog.join(timeout=5)
            for closer in self._closers:  # sandboxes closed on cancel or hard limit
                closer.join(timeout=120)

    # ------------------------------------------------------------------ episodes

    def _emit(self, result: EpisodeResult) -> None:
        with self._sink_lock:
            if self.sink is not None:
                self.sink.write(result)
            if self.on_result is not None:
                self.on_result(result)

    def _run_with_retries(self, spec: EpisodeSpec) -> EpisodeResult:
        infra: list[str] = []
        retried: list[str] = []
        for attempt in range(1, self.config.max_retries + 2):
            if self._cancel.is_set():
                result = EpisodeResult(
                    episode_id=spec.episode_id,
                    group=spec.group,
                    agent=self.agent.name,
                    outcome="cancelled",
                    end_reason=EndReason.CANCELLED.value,
                    message="run cancelled before start",
                )
            else:
                result = self._attempt(spec, attempt)
            result.attempts, result.infra_errors = attempt, list(infra)
            result.retried_sessions = list(retried)
            if result.outcome != "infra_error" or self._cancel.is_set():
                return result
            infra.append(result.message)
            retried.append(result.session)
            if attempt <= self.config.max_retries:
                log.warning(
                    "episode %s: infra error (%s); retrying", spec.episode_id, result.message
                )
        result.infra_errors, result.retried_sessions = infra[:-1], retried[:-1]
        return result

    def _attempt(self, spec: EpisodeSpec, attempt: int) -> EpisodeResult:
        session = spec.episode_id if attempt == 1 else f"{spec.episode_id}.r{attempt - 1}"
        result = EpisodeResult(
            episode_id=spec.episode_id, agent=self.agent.name, session=session, group=spec.group
        )
        clock = EpisodeClock(self.waterlevel)
        self.waterlevel.add_running(1)
        env = ctx = None
        try:
            env, ctx = self._start(spec, session, clock)
            result.task_id = ctx.task_id
            if hasattr(self.sink, "begin"):  # e.g. the trajectory store: before any call
                self.sink.begin(session, ctx.task_id, spec.group)
            agent_result = self._play(ctx)
            self._settle(ctx, agent_result, result)
        except _InfraFailure as e:
            result.outcome, result.message = "infra_error", str(e)
            result.end_reason = result.end_reason or EndReason.AGENT_ERROR.value
        finally:
            if ctx is not None:
                with self._active_lock:
                    self._active.pop(session, None)
                if self.release_endpoint is not None and ctx.endpoint is not None:
                    self.release_endpoint(session)
            if env is not None:
                _close_quietly(env)
            result.times = clock.close()
            self.waterlevel.add_running(-1)
        if ctx is not None:
            result.steps = len(ctx.trace)
            result.trace = [asdict(s) for s in ctx.trace]
            result.total_reward = ctx.total_reward
        wall = result.times.get("wall", 0.0)
        result.wait_fraction = result.times.get("model", 0.0) / wall if wall > 0 else 0.0
        if result.wait_fraction > self.config.wait_warn_fraction:
            log.warning(
                "episode %s waited on the model %.0f%% of its wall time (%.1fs of %.1fs)",
                spec.episode_id,
                100 * result.wait_fraction,
                result.times["model"],
                wall,
            )
        return result

    def _start(self, spec: EpisodeSpec, session: str, clock: EpisodeClock):
        """Make and reset the env. A bad env id, kwargs or options raise; other failures
        here (a sandbox that does not start) are infrastructure failures."""
        import gymnasium as gym

        env = None
        with clock.phase("setup"):
            try:
                env = gym.make(spec.env_id, **spec.env_kwargs)
                obs, info = env.reset(seed=spec.seed, options=dict(spec.reset_options) or None)
            except (gym.error.Error, KeyError, TypeError, ValueError):
                if env is not None:
                    _close_quietly(env)
                raise
            except Exception as e:
                if env is not None:
                    _close_quietly(env)
                raise _InfraFailure(f"env start failed: {type(e).__name__}: {e}") from e
        endpoint = self.endpoint_factory(session) if self.endpoint_factory else None
        limit = self.config.time_limit_s
        if limit is None:
            task_limit = info.get("wall_clock_s") or (info.get("task") or {}).get("wall_clock_s")
            limit = float(task_limit) + self.config.hard_kill_grace_s if task_limit else 1800.0
        ctx = EpisodeContext(
            episode_id=spec.episode_id,
            env=env,
            observation=obs,
            info=info,
            clock=clock,
            endpoint=endpoint,
            deadline=time.monotonic() + limit,
        )
        with self._active_lock:
            self._active[session] = (ctx, ctx.deadline + self.config.hard_kill_grace_s)
            if self._cancel.is_set():
                ctx.cancel.set()
        return env, ctx

    def _play(self, ctx: EpisodeContext) -> AgentResult:
        """Run the agent; classify what escapes it."""
        try:
            return self.agent.run(ctx)
        except AgentStop as stop:
            return AgentResult(reason=stop.reason, message=str(stop))
        except Exception as e:
            if ctx.killed:  # its env was closed under it (cancel or hard time limit)
                return AgentResult(reason=ctx.cancel_reason, message=f"stopped: {e}")
            if _is_infra(e):
                raise _InfraFailure(f"{type(e).__name__}: {e}") from e
            log.error(
                "agent %s crashed in %s:\n%s",
                self.agent.name,
                ctx.episode_id,
                traceback.format_exc(),
            )
            return AgentResult(reason=EndReason.AGENT_ERROR, message=f"{type(e).__name__}: {e}")

    def _settle(self, ctx: EpisodeContext, agent_result: AgentResult, result: EpisodeResult):
        """Grade (unless cancelled) and fill the result from the env's last info."""
        result.end_reason = agent_result.reason.value
        result.message = agent_result.message
        result.model_calls, result.tokens = agent_result.model_calls, agent_result.tokens
        result.agent_extra = _json_safe(agent_result.extra)
        if agent_result.reason == EndReason.CANCELLED or (
            ctx.cancel.is_set() and ctx.cancel_reason == EndReason.CANCELLED
        ):
            result.outcome = "cancelled"
            return
        if ctx.killed:  # past the hard time limit: nothing left to grade, reward unknown
            result.outcome, result.reward_valid, result.score = "killed", False, None
            result.message = f"closed {self.config.hard_kill_grace_s:.0f}s after the time limit"
            return
        if agent_result.reason == EndReason.MODEL_ERROR:
            raise _InfraFailure(f"model endpoint failed: {agent_result.message}")
        try:
            ctx.finish()
        except Exception as e:
            raise _InfraFailure(f"grading failed: {type(e).__name__}: {e}") from e
        info = ctx.last_info
        result.info = _json_safe(info)
        result.reward_valid = bool(info.get("reward_valid", True))
        result.outcome = str(info.get("outcome") or ("infra_error" if not ctx.done else "failure"))
        if result.outcome == "infra_error" or not result.reward_valid:
            result.outcome, result.reward_valid, result.score = "infra_error", False, None
            # the grader's reason, not the agent's stop message ("1 steps"), says why
            why = str(info.get("error") or info.get("infra_error") or "")
            result.message = why or result.message
            return
        if agent_result.reason == EndReason.AGENT_ERROR and result.outcome == "failure":
            result.outcome = "agent_error"
        result.score = final_score(info, ctx.total_reward)

    def _watchdog(self) -> None:
        """Cancel episodes past their time limit; close the env of those past the grace."""
        while not self._stop_watchdog.wait(0.25):
            now = time.monotonic()
            with self._active_lock:
                active = list(self._active.items())
            for session, (ctx, hard) in active:
                if now > ctx.deadline and not ctx.cancel.is_set():
                    ctx.cancel_reason = EndReason.TIME_LIMIT
                    ctx.cancel.set()
                if now > hard:
                    log.warning(
                        "episode %s did not stop after its time limit: closing its env",
                        ctx.episode_id,
                    )
                    with self._active_lock:
                        self._active.pop(session, None)
                    ctx.killed = True
                    self._closers.append(_close_in_background(ctx.env))


def final_score(info: dict, total_reward: float) -> float:
    """The episode's final score from the terminal ``info`` (``info["reward"]["final_score"]``;
    the return if the env gives none)."""
    reward = info.get("reward")
    if isinstance(reward, dict) and isinstance(reward.get("final_score"), (int, float)):
        return float(reward["final_score"])
    return float(total_reward)


def _is_infra(e: BaseException) -> bool:
    """Exceptions that mean the machinery failed, not the agent: sandbox and engine errors."""
    from gyre_env.sandbox.base import SandboxError

    if isinstance(e, (SandboxError, ConnectionError, TimeoutError)):
        return True
    return type(e).__module__.startswith(("docker", "httpx", "httpcore", "openai"))


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception as e:  # closing is best effort
        log.warning("env close failed: %s", e)


def _close_in_background(env: Any) -> threading.Thread:
    """Close an env from another thread without waiting: a sandbox may finish the command
    it is running before it closes."""
    thread = threading.Thread(
        target=_close_quietly, args=(env,), name="gyre-env-close", daemon=True
    )
    thread.start()
    return thread


def _json_safe(data: Any, depth: int = 0) -> Any:
    """A JSON-serialisable copy (tool schemas and big blobs dropped)."""
    if depth > 6:
        return None
    if isinstance(data, dict):
        return {str(k): _json_safe(v, depth + 1) for k, v in data.items() if k not in ("tools",)}
    if isinstance(data, (list, tuple)):
        return [_json_safe(v, depth + 1) for v in data[:200]]
    if isinstance(data, (str, int, float, bool)) or data is None:
        return data[:4000] if isinstance(data, str) else data
    return str(data)[:1000]
