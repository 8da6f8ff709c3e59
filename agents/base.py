"""What every agent shares: how an episode ends, the context it runs in, and its clock.

An agent is anything with ``run(ctx) -> AgentResult``. It acts on the environment only
through :meth:`EpisodeContext.step`, which times the step, keeps the reward trace and
notices the end of the episode, so the runner can split an episode's wall time into
waiting on the model, executing tools and scoring without knowing the agent.

Agent loops end by raising an :class:`AgentStop` subclass that carries an
:class:`EndReason` (the mini-swe-agent shape: ``Submitted``, ``LimitsExceeded``, ...);
``run`` turns it into the ``AgentResult``.
"""

from __future__ import annotations

import enum
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gyre_env.phases import PHASES, PhaseCounts

if TYPE_CHECKING:
    from gyre_env.agents.context import EpisodeContext


class EndReason(str, enum.Enum):
    """Why an agent stopped. Stored as its value in results."""

    SUBMITTED = "submitted"
    """The agent called ``submit``."""
    ENV_ENDED = "env_ended"
    """The env ended the episode (its step or wall-clock limit)."""
    STEP_BUDGET = "step_budget"
    """The agent's own step budget ran out."""
    TOKEN_BUDGET = "token_budget"
    """The agent's token budget ran out."""
    TIME_LIMIT = "time_limit"
    """The runner's per-episode time limit hit."""
    CANCELLED = "cancelled"
    """The run was cancelled."""
    NO_TOOL_CALL = "no_tool_call"
    """The model kept answering without a tool call after being nudged."""
    CONTEXT_FULL = "context_full"
    """The context could not be compacted below the model's window."""
    MODEL_ERROR = "model_error"
    """The model endpoint failed (HTTP error, proxy down) after retries."""
    CLI_EXITED = "cli_exited"
    """A black-box CLI agent exited on its own."""
    AGENT_ERROR = "agent_error"
    """A bug or crash in the agent itself."""


class AgentStop(Exception):
    """Raised inside an agent loop to end the episode; carries the reason."""

    reason = EndReason.AGENT_ERROR

    def __init__(self, message: str = "", reason: EndReason | None = None):
        super().__init__(message or self.__class__.__name__)
        if reason is not None:
            self.reason = reason


class Submitted(AgentStop):
    reason = EndReason.SUBMITTED


class EpisodeEnded(AgentStop):
    reason = EndReason.ENV_ENDED


class LimitsExceeded(AgentStop):
    """A step, token or time budget ran out (the reason says which)."""

    reason = EndReason.STEP_BUDGET


class Cancelled(AgentStop):
    reason = EndReason.CANCELLED


class ModelFailure(AgentStop):
    reason = EndReason.MODEL_ERROR


@dataclass(kw_only=True)
class AgentResult:
    """What an agent reports when it stops."""

    reason: EndReason
    message: str = ""
    model_calls: int = 0
    """Model calls the agent made (or, for a CLI, the proxy recorded for its session)."""
    tokens: int = 0
    """Prompt + completion tokens reported by the model endpoint."""
    extra: dict = field(default_factory=dict)


class EpisodeClock:
    """Splits one episode's wall time into ``PHASES``; time goes to the innermost phase.

    Phases nest (a sub-agent's model calls inside the main agent's tool call count as
    ``model``). The clock also keeps the episode's entry in the runner's ``PhaseCounts`` current.
    """

    def __init__(self, waterlevel: PhaseCounts | None = None, initial: str = "agent"):
        self.waterlevel = waterlevel
        self.totals = dict.fromkeys(PHASES, 0.0)
        self._stack: list[str] = []
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self.start = self._since
        self._closed = False
        self.enter(initial)

    def enter(self, phase: str) -> None:
        """Start counting time as ``phase`` (until the matching ``leave``)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {PHASES}")
        with self._lock:
            old = self._charge()
            self._stack.append(phase)
        if self.waterlevel is not None and not self._closed:
            self.waterlevel.move(old, phase)

    def leave(self) -> None:
        """End the innermost phase; time goes back to the one around it."""
        with self._lock:
            old = self._charge()
            self._stack.pop()
            new = self._stack[-1] if self._stack else None
        if self.waterlevel is not None and not self._closed:
            self.waterlevel.move(old, new)

    def _charge(self) -> str | None:
        """Add the time since the last change to the current phase; the caller holds the lock."""
        now = time.monotonic()
        top = self._stack[-1] if self._stack else None
        if top is not None:
            self.totals[top] += now - self._since
        self._since = now
        return top

    @contextmanager
    def phase(self, name: str):
        """Count the time inside the ``with`` block as ``name``."""
        self.enter(name)
        try:
            yield
        finally:
            self.leave()

    def reattribute(self, src: str, dst: str, seconds: float) -> None:
        """Move already counted time between phases (e.g. a CLI's model time, known from
        the proxy's records only after the fact, out of ``tool``)."""
        with self._lock:
            self._charge()
            moved = max(0.0, min(seconds, self.totals[src]))
            self.totals[src] -= moved
            self.totals[dst] += moved

    def close(self) -> dict[str, float]:
        """Stop the clock; returns seconds per phase plus ``wall``."""
        with self._lock:
            top = self._charge()
            closed, self._closed = self._closed, True
        if self.waterlevel is not None and not closed and top is not None:
            self.waterlevel.move(top, None)
        out = dict(self.totals)
        out["wall"] = time.monotonic() - self.start
        return out


@dataclass(kw_only=True)
class StepRecord:
    """One env step as the runner keeps it (for reports): the tool, its reward, timing."""

    index: int
    tool: str
    reward: float
    cumulative: float
    seconds: float
    partial: float | None = None
    """The env's interim score after the step, when it reports one."""
    after_call: int | None = None
    """``call_index`` of the latest model call of the episode's session before this step
    (the trajectory store attaches the step's reward to it)."""


def episode_seed(seed: int, episode_id: str) -> int:
    """The sampling seed of one episode: ``seed`` plus a stable hash of its id, so a run's
    rollouts can be replayed exactly while its episodes sample differently."""
    import zlib

    return (seed * 1_000_003 + zlib.crc32(episode_id.encode())) % (2**31)


@runtime_checkable
class Agent(Protocol):
    """Plays one episode. ``ctx.step`` is its only way to act on the env."""

    name: str

    def run(self, ctx: EpisodeContext) -> AgentResult: ...
