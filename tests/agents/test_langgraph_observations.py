"""The LangGraph agent puts the env's observation in the conversation as it is: the env
cut it once, to its own limit, with a marker the model reads; the agent never cuts again."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_core")


def test_tool_observations_reach_the_model_uncut():
    from gyre_env.agents.langgraph_agent import LangGraphAgentConfig, _EpisodeGraph
    from langchain_core.messages import AIMessage

    observation = "y\n" * 60_000  # longer than any limit the agent once had

    class Ctx:
        done = False

        def step(self, action):
            return observation, 0.0, False, False, {}

    graph = object.__new__(_EpisodeGraph)  # only the tools node: no model, no proxy
    graph.cfg, graph.ctx, graph.role = LangGraphAgentConfig(), Ctx(), "main"
    call = {"id": "call-1", "name": "bash", "args": {"command": "yes"}, "type": "tool_call"}
    state = graph.tools_node({"messages": [AIMessage(content="", tool_calls=[call])]})
    assert state["messages"][-1].content == observation
    assert "max_observation_chars" not in {f for f in LangGraphAgentConfig.__dataclass_fields__}
