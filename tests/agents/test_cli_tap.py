"""The CLI tap: agent CLIs run inside a Docker sandbox (network off) and reach the proxy
only through the sandbox's proxy route. Everything is real: sandbox, env, proxy, grading,
and the Claude Code CLI itself (the host's installed package, bind-mounted read-only).
The model is our ScriptedEngine so that the CLI is made to call a tool deterministically
(the random tiny model would never produce one)."""

from __future__ import annotations

import dataclasses

import pytest
from gyre_env.agents.cli_tap import (
    CLAUDE_MOUNT,
    ClaudeCodeAgent,
    CliAgent,
    CliAgentConfig,
    claude_code_image,
    host_claude_code_dir,
)
from gyre_env.agents.codex_cli import (
    CODEX_INSTALL,
    CODEX_MOUNT,
    CodexAgent,
    codex_image,
    host_codex_dir,
)

from gyre_env.proxy.records import read_jsonl
from gyre_env.runner import EpisodeSpec, Runner, RunnerConfig, StoreResultSink
from gyre_env.tasks import get_task
from gyre_env.trajectory.store import TrajectoryStore

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


def _run(agent, service, kwargs, session, sink=None, **runner_kw):
    runner = Runner(
        agent,
        RunnerConfig(parallel=1, **runner_kw),
        endpoint_factory=service.endpoint,
        sink=sink,
    )
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


@pytest.mark.slow
def test_claude_code_in_docker_sandbox(scripted_service, tmp_path, tool_call_text, host_cli):
    """Claude Code (headless, as root with IS_SANDBOX=1) runs in the sandbox against the
    proxy: it receives a Bash tool call, runs it in the sandbox, sends the result back and
    finishes; both calls are TITO records of the episode's session (Anthropic API)."""
    host_cli(host_claude_code_dir, "Claude Code CLI")

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


@pytest.mark.slow
def test_codex_exec_in_docker_sandbox(scripted_service, tmp_path, tool_call_text, host_cli):
    """``codex exec`` (the real CLI, Responses API, streamed) runs in the sandbox against
    the proxy: it receives an ``exec_command`` call, runs it in the sandbox, sends the
    output back and finishes; its calls are records of the episode's session in the
    trajectory store, the second prompt extending the first's exact ids, and the episode's
    outcome is stored beside them."""
    host_cli(host_codex_dir, "Codex CLI")

    def policy(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "Done."
        return tool_call_text("exec_command", {"cmd": "echo gyre-was-$((40+2))"})

    store = TrajectoryStore(tmp_path / "store.db")
    service = scripted_service(policy, sinks=[store])
    image = codex_image(get_task(TASK).image)
    agent = CodexAgent(binary=f"{CODEX_MOUNT}/bin/codex")
    sink = StoreResultSink(store, run="codex")
    result = _run(agent, service, _env_kwargs(service, image), "codex-1", sink, time_limit_s=240)
    extra = result.agent_extra
    assert result.end_reason == "cli_exited" and extra["exit_code"] == 0, result
    assert extra["last_message"].strip() == "Done."
    ran = [e["item"] for e in extra["events"] if e.get("type") == "item.completed"]
    assert any("gyre-was-42" in (i.get("aggregated_output") or "") for i in ran), ran
    records = list(store.records(["codex-1"]))
    assert len(records) == result.model_calls == 2
    assert all(r.prompt_ids and len(r.output_logprobs) == len(r.output_ids) for r in records)
    assert [r.api for r in read_jsonl(tmp_path / "records.jsonl")] == ["responses"] * 2
    [episode] = store.episodes(run="codex")
    assert episode.session == "codex-1" and episode.outcome == "failure"
    first, second = records
    assert second.parent == first.call_index and second.prefix_len == len(
        first.prompt_ids + first.output_ids
    )
    assert second.prompt_ids[: second.prefix_len] == first.prompt_ids + first.output_ids
    from gyre_env.engines.tiny import load_tokenizer

    assert "gyre-was-42" in load_tokenizer().decode(second.prompt_ids[second.prefix_len :])
    assert result.outcome == "failure" and result.reward_valid  # graded, nothing built


@pytest.mark.slow
def test_codex_missing_from_the_image_names_its_install(scripted_service):
    """An image without the codex binary ends the episode as an agent error whose message
    says how to install it; the host-side lookup says the same when npm has no Codex."""
    service = scripted_service(lambda prompt: "ok")
    agent = CodexAgent(binary="/nowhere/codex")
    result = _run(agent, service, _env_kwargs(service), "codex-2", time_limit_s=60)
    assert result.end_reason == "agent_error", result
    assert CODEX_INSTALL in result.message and "codex_image" in result.message
