"""A scheduling workload that needs no sandbox: agents alternate model calls through the
proxy with tool calls whose time is waiting.

Each episode of a group is a chat session: ``turns`` model calls over HTTP, each followed
by an injected ``tool_delay_s`` sleep (a tool that waits: on a CPU machine a real tool
would compete with the cells for the cores, and the measurement is about scheduling).
Its reward is the share of even token ids it sampled (a signal the policy can learn, so
advantages are not all zero). Records come from the proxy's sink (:class:`RecordBook`);
a finished group is its token tree, trained on as packed units. Each finished group's
calls and tool waits are kept as plain numbers (``trace``) for the simulator to replay
(:func:`gyre_env.sim.trace.load_elastic_trace`).
"""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from dataclasses import dataclass, field

from gyre_env.scheduler.driver import CallClock


class RecordBook:
    """The proxy's record sink: keeps each session's records and times every call."""

    def __init__(self, clock: CallClock | None = None):
        self.clock = clock or CallClock()
        self._lock = threading.Lock()
        self._by_session: dict[str, list] = collections.defaultdict(list)

    def write(self, record) -> None:
        with self._lock:
            self._by_session[record.session].append(record)
        self.clock.write(record)

    def take(self, session: str) -> list:
        with self._lock:
            return self._by_session.pop(session, [])

    def close(self) -> None:
        """Nothing to release."""


@dataclass(kw_only=True)
class ToolLoopPhase:
    """A stretch of consecutive groups whose episodes differ from the base shape (a changing
    load: a burst of short tasks, episodes that lengthen, a slow tool pool)."""

    groups: int
    """Groups in this phase (the phases repeat in order)."""
    turns: int | None = None
    """Model calls per episode in this phase (None: the config's ``turns``)."""
    tool_scale: float = 1.0
    """Multiplies each tool call's wait."""

    def __post_init__(self) -> None:
        if self.groups < 1 or (self.turns is not None and self.turns < 1):
            raise ValueError(f"a tool-loop phase needs groups >= 1 and turns >= 1: {self}")
        if not self.tool_scale > 0:
            raise ValueError(f"a tool-loop phase needs tool_scale > 0: {self}")


@dataclass(kw_only=True)
class ToolLoopConfig:
    """The shape of the agents' work."""

    group_size: int = 4
    """Episodes per GRPO group."""
    turns: int = 3
    """Model calls per episode, each followed by a tool call."""
    max_tokens: int = 16
    tool_delay_s: float = 0.5
    """Injected wait of each tool call (seconds)."""
    tool_jitter: float = 0.0
    """Each tool call waits ``tool_delay_s`` x a factor drawn uniformly from ``1 +- jitter``
    (mean ``tool_delay_s``), fixed by the session and turn, so every run of the same groups
    waits the same; 0: every call waits exactly ``tool_delay_s`` (and the agents that start
    together stay in lockstep)."""
    temperature: float = 1.0
    token_budget: int = 4096
    """Tokens per packed training unit."""
    phases: list[ToolLoopPhase] = field(default_factory=list)
    """A changing load: group ``i`` takes the shape of the phase it falls in, the phases
    cycling in order; empty: every group alike."""

    def phase_of(self, index: int) -> ToolLoopPhase | None:
        """The phase of group ``index`` (None without phases)."""
        if not self.phases:
            return None
        i = index % sum(p.groups for p in self.phases)
        for phase in self.phases:
            if i < phase.groups:
                return phase
            i -= phase.groups
        raise AssertionError("unreachable")

    def turns_of(self, index: int) -> int:
        """Model calls per episode of group ``index``."""
        phase = self.phase_of(index)
        return phase.turns if phase is not None and phase.turns is not None else self.turns


@dataclass
class Group:
    index: int
    trees: list
    rewards: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0


class ToolLoopWorkload:
    """``Workload`` of chat sessions with waiting tool calls (see the module docstring)."""

    def __init__(self, base_url, book: RecordBook, config: ToolLoopConfig | None = None):
        """``base_url(session)``: the proxy's OpenAI base URL for a session."""
        # imported now, not by the first groups' agents inside the measured run
        import httpx  # noqa: F401

        from gyre_env.trajectory import tree  # noqa: F401

        self.base_url, self.book = base_url, book
        self.config = config or ToolLoopConfig()
        self._stop = threading.Event()
        self.trace: list[dict] = []
        """Per finished group: ``index``, ``start`` and ``end`` (``time.time()``) and per
        episode its calls (``new`` prompt tokens past the cached prefix, ``out`` tokens,
        ``start``, the record's ``queue`` / ``engine_queue`` / ``prefill`` / ``decode`` /
        ``total`` seconds and the serving ``replica``) and ``tool_s`` (each call's injected tool wait)."""

    def stop(self) -> None:
        """The run is over: episodes end at their next model or tool call."""
        self._stop.set()

    def tool_delay(self, session: str, turn: int, index: int | None = None) -> float:
        """Seconds the tool call after ``turn`` of ``session`` (of group ``index``: its
        phase scales the wait) waits."""
        cfg = self.config
        phase = cfg.phase_of(index) if index is not None else None
        base = cfg.tool_delay_s * (phase.tool_scale if phase is not None else 1.0)
        if not cfg.tool_jitter:
            return base
        u = random.Random(f"{session}/{turn}").random()
        return base * (1.0 + cfg.tool_jitter * (2.0 * u - 1.0))

    def run_group(self, index: int) -> Group:
        from gyre_env.trajectory.tree import EpisodeInfo, build_trees

        t0, started = time.monotonic(), time.time()
        sessions = [f"g{index}.e{k}" for k in range(self.config.group_size)]
        asyncio.run(self._episodes(sessions, index))
        if self._stop.is_set():  # cut short: not a group to train on
            return Group(index, [], wall_s=time.monotonic() - t0)
        records, infos, rewards, episodes = [], [], [], []
        for s in sessions:
            recs = self.book.take(s)
            episodes.append(self._trace_episode(s, recs, index))
            ids = [t for r in recs for t in r.output_ids]
            reward = sum(t % 2 == 0 for t in ids) / max(len(ids), 1)
            rewards.append(reward)
            records += recs
            infos.append(
                EpisodeInfo(session=s, group=f"g{index}", outcome="success", reward=reward)
            )
        trees = build_trees(records, infos)
        tokens = sum(len(r.prompt_ids) + len(r.output_ids) for r in records)
        self.trace.append(dict(index=index, start=started, end=time.time(), episodes=episodes))
        return Group(index, trees, rewards, tokens, time.monotonic() - t0)

    def _trace_episode(self, session: str, records: list, index: int) -> dict:
        from gyre_env.trajectory.records import trace_calls

        calls = trace_calls(records)
        tool = [self.tool_delay(session, turn, index) for turn in range(len(calls))]
        return dict(session=session, calls=calls, tool_s=tool)

    async def _episodes(self, sessions: list[str], index: int) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=600) as client:
            await asyncio.gather(*(self._episode(client, s, index) for s in sessions))

    async def _episode(self, client, session: str, index: int) -> None:
        cfg = self.config
        messages = [{"role": "user", "content": f"{session}: list the files, then fix the test."}]
        body = {"model": "m", "max_tokens": cfg.max_tokens, "temperature": cfg.temperature}
        for turn in range(cfg.turns_of(index)):
            if self._stop.is_set():
                return
            r = await client.post(
                self.base_url(session) + "/chat/completions", json={**body, "messages": messages}
            )
            r.raise_for_status()
            text = r.json()["choices"][0]["message"].get("content") or ""
            # the tool call: waiting, not computing (cut short when the run is over)
            end = time.monotonic() + self.tool_delay(session, turn, index)
            while not self._stop.is_set() and (left := end - time.monotonic()) > 0:
                await asyncio.sleep(min(left, 0.05))
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"tool output {turn}: ok"},
            ]

    def units(self, groups: list[Group]) -> list:
        from gyre_env.trajectory.packing import pack
        from gyre_env.trajectory.sampling import SampleConfig, bounded_samples

        trees = [t for g in groups for t in g.trees]
        units, _ = bounded_samples(trees, SampleConfig(token_budget=self.config.token_budget))
        return [pack(u) for u in units]

    def tokens(self, group: Group) -> int:
        return group.tokens
