"""Agents (installed as ``gyre_env.agents``): they play episodes of a Gyre env.

- ``ScriptedAgent`` / ``GoldAgent`` (``scripted``): replay tool calls; a task's gold solution.
- ``LangGraphAgent`` (``langgraph_agent``): a LangGraph coding agent calling the policy
  through the episode's proxy session.
- ``CliAgent`` / ``ClaudeCodeAgent`` (``cli_tap``), ``CodexAgent`` (``codex_cli``): an
  existing agent CLI run inside the episode's sandbox with its base URL pointed at the proxy.
- ``MiniSweAgent`` (``mini_swe_agent``): mini-swe-agent's own loop, its model at the
  episode's proxy session and its environment the episode's sandbox (the ``bash`` tool).

Every agent has ``name`` and ``run(ctx) -> AgentResult`` (``base.Agent``). Names are
imported lazily so that importing this package pulls in no LangGraph or mini-swe-agent.
"""

from __future__ import annotations

import importlib

from gyre_env.agents.base import (
    Agent,
    AgentResult,
    AgentStop,
    EndReason,
    EpisodeClock,
)

from gyre_env.proxy.endpoint import ModelEndpoint

_LAZY = {
    "EpisodeContext": "gyre_env.agents.context",
    "ScriptedAgent": "gyre_env.agents.scripted",
    "GoldAgent": "gyre_env.agents.scripted",
    "gold_actions": "gyre_env.agents.scripted",
    "LangGraphAgent": "gyre_env.agents.langgraph_agent",
    "LangGraphAgentConfig": "gyre_env.agents.langgraph_agent",
    "CliAgent": "gyre_env.agents.cli_tap",
    "ClaudeCodeAgent": "gyre_env.agents.cli_tap",
    "CliAgentConfig": "gyre_env.agents.cli_tap",
    "CodexAgent": "gyre_env.agents.codex_cli",
    "MiniSweAgent": "gyre_env.agents.mini_swe_agent",
    "MiniSweAgentConfig": "gyre_env.agents.mini_swe_agent",
}

__all__ = [
    "Agent",
    "AgentResult",
    "AgentStop",
    "EndReason",
    "EpisodeClock",
    "ModelEndpoint",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gyre_env.agents' has no attribute {name!r}")
