"""Agents see two things: a ``ModelEndpoint`` and the env's agent API. The model is hosted
on the proxy side (``gyre_env.proxy.serving``), which imports no agent, and an env that has nothing but that API (``task_spec``, ``sandbox_handle``,
``interim_reward``, ``step``) plays the gold and the CLI agent through the runner, while
it records every attribute anything outside this file reads on it."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
import urllib.request
from pathlib import Path

import gymnasium as gym
import pytest
from gyre_env.agents import GoldAgent, ModelEndpoint
from gyre_env.agents.cli_tap import CliAgent, CliAgentConfig

from gyre_env.runner import EpisodeSpec, Runner, RunnerConfig
from gyre_env.tasks import get_task

ENV = "GyreTest/ApiOnly-v0"
API = {"reset", "step", "close", "task_spec", "sandbox_handle", "interim_reward"}
"""The env's agent API (plus Gymnasium's own plumbing, which is not checked)."""
INTERNALS = {"_state", "task", "sandbox", "scorer", "rewards", "last_grading"}
"""What no code outside the env may read: its state, and the names agents once reached."""


class ApiOnlyEnv(gym.Env):
    """A Gymnasium env with only the agent API; all its state is in ``_state``. It records
    the names read on it by code outside this file (agents, runner, Gymnasium)."""

    metadata = {"render_modes": []}
    observation_space = gym.spaces.Text(100_000)
    action_space = gym.spaces.Text(100_000)

    def __init__(self, task, expected: dict, seen: set, local_sandbox: bool = False):
        self._state = {"task": task, "expected": expected, "seen": seen, "files": {}}
        self._state.update(local=local_sandbox, sandbox=None, turns=0)

    def __getattribute__(self, name):
        if sys._getframe(1).f_code.co_filename != __file__:
            object.__getattribute__(self, "_state")["seen"].add(name)
        return object.__getattribute__(self, name)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        st = self._state
        if st["local"]:
            from gyre_env.sandbox.local import LocalSandbox

            st["sandbox"] = LocalSandbox()
        info = {"task_id": st["task"].id, "tools": [{"name": "write_file"}, {"name": "submit"}]}
        return "write the files", info

    def step(self, action):
        st, name = self._state, action["name"]
        args = action.get("arguments") or {}
        if name == "write_file":
            st["files"][args["path"]] = args["content"]
            return "ok", 0.0, False, False, {"outcome": None}
        box = st["sandbox"]
        got = {p: box.read_file(p).decode() if box else st["files"].get(p) for p in st["expected"]}
        score = float(got == st["expected"])
        info = {"outcome": "success" if score else "failure", "reward_valid": True}
        info["reward"] = {"final_score": score}
        return "graded", score, True, False, info

    def task_spec(self):
        return self._state["task"]

    def sandbox_handle(self):
        return self._state["sandbox"]

    def interim_reward(self):
        self._state["turns"] += 1
        return 0.1, {"reward": {"value": 0.1, "potential": {"phi": 0.1 * self._state["turns"]}}}

    def close(self):
        if self._state["sandbox"] is not None:
            self._state["sandbox"].close()


if ENV not in gym.registry:
    gym.register(id=ENV, entry_point=ApiOnlyEnv, disable_env_checker=True)


def _task(tmp_path: Path, gold: dict):
    """A task no suite has (so only the env's ``task_spec`` can give it), with ``gold``."""
    (tmp_path / "gold").mkdir()
    for path, text in gold.items():
        (tmp_path / "gold" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "gold" / path).write_text(text)
    return dataclasses.replace(
        get_task("micro-lru-cache"), id="api-only", gold_dir=tmp_path / "gold"
    )


def _run(agent, kwargs, **runner_kw):
    runner = Runner(agent, RunnerConfig(parallel=1, time_limit_s=60, max_retries=1), **runner_kw)
    [result] = runner.run([EpisodeSpec(episode_id="ep", env_id=ENV, env_kwargs=kwargs)])
    return result


def test_agents_build_no_model_and_the_proxy_imports_no_agent():
    import gyre_env.agents as agents

    import gyre_env.proxy as proxy

    assert agents.ModelEndpoint is proxy.ModelEndpoint  # the proxy's, re-exported
    for path in Path(agents.__file__).parent.glob("*.py"):  # no agent builds an engine or a proxy
        text = path.read_text()
        assert "gyre_env.engines" not in text and "ProxyServer" not in text, path.name
    for path in Path(proxy.__file__).parent.glob("*.py"):  # the proxy serves any agent
        assert not re.search(r"^\s*(from|import) gyre_env\.agents", path.read_text(), re.M), path


def test_endpoints_carry_their_api(scripted_service):
    with pytest.raises(ValueError, match="api"):
        ModelEndpoint(base_url="http://x/v1", api="gemini")
    service = scripted_service(lambda prompt: "hello")
    openai = service.endpoint("s1")
    assert (openai.api, openai.session) == ("openai", "s1") and openai.base_url.endswith("/s/s1/v1")
    anthropic = service.endpoint("s1", "tiny", api="anthropic")
    assert anthropic.base_url.endswith("/s/s1") and service.serves("anthropic")
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    req = urllib.request.Request(
        anthropic.base_url + "/v1/messages",
        json.dumps(body).encode(),
        {"content-type": "application/json", "x-api-key": anthropic.api_key},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert json.load(resp)["content"][0]["text"] == "hello"


def test_a_passthrough_serves_only_its_upstreams_api():
    from gyre_env.proxy.serving import ModelService, ModelServiceConfig

    cfg = ModelServiceConfig(upstream_base_url="http://127.0.0.1:9", upstream_api="anthropic")
    with ModelService(cfg) as service:
        assert service.api == "anthropic" and not service.serves("openai")
        assert service.endpoint("s").api == "anthropic"
        with pytest.raises(ValueError, match="anthropic upstream"):
            service.endpoint("s", api="openai")


def test_langgraph_agent_refuses_an_endpoint_of_another_api():
    pytest.importorskip("langgraph")
    from gyre_env.agents import LangGraphAgent
    from gyre_env.agents.base import EpisodeClock
    from gyre_env.agents.context import EpisodeContext

    ep = ModelEndpoint(base_url="http://127.0.0.1:9/s/x", api="anthropic")
    ctx = EpisodeContext(episode_id="x", env=None, observation="", info={}, clock=EpisodeClock())
    ctx.endpoint = ep
    with pytest.raises(ValueError, match="OpenAI API"):
        LangGraphAgent().run(ctx)


def test_gold_agent_gets_its_task_from_the_env_api(tmp_path):
    gold = {"calc.py": "def add(a, b):\n    return a + b\n", "pkg/__init__.py": ""}
    seen: set = set()
    kwargs = {"task": _task(tmp_path, gold), "expected": gold, "seen": seen}
    result = _run(GoldAgent(), kwargs)
    assert (result.outcome, result.score, result.task_id) == ("success", 1.0, "api-only")
    assert "task_spec" in seen and not seen & INTERNALS, sorted(seen)


def test_cli_agent_works_through_the_env_api_and_its_endpoint(tmp_path, scripted_service):
    """The CLI (on the host: a LocalSandbox) calls its endpoint twice, writing a file in
    between; the sandbox and its interim rewards come from the env's API only."""
    service = scripted_service(lambda prompt: "ok")
    client = f"""{shlex.quote(sys.executable)} - <<'EOF'
import json, os, urllib.request
def chat(text):
    body = json.dumps({{"model": os.environ["GYRE_MODEL"], "max_tokens": 8,
                       "messages": [{{"role": "user", "content": text}}]}}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body,
                                 {{"content-type": "application/json",
                                  "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}})
    return json.load(urllib.request.urlopen(req, timeout=60))
chat("first")
open("answer.txt", "w").write(os.environ["GYRE_API"] + "\\n")
chat("second")
EOF"""
    agent = CliAgent(CliAgentConfig(command=client, poll_s=0.05, state_dir=str(tmp_path / "cli")))

    def endpoint(session: str) -> ModelEndpoint:  # the CLI runs on the host: no route
        ep = service.endpoint(session)
        return dataclasses.replace(ep, sandbox_base_url=f"{service.proxy.base_url}/s/{session}")

    seen: set = set()
    kwargs = {"task": _task(tmp_path, {}), "expected": {"answer.txt": "openai\n"}, "seen": seen}
    result = _run(agent, {**kwargs, "local_sandbox": True}, endpoint_factory=endpoint)
    assert (result.end_reason, result.outcome, result.score) == ("cli_exited", "success", 1.0)
    assert result.model_calls == 2
    assert any(step["tool"] == "model-turn" for step in result.trace)
    assert {"sandbox_handle", "interim_reward"} <= seen and not seen & INTERNALS, sorted(seen)
