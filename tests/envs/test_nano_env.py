"""``Gyre/NL2Repo-nano-v0`` and the env's ``tools`` subset option."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from gyre_env.agents import GoldAgent
from gyre_env.agents.base import EpisodeClock
from gyre_env.agents.context import EpisodeContext
from gyre_env.agents.scripted import gold_actions
from gyre_env.envs.nl2repo.env import NL2RepoConfig, NL2RepoEnv
from gyre_env.envs.nl2repo.registration import NANO_ENV_ID
from nl2repo_task import call

import gyre_env  # noqa: F401  (registers the ids)

NANO_TOOLS = ["write_file", "run_tests", "submit"]
FAST = dict(
    sandbox_backend="local",
    sandbox={"env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}},
    grading={"pytest_plugins": []},
)


@pytest.fixture(scope="module")
def suite_kwargs(tmp_path_factory):
    root = tmp_path_factory.mktemp("nano")
    return {"split": "train", "count": 8, "seed": 0, "root": str(root)}


def make_nano(suite_kwargs, **options):
    return gym.make(NANO_ENV_ID, suite_kwargs=suite_kwargs, **{**FAST, **options})


def run_gold(env, obs, info) -> EpisodeContext:
    ctx = EpisodeContext(
        episode_id="nano", env=env, observation=obs, info=info, clock=EpisodeClock()
    )
    GoldAgent().run(ctx)
    return ctx


def test_registered_with_nano_defaults():
    spec = gym.spec(NANO_ENV_ID)
    assert spec.kwargs["suite"] == "nano" and spec.kwargs["tools"] == NANO_TOOLS
    assert spec.kwargs["suite_kwargs"] == {"split": "train", "count": 256, "seed": 0}


def test_reset_offers_three_tools_and_a_short_prompt(suite_kwargs, tok):
    env = make_nano(suite_kwargs)
    obs, info = env.reset(seed=0)
    assert [t["name"] for t in info["tools"]] == NANO_TOOLS
    assert env.unwrapped.action_space.tool_names == NANO_TOOLS
    assert info["task"]["tier"] == "nano" and "solution.py" in obs and "# Specification" not in obs
    prompt_tokens = len(tok.backend_tokenizer.encode(obs, add_special_tokens=False).ids)
    assert prompt_tokens < 80, (prompt_tokens, obs)
    obs, reward, terminated, truncated, info = env.step(call("bash", command="ls"))
    assert obs.startswith("Error: unknown tool 'bash'") and "write_file, run_tests, submit" in obs
    assert info["tool_ok"] is False and not (terminated or truncated)
    env.close()


def test_gold_agent_episode_scores_one(suite_kwargs):
    env = make_nano(suite_kwargs)
    for seed in range(2):
        obs, info = env.reset(seed=seed)
        ctx = run_gold(env, obs, info)
        assert ctx.terminated and ctx.last_info["outcome"] == "success"
        assert ctx.last_info["reward"]["final_score"] == 1.0 and ctx.total_reward == 1.0
    env.close()


def test_visible_test_and_wrong_answer(suite_kwargs):
    env = make_nano(suite_kwargs, reward_mode="sparse")
    env.reset(seed=0)
    task = env.unwrapped.task
    obs, *_ = env.step(call("run_tests"))
    assert obs.startswith("Visible tests: 0 passed, 0 failed, 1 errors"), obs  # no file yet
    signature = task.title  # e.g. "add_seven(x)"
    env.step(call("write_file", path="solution.py", content=f"def {signature}:\n    return None\n"))
    obs, *_ = env.step(call("run_tests"))
    assert obs.startswith("Visible tests: 0 passed, 1 failed"), obs
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and info["outcome"] == "failure" and reward == 0.0
    assert info["grading"]["passed"] == 0 and info["grading"]["failed"] == 4
    env.close()


def test_split_and_count_through_make(suite_kwargs):
    kwargs = {**suite_kwargs, "split": "heldout", "count": 5}
    env = make_nano(kwargs)
    assert len(env.unwrapped.tasks) == 5 and {t.tier for t in env.unwrapped.tasks} == {"nano"}
    train = {t.id for t in make_nano(suite_kwargs).unwrapped.tasks}
    assert not train & {t.id for t in env.unwrapped.tasks}
    env.close()


@pytest.mark.slow
def test_check_env_nano(suite_kwargs):
    env = make_nano(suite_kwargs)
    check_env(env.unwrapped)
    env.close()


@pytest.mark.slow
def test_tools_option_is_checked_and_keeps_all_by_default(task_dir):
    with pytest.raises(ValueError, match=r"unknown tools \['shell'\]; known tools: \['bash'"):
        NL2RepoConfig(tools=["write_file", "shell"])
    with pytest.raises(ValueError, match="non-empty list"):
        NL2RepoConfig(tools=[])
    with pytest.raises(ValueError, match="non-empty list"):
        NL2RepoConfig(tools="bash")
    env = NL2RepoEnv(task_path=str(task_dir), tools=["submit", "read_file"], **FAST)
    obs, info = env.reset(seed=0)
    assert [t["name"] for t in info["tools"]] == ["read_file", "submit"]
    assert "Tools: read_file, submit." in obs and "run_tests" not in obs
    obs, *_, info = env.step(call("run_tests"))
    assert "unknown tool 'run_tests'" in obs and info["tool_ok"] is False
    check_env(env)
    env.close()
    full = NL2RepoEnv(task_path=str(task_dir), **FAST)
    assert len(full.tool_schemas) == 7
    full.close()


@pytest.mark.slow
@pytest.mark.docker
def test_docker_gold_episode_is_quick(suite_kwargs):
    """reset -> write_file -> submit -> graded, with containers for agent and evaluator;
    the visible test runs in the agent's container (its image has ``python3``)."""
    env = gym.make(NANO_ENV_ID, suite_kwargs=suite_kwargs, sandbox_backend="docker")
    env.reset(seed=0)
    gold = gold_actions(env.unwrapped.task.gold_dir)
    env.step(gold[0])
    obs, *_ = env.step(call("run_tests"))
    assert obs.startswith("Visible tests: 1 passed, 0 failed"), obs
    timings = []
    for seed in range(1, 3):
        start = time.monotonic()
        obs, info = env.reset(seed=seed)
        ctx = run_gold(env, obs, info)
        timings.append(time.monotonic() - start)
        assert ctx.last_info["outcome"] == "success" and ctx.total_reward == 1.0
    env.close()
    print(f"\nnano gold episodes with Docker: {', '.join(f'{t:.2f}s' for t in timings)}")
    assert min(timings) < 30
