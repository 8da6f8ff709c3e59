"""mini-swe-agent end to end: its own ``DefaultAgent`` loop and ``LitellmModel``, the real
env (Docker sandbox, hidden-test grading), the real proxy (TITO records) and runner. The
model is our ScriptedEngine (deterministic tool calls) or the random tiny model."""

from __future__ import annotations

import base64
import sys

import pytest
from gyre_env.agents import MiniSweAgent, MiniSweAgentConfig
from gyre_env.agents.mini_swe_agent import SUBMIT_MARKER, split_exit_code

from gyre_env.proxy.records import read_jsonl
from gyre_env.proxy.serving import ModelService, ModelServiceConfig
from gyre_env.runner import EpisodeSpec, Runner, RunnerConfig
from gyre_env.tasks import get_task

ENV = "Gyre/NL2Repo-v0"


def test_split_exit_code():
    assert split_exit_code("hi\n[exit code 0]") == ("hi\n", 0)
    assert split_exit_code("boom\n[exit code 2]\n") == ("boom\n", 2)
    assert split_exit_code("[exit code -9]") == ("", -9)
    assert split_exit_code("error: no such tool") == ("error: no such tool", -1)


def test_bad_config_is_named(tmp_path):
    with pytest.raises(ValueError, match="max_steps"):
        MiniSweAgentConfig(max_steps=0)
    with pytest.raises(ValueError, match="config_file"):
        MiniSweAgentConfig(config_file=str(tmp_path / "nope.yaml"))


def test_missing_package_names_its_install_command(monkeypatch):
    from gyre_env._optional import MissingExtraError

    monkeypatch.setitem(sys.modules, "minisweagent.agents.default", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'gyre-env\[mini-swe-agent\]'"):
        MiniSweAgent()


def test_gyre_bench_names_the_install_when_it_is_missing(monkeypatch, capsys, tmp_path):
    from gyre_env.bench import cli as bench_cli

    monkeypatch.setitem(sys.modules, "minisweagent.agents.default", None)
    rc = bench_cli.main(["--agent", "mini-swe-agent", "--out", str(tmp_path), "--no-progress"])
    assert rc == 2
    assert "pip install 'gyre-env[mini-swe-agent]'" in capsys.readouterr().err


def test_user_config_file_templates(tmp_path):
    """A mini-swe-agent YAML's agent and model templates are used; its model name and
    environment are not (the proxy and the sandbox are the episode's)."""
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(
        "agent:\n  system_template: SYS\n  instance_template: 'DO {{task}}'\n  mode: confirm\n"
        "model:\n  model_name: anthropic/x\n  observation_template: 'OUT {{output.output}}'\n"
        "environment:\n  cwd: /elsewhere\n"
    )
    agent = MiniSweAgent(MiniSweAgentConfig(config_file=str(cfg), max_steps=7))
    assert agent.agent_settings["system_template"] == "SYS"
    assert agent.agent_settings["step_limit"] == 7 and "mode" not in agent.agent_settings
    assert agent.model_settings == {"observation_template": "OUT {{output.output}}"}


def test_its_own_mini_yaml_renders_over_the_sandbox():
    """mini-swe-agent's packaged ``mini.yaml`` (what its users run) works as
    ``config_file``: its templates render with the sandbox environment's variables."""
    import minisweagent
    from gyre_env.agents.mini_swe_agent import SandboxEnvironment
    from jinja2 import StrictUndefined, Template
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel

    path = minisweagent.package_dir / "config" / "mini.yaml"
    agent = MiniSweAgent(MiniSweAgentConfig(config_file=str(path)))
    model = LitellmModel(model_name="openai/tiny", **agent.model_settings)
    loop = DefaultAgent(model, SandboxEnvironment(ctx=None), **agent.agent_settings)
    variables = loop.get_template_vars(task="Build lru.py.")
    text = Template(loop.config.instance_template, undefined=StrictUndefined).render(**variables)
    assert "Build lru.py." in text and SUBMIT_MARKER in text and "Linux" in text


def _policy(gold: str, tool_call_text):
    """Write the gold file with one bash command, then finish mini-swe-agent's way."""
    blob = base64.b64encode(gold.encode()).decode()

    def reply(prompt: str) -> str:
        if "<tool_response>" not in prompt:
            return "I write the module.\n" + tool_call_text(
                "bash", {"command": f"echo {blob} | base64 -d > lru.py && wc -c lru.py"}
            )
        return tool_call_text("bash", {"command": f"echo {SUBMIT_MARKER}"})

    return reply


@pytest.mark.slow
@pytest.mark.docker
def test_scripted_episode_solves_and_submits(tmp_path, scripted_service, tool_call_text):
    """A scripted policy: mini-swe-agent writes the gold file with `bash`, then echoes its
    submit marker; the env grades it 1.0 and the proxy recorded both calls as one branch,
    the second extending the first's exact ids."""
    task = get_task("micro-lru-cache")
    service = scripted_service(_policy((task.gold_dir / "lru.py").read_text(), tool_call_text))
    runner = Runner(
        MiniSweAgent(MiniSweAgentConfig(max_steps=5)),
        RunnerConfig(parallel=1),
        endpoint_factory=service.endpoint,
    )
    [result] = runner.run(
        [EpisodeSpec(episode_id="msa-script", env_id=ENV, reset_options={"task_id": task.id})]
    )
    assert result.end_reason == "submitted", result
    assert result.outcome == "success" and result.score == 1.0
    assert [s["tool"] for s in result.trace] == ["bash", "bash", "submit"]
    records = [r for r in read_jsonl(tmp_path / "records.jsonl") if r.session == "msa-script"]
    assert result.model_calls == len(records) == 2
    assert {r.role for r in records} == {"main"} and len({r.branch for r in records}) == 1
    first, second = records
    assert second.parent == first.call_index and second.prefix_len == len(first.prompt_ids) + len(
        first.output_ids
    )
    assert result.times["model"] > 0 and result.times["tool"] > 0


@pytest.mark.docker
def test_tiny_model_episode_ends_typed(tmp_path):
    """The random tiny model calls no tool: mini-swe-agent ends on its format-error limit
    (``no_tool_call``), the env still grades the episode, and every call is a record."""
    service = ModelService(ModelServiceConfig(records_path=str(tmp_path / "rec.jsonl"))).start()
    try:
        agent = MiniSweAgent(
            MiniSweAgentConfig(max_new_tokens=16, max_steps=4, max_format_errors=2)
        )
        runner = Runner(agent, RunnerConfig(parallel=1), endpoint_factory=service.endpoint)
        [result] = runner.run(
            [
                EpisodeSpec(
                    episode_id="msa-tiny", env_id=ENV, reset_options={"task_id": "micro-rational"}
                )
            ]
        )
    finally:
        service.stop()
    assert result.end_reason in ("no_tool_call", "step_budget", "submitted"), result
    assert result.reward_valid and result.score is not None
    records = [r for r in read_jsonl(tmp_path / "rec.jsonl") if r.session == "msa-tiny"]
    assert len(records) == result.model_calls >= 1
    assert all(len(r.output_ids) == len(r.output_logprobs) for r in records)


@pytest.mark.docker
def test_dead_endpoint_is_an_infra_error_quickly():
    """Nobody answers the model endpoint: ``model_error`` after the client's own retries
    (not mini-swe-agent's minutes of back-off), so the runner reports ``infra_error``."""
    import time

    from gyre_env.proxy.endpoint import ModelEndpoint

    def endpoint(session):  # port 9 (discard): nothing listens there
        return ModelEndpoint(base_url="http://127.0.0.1:9/v1", session=session)

    agent = MiniSweAgent(MiniSweAgentConfig(model_retries=0, request_timeout_s=5))
    runner = Runner(agent, RunnerConfig(max_retries=0), endpoint_factory=endpoint)
    t0 = time.monotonic()
    [result] = runner.run(
        [
            EpisodeSpec(
                episode_id="msa-dead", env_id=ENV, reset_options={"task_id": "micro-rational"}
            )
        ]
    )
    assert result.outcome == "infra_error" and result.score is None, result
    assert result.end_reason == "model_error"
    assert time.monotonic() - t0 < 60


@pytest.mark.docker
def test_gyre_bench_agent_mini_swe_agent(tmp_path):
    """``gyre bench --agent mini-swe-agent`` plays a task with the embedded tiny model
    and writes its results and TITO records (the tiny model scores 0; it must not be an
    infra error)."""
    import json

    from gyre_env.bench import cli as bench_cli

    out = tmp_path / "bench"
    rc = bench_cli.main(
        ["--agent", "mini-swe-agent", "--tasks", "micro-rational", "--max-steps", "2",
         "--max-new-tokens", "16", "--out", str(out), "--no-progress"]
    )  # fmt: skip
    assert rc == 0
    [episode] = json.loads((out / "results.json").read_text())["results"]
    assert episode["outcome"] != "infra_error" and episode["score"] is not None
    assert episode["model_calls"] >= 1
    records = (out / "records.jsonl").read_text().splitlines()
    assert len(records) == episode["model_calls"]
