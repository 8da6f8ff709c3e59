"""Scripted agents: replay a fixed list of tool calls (tests, gold runs, demonstrations).

``ScriptedAgent(actions)`` replays the calls in order and stops at ``submit`` or when the
script runs out. ``GoldAgent`` writes a task's reference solution (its ``gold/`` folder)
file by file with ``write_file`` and submits, so a run of it over a suite checks the whole
pipeline: env, tools, sandbox, grader, runner and report must all agree on 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre_env.agents.base import AgentResult, AgentStop, EndReason, Submitted
from gyre_env.agents.context import EpisodeContext


@dataclass
class ScriptedAgent:
    """Replays ``actions`` (``{"name": ..., "arguments": {...}}``) in order."""

    actions: list[dict]
    name: str = "scripted"

    def __post_init__(self) -> None:
        for i, action in enumerate(self.actions):
            if not isinstance(action, dict) or not isinstance(action.get("name"), str):
                raise ValueError(f"scripted action {i} must be a dict with a 'name': {action!r}")
            if not isinstance(action.get("arguments", {}), dict):
                raise ValueError(f"scripted action {i}: 'arguments' must be a dict")

    def run(self, ctx: EpisodeContext) -> AgentResult:
        try:
            for action in self.plan(ctx):
                ctx.step({"name": action["name"], "arguments": action.get("arguments", {})})
                if action["name"] == "submit":
                    raise Submitted()
                if ctx.done:
                    return AgentResult(reason=EndReason.ENV_ENDED)
        except AgentStop as stop:
            return AgentResult(reason=stop.reason, message=str(stop))
        return AgentResult(reason=EndReason.STEP_BUDGET, message="the script ran out")

    def plan(self, ctx: EpisodeContext) -> list[dict]:
        """The calls to replay for this episode."""
        return self.actions


def gold_actions(gold_dir: str | Path) -> list[dict]:
    """``write_file`` for every file under ``gold_dir`` (sorted), then ``submit``."""
    root = Path(gold_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"gold folder {root} does not exist")
    actions = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        try:
            content = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"gold file {path} is not UTF-8 text; write_file takes text") from e
        actions.append({"name": "write_file", "arguments": {"path": rel, "content": content}})
    actions.append({"name": "submit", "arguments": {}})
    return actions


class GoldAgent(ScriptedAgent):
    """Writes the episode's task's gold solution and submits."""

    def __init__(self, name: str = "gold"):
        super().__init__(actions=[], name=name)

    def plan(self, ctx: EpisodeContext) -> list[dict]:
        task = ctx.task_spec()
        if task.gold_dir is None:
            raise AgentStop(f"task {task.id} has no gold solution", EndReason.AGENT_ERROR)
        return gold_actions(task.gold_dir)
