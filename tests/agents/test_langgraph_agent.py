"""The LangGraph agent end to end: real env (Docker sandbox, hidden-test grading), real
proxy (TITO records), real runner. The model is the random tiny model (it produces no
tool calls: the agent must end cleanly) or our ScriptedEngine, which makes the model call
tools deterministically so the sub-agent and compaction paths run."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from gyre_env.agents import LangGraphAgent, LangGraphAgentConfig
from gyre_env.agents.langgraph_agent import COMPACTION_PROMPT, SUBAGENT_PROMPT

from gyre_env.proxy.records import read_jsonl
from gyre_env.proxy.serving import ModelService, ModelServiceConfig
from gyre_env.runner import EpisodeSpec, Runner, RunnerConfig
from gyre_env.tasks import get_task

pytestmark = pytest.mark.docker
ENV = "Gyre/NL2Repo-v0"


@pytest.mark.slow
def test_tiny_model_episodes_complete(tmp_path):
    """Two episodes with the random tiny model at once: each ends with a typed reason,
    is graded (valid reward, not an infra error), and its calls land as TITO records."""
    service = ModelService(ModelServiceConfig(records_path=str(tmp_path / "rec.jsonl"))).start()
    try:
        agent = LangGraphAgent(LangGraphAgentConfig(max_new_tokens=24, max_steps=3, nudges=1))
        runner = Runner(agent, RunnerConfig(parallel=2), endpoint_factory=service.endpoint)
        specs = [
            EpisodeSpec(episode_id=f"lg-{t}", env_id=ENV, reset_options={"task_id": t})
            for t in ("micro-lru-cache", "micro-roman-numerals")
        ]
        results = runner.run(specs)
    finally:
        service.stop()
    records = read_jsonl(tmp_path / "rec.jsonl")
    for r in results:
        assert r.outcome in ("failure", "success", "agent_error"), r
        assert r.reward_valid and r.score is not None
        assert r.end_reason in ("no_tool_call", "step_budget", "submitted", "env_ended")
        assert r.model_calls >= 1 and r.times["model"] > 0
        mine = [rec for rec in records if rec.session == r.episode_id]
        assert len(mine) == r.model_calls
        assert all(
            rec.prompt_ids and len(rec.output_ids) == len(rec.output_logprobs) for rec in mine
        )
    assert runner.waterlevel.snapshot()["running"] == 0


def _scripted_policy(gold: str, tool_call_text):
    """Main agent: sub-agent first, then write the gold file, then submit; the state
    survives compaction through markers the scripted summary carries."""

    def reply(prompt: str) -> str:
        last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
        if COMPACTION_PROMPT.splitlines()[0] in last_user:
            marks = ["SUB_DONE"] if ("sub-agent ended" in prompt or "SUB_DONE" in prompt) else []
            if "bytes to lru.py" in prompt or "WROTE_LRU" in prompt:
                marks.append("WROTE_LRU")
            return f"<summary>{' '.join(marks)}</summary>"
        if SUBAGENT_PROMPT[:30] in prompt:
            if "<tool_response>" in prompt:
                return "REPORT: the workspace holds SPEC.md."
            return tool_call_text("list_dir", {"path": "."})
        if "WROTE_LRU" in prompt or "bytes to lru.py" in prompt:
            return tool_call_text("submit", {})
        if "SUB_DONE" in prompt or "sub-agent ended" in prompt:
            return tool_call_text("write_file", {"path": "lru.py", "content": gold})
        return tool_call_text("subagent", {"task": "Look around the workspace."})

    return reply


def test_tools_subagent_and_compaction_branches(tmp_path, scripted_service, tool_call_text):
    """A scripted policy drives the graph through a sub-agent, two compactions and a
    submit of the gold solution: score 1.0, and the proxy's records label the branches
    main / sub-agent / summary, the summaries extending the main context."""
    task = get_task("micro-lru-cache")
    gold = (task.gold_dir / "lru.py").read_text()
    service = scripted_service(_scripted_policy(gold, tool_call_text))

    def endpoint(session):  # a small window, so every main turn is compacted afterwards
        return dataclasses.replace(service.endpoint(session), context_length=1000)

    agent = LangGraphAgent(LangGraphAgentConfig(max_steps=10))
    runner = Runner(agent, RunnerConfig(parallel=1), endpoint_factory=endpoint)
    [result] = runner.run(
        [EpisodeSpec(episode_id="lg-script", env_id=ENV, reset_options={"task_id": task.id})]
    )
    assert result.end_reason == "submitted", result
    assert result.outcome == "success" and result.score == 1.0
    assert result.total_reward == pytest.approx(1.0)  # potential mode: return == score
    records = [r for r in read_jsonl(tmp_path / "records.jsonl") if r.session == "lg-script"]
    roles = Counter(r.role for r in records)
    assert roles == {"main": 3, "sub-agent": 2, "summary": 2}, (roles, tmp_path)
    assert result.model_calls == len(records) == 7
    assert all(r.parent is not None for r in records if r.role == "summary")
    assert [s["tool"] for s in result.trace] == ["list_dir", "write_file", "submit"]


def test_dead_model_endpoint_is_an_infra_error_not_a_zero():
    """A model endpoint nobody answers: the agent ends with ``model_error``, the runner
    retries the episode, and the result is ``infra_error`` with no score."""
    from gyre_env.proxy.endpoint import ModelEndpoint

    def endpoint(session):  # port 9 (discard): nothing listens there
        return ModelEndpoint(base_url="http://127.0.0.1:9/v1", session=session)

    agent = LangGraphAgent(LangGraphAgentConfig(model_retries=0, request_timeout_s=5))
    runner = Runner(agent, RunnerConfig(max_retries=1), endpoint_factory=endpoint)
    [result] = runner.run(
        [
            EpisodeSpec(
                episode_id="dead-model", env_id=ENV, reset_options={"task_id": "micro-rational"}
            )
        ]
    )
    assert result.outcome == "infra_error" and result.score is None, result
    assert result.attempts == 2 and result.retried_sessions == ["dead-model"]
    assert result.session == "dead-model.r1"
    assert result.end_reason == "model_error" and "model endpoint failed" in result.message
