"""The CLI tap: agent CLIs run inside a Docker sandbox (network off) and reach the proxy
only through the sandbox's proxy route. Everything is real: sandbox, env, proxy, grading,
and the Claude Code CLI itself (the host's installed package, bind-mounted read-only).
The model is our ScriptedEngine so that the CLI is made to call a tool deterministically
(the random tiny model would never produce one)."""

from __future__ import annotations

import dataclasses
import os

import pytest
from gyre_env.agents.cli_tap import (
    CLAUDE_MOUNT,
    ClaudeCodeAgent,
    CliAgent,
    CliAgentConfig,
    claude_code_image,
    host_claude_code_dir,
)

from gyre_env.proxy.records import read_jsonl
from gyre_env.runner import EpisodeSpec, Runner, RunnerConfig
from gyre_env.tasks import get_task

pytestmark = pytest.mark.docker
ENV = "Gyre/NL2Repo-v0"
TASK = "micro-lru-cache"


def _env_kwargs(service, image: str | None = None) -> dict:
    kwargs = {
        "sandbox_backend": "docker",
        "sandbox": {"proxy_socket": service.route_socket, "proxy_port": 8765},
    }
    if image is not None:
        kwargs["tasks"] = [dataclasses.replace(get_task(TASK), image=image)]
    return kwargs


def _run(agent, service, kwargs, session, **runner_kw):
    runner = Runner(agent, RunnerConfig(parallel=1, **runner_kw), endpoint_factory=service.endpoint)
    spec = EpisodeSpec(
        episode_id=session, env_id=ENV, env_kwargs=kwargs, reset_options={"task_id": TASK}
    )
    [result] = runner.run([spec])
    return result


# Two chat calls from inside the sandbox with the stdlib, a file written between them.
CLIENT = r"""python3 - <<'EOF'
import json, os, urllib.request
def chat(text):
    body = json.dumps({"model": os.environ["GYRE_MODEL"], "max_tokens": 8,
                       "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body,
                                 {"content-type": "application/json",
                                  "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    return json.load(urllib.request.urlopen(req, timeout=60))
chat("first")
open("lru.py", "w").write(open(os.environ["GYRE_GOLD"]).read())
chat("second")
EOF"""


def test_command_agent_reaches_proxy_and_gets_interim_rewards(scripted_service, tmp_path):
    """A command agent calls the model twice through the route; each call is recorded in
    its session, each finished call is a model-turn boundary with an interim reward, and
    the work it wrote (the gold file) is graded when it exits."""
    service = scripted_service(lambda prompt: "ok")
    gold = (get_task(TASK).gold_dir / "lru.py").read_text()
    command = f"cat > /tmp/gold.py <<'GOLD'\n{gold}\nGOLD\nGYRE_GOLD=/tmp/gold.py {CLIENT}"
    agent = CliAgent(CliAgentConfig(command=command))
    result = _run(agent, service, _env_kwargs(service), "cli-1")
    assert result.end_reason == "cli_exited" and result.agent_extra["exit_code"] == 0, result
    assert result.outcome == "success" and result.score == 1.0
    records = [r for r in read_jsonl(tmp_path / "records.jsonl") if r.session == "cli-1"]
    assert len(records) == result.model_calls == 2
    turns = [s for s in result.trace if s["tool"] == "model-turn"]
    assert len(turns) >= 1 and result.trace[-1]["tool"] == "submit"
    assert result.total_reward == pytest.approx(1.0)  # interim + final still sum to the score
    assert result.times["model"] > 0


def test_command_agent_is_stopped_at_the_time_limit(scripted_service):
    """A CLI that hangs is killed at the episode's time limit and the workspace graded."""
    service = scripted_service(lambda prompt: "ok")
    agent = CliAgent(CliAgentConfig(command="sleep 600", stop_grace_s=1))
    result = _run(agent, service, _env_kwargs(service), "cli-2", time_limit_s=3)
    assert result.end_reason == "time_limit", result
    assert result.outcome == "failure" and result.reward_valid and result.score == 0.0
    assert result.times["wall"] < 60


def test_claude_code_in_docker_sandbox(scripted_service, tmp_path, tool_call_text):
    """Claude Code (headless, as root with IS_SANDBOX=1) runs in the sandbox against the
    proxy: it receives a Bash tool call, runs it in the sandbox, sends the result back and
    finishes; both calls are TITO records of the episode's session (Anthropic API)."""
    try:
        host_claude_code_dir()
    except FileNotFoundError as e:
        if os.environ.get("CI"):  # CI installs it with npm: missing there is a failure
            pytest.fail(f"CI must install the Claude Code CLI: {e}")
        pytest.skip(str(e))

    def policy(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "Done."
        if "# Tools" not in prompt:  # side requests without tools (titles, topics)
            return "Title"
        return tool_call_text(
            "Bash", {"command": "echo gyre-was-$((40+2))", "description": "say hello"}
        )

    service = scripted_service(policy)
    image = claude_code_image(get_task(TASK).image)
    agent = ClaudeCodeAgent(
        binary=f"{CLAUDE_MOUNT}/bin/claude.exe", max_turns=4, max_output_tokens=300
    )
    result = _run(agent, service, _env_kwargs(service, image), "cc-1", time_limit_s=240)
    assert result.end_reason == "cli_exited" and result.agent_extra["exit_code"] == 0, result
    assert result.agent_extra["result"]["is_error"] is False
    records = [r for r in read_jsonl(tmp_path / "records.jsonl") if r.session == "cc-1"]
    assert len(records) == result.model_calls >= 2
    assert all(r.api == "anthropic" and r.prompt_ids for r in records)
    assert {r.sampling["max_new_tokens"] for r in records if r.role == "main"} == {300}
    from gyre_env.engines.tiny import load_tokenizer

    later = load_tokenizer().decode(records[-1].prompt_ids)
    assert "gyre-was-42" in later  # the tool really ran in the sandbox
    assert result.outcome == "failure" and result.reward_valid  # graded, nothing built
