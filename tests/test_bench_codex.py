"""``gyre bench --agent codex``: the flag builds the Codex CLI agent on tasks whose image
mounts the host's Codex; without Codex on the host the bench stops before any work with
the install command. (The full ``codex exec`` episode through the proxy and the store is
``tests/agents/test_cli_tap.py::test_codex_exec_in_docker_sandbox``.)"""

from __future__ import annotations

import json
import types

import pytest
from gyre_env.agents import codex_cli

from gyre_env.bench import BenchConfig
from gyre_env.bench import cli as bench_cli
from gyre_env.bench.run import episode_env_kwargs, make_agent
from gyre_env.tasks import get_task


@pytest.mark.docker
def test_agent_codex_runs_the_cli_from_a_mounting_image(host_cli):
    host_cli(codex_cli.host_codex_dir, "Codex CLI")
    cfg = BenchConfig(agent="codex", tasks="micro-lru-cache")
    agent = make_agent(cfg)
    assert isinstance(agent, codex_cli.CodexAgent) and agent.api == "openai"
    assert agent.binary == f"{codex_cli.CODEX_MOUNT}/bin/codex"
    service = types.SimpleNamespace(
        route_socket="/run/x.sock", config=types.SimpleNamespace(sandbox_port=8765)
    )
    task = get_task("micro-lru-cache")
    kwargs = episode_env_kwargs(cfg, agent, service, [task])
    [mounted] = kwargs["tasks"]
    assert mounted.image.endswith("-codex:latest") and mounted.image != task.image
    from gyre_env.sandbox.docker import MOUNTS_LABEL, docker_client

    labels = docker_client().images.get(mounted.image).labels
    mounts = json.loads(labels[MOUNTS_LABEL])
    assert [codex_cli.host_codex_dir(), codex_cli.CODEX_MOUNT] in mounts


def test_missing_codex_names_its_install_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(codex_cli, "npm_global_root", lambda: str(tmp_path))
    argv = ["--agent", "codex", "--tasks", "micro-lru-cache", "--out", str(tmp_path / "o")]
    assert bench_cli.main([*argv, "--no-progress"]) == 2
    printed = capsys.readouterr().out
    assert codex_cli.CODEX_INSTALL in printed and "Codex CLI is not installed" in printed
    assert not (tmp_path / "o" / "results.json").exists()


def test_codex_refuses_a_passthrough_upstream(tmp_path):
    cfg = BenchConfig(agent="codex", base_url="https://api.example.com/v1")
    with pytest.raises(ValueError, match="Responses API"):
        make_agent(cfg)


def test_ci_installs_the_pinned_codex():
    """CI installs the Codex release the agent names in its install hint."""
    from pathlib import Path

    setup = (Path(__file__).resolve().parents[1] / ".ci" / "setup").read_text()
    assert f"codex_version={codex_cli.CODEX_VERSION}\n" in setup
