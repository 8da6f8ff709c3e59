"""The episode context: an agent's handle on its env, its model endpoint and its limits."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gyre_env.agents.base import (
    AgentStop,
    Cancelled,
    EndReason,
    EpisodeClock,
    EpisodeEnded,
    LimitsExceeded,
    StepRecord,
)

from gyre_env.proxy.endpoint import ModelEndpoint

SUBMIT = {"name": "submit", "arguments": {}}


@dataclass(kw_only=True)
class EpisodeContext:
    """Everything one episode's agent may use. Built by the runner, one per attempt."""

    episode_id: str
    env: Any
    """The Gymnasium env (already reset)."""
    observation: str
    """The observation ``reset`` returned: the task prompt."""
    info: dict
    """The ``info`` ``reset`` returned (``tools``, task metadata)."""
    clock: EpisodeClock
    endpoint: ModelEndpoint | None = None
    """The episode's proxy session; None for agents that need no model (scripted)."""
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set by the runner to cancel the episode (run cancelled or time limit hit)."""
    cancel_reason: EndReason = EndReason.CANCELLED
    deadline: float = float("inf")
    """``time.monotonic()`` value after which the episode is over its time limit."""
    trace: list[StepRecord] = field(default_factory=list)
    last_info: dict = field(default_factory=dict)
    total_reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    killed: bool = False
    """The runner closed the env under the agent (cancel, or past the hard time limit)."""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def tools(self) -> list[dict]:
        """The tools' JSON schemas from ``info["tools"]``."""
        return list(self.info.get("tools") or [])

    @property
    def task_id(self) -> str:
        return str(self.info.get("task_id") or self.info.get("task", {}).get("id", ""))

    def model_endpoint(self, api: str, agent: str) -> ModelEndpoint:
        """The episode's endpoint, checked to exist and to speak ``api`` (``agent`` names
        who asks, in the error)."""
        if self.endpoint is None:
            raise ValueError(f"{agent} needs a model endpoint (a proxy session)")
        if self.endpoint.api != api:
            names = {"openai": "OpenAI", "anthropic": "Anthropic"}
            raise ValueError(
                f"{agent} speaks the {names.get(api, api)} API; its endpoint speaks "
                f"{names.get(self.endpoint.api, self.endpoint.api)}"
            )
        return self.endpoint

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def check_live(self) -> None:
        """Raise the matching ``AgentStop`` if the episode was cancelled or is out of time."""
        if self.cancel.is_set():
            raise Cancelled(f"episode cancelled ({self.cancel_reason.value})", self.cancel_reason)
        if time.monotonic() > self.deadline:
            raise LimitsExceeded("episode time limit reached", EndReason.TIME_LIMIT)

    def _env_api(self, name: str):
        """The env's own ``name`` (a method or value of its agent API), looked up through its
        wrappers (``get_wrapper_attr``), so a wrapper may override it; None if it has none.
        Agents reach the env only through these and ``step``, never its internals."""
        get = getattr(self.env, "get_wrapper_attr", None)
        if get is None:
            return getattr(self.env, name, None)
        try:
            return get(name)
        except AttributeError:
            return None

    def sandbox(self):
        """The episode's sandbox (CLI agents run inside it): the env's ``sandbox_handle()``."""
        handle = self._env_api("sandbox_handle")
        if handle is None:
            raise TypeError(f"{self.env} has no sandbox_handle(); a CLI agent needs a sandbox")
        return handle()

    def task_spec(self):
        """The episode's ``Task`` (its full spec, gold included: for host-side tooling such as
        the gold agent, never for the model): the env's ``task_spec()``, else the task of
        ``task_id`` in the registered suites."""
        spec = self._env_api("task_spec")
        if spec is not None:
            return spec()
        from gyre_env.tasks import get_task

        try:
            return get_task(self.task_id)
        except (KeyError, ValueError) as e:
            raise AgentStop(f"cannot find this episode's task: {e}", EndReason.AGENT_ERROR) from e

    def interim_reward(self) -> None:
        """At a model-turn boundary of an agent that acts outside ``step`` (a CLI agent):
        the env's ``interim_reward()``, timed as ``scoring`` and recorded as a step of the
        trace. Nothing happens with an env that pays no interim rewards."""
        interim = self._env_api("interim_reward")
        if interim is None:
            return
        with self.clock.phase("scoring"):
            reward, info = interim()
        if info:
            self.record_external_step("model-turn", reward, info)

    def step(self, action: dict) -> tuple[Any, float, bool, bool, dict]:
        """Execute one tool call with ``env.step``; time it as ``tool`` (``scoring`` for
        ``submit``) and record it. Raises ``EpisodeEnded`` if the episode is already over."""
        self.check_live()
        if self.done:
            raise EpisodeEnded("the episode is over; no more steps")
        name = action.get("name", "?") if isinstance(action, dict) else "?"
        start = time.monotonic()
        with self.clock.phase("scoring" if name == "submit" else "tool"):
            obs, reward, terminated, truncated, info = self.env.step(action)
        seconds = time.monotonic() - start
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        if name != "submit":  # a tool step that scored (or graded, at a limit): move that time
            scoring = float(self._env_api("last_scoring_s") or 0.0)
            if scoring > 0:
                self.clock.reattribute("tool", "scoring", min(scoring, seconds))
        self.total_reward += float(reward)
        self.trace.append(
            StepRecord(
                index=len(self.trace),
                tool=name,
                reward=float(reward),
                cumulative=self.total_reward,
                seconds=seconds,
                partial=_partial_score(info),
                after_call=self.latest_call(),
            )
        )
        self.last_info = info
        return obs, float(reward), self.terminated, self.truncated, info

    def record_external_step(self, label: str, reward: float, info: dict) -> None:
        """Record a reward the env gave outside ``step`` (a CLI agent's interim reward at a
        model-turn boundary), so the trace and the return include it."""
        self.total_reward += float(reward)
        self.trace.append(
            StepRecord(
                index=len(self.trace),
                tool=label,
                reward=float(reward),
                cumulative=self.total_reward,
                seconds=0.0,
                partial=_partial_score(info),
                after_call=self.latest_call(),
            )
        )
        self.last_info = info

    def latest_call(self) -> int | None:
        """``call_index`` of the session's latest finished model call, if the proxy's record
        tap is at hand."""
        ep = self.endpoint
        tap = getattr(ep, "calls", None) if ep is not None else None
        if tap is None:
            return None
        calls = tap.calls(ep.session)
        return int(calls[-1]["call_index"]) if calls else None

    def finish(self) -> None:
        """Grade the episode if the agent stopped without the env ending it: one ``submit``
        step, so budget and time-limit endings still get the final score of the work done."""
        if self.done:
            return
        try:
            self.cancel.clear()
            self.deadline = float("inf")
            self.step(SUBMIT)
        except AgentStop:
            pass


def _partial_score(info: dict) -> float | None:
    """The interim score Φ after a step (``info["reward"]["potential"]["phi"]``), or the
    final score once graded."""
    reward = info.get("reward") if isinstance(info, dict) else None
    if not isinstance(reward, dict):
        return None
    if isinstance(reward.get("final_score"), (int, float)):
        return float(reward["final_score"])
    potential = reward.get("potential")
    if isinstance(potential, dict) and isinstance(potential.get("phi"), (int, float)):
        return float(potential["phi"])
    return None
