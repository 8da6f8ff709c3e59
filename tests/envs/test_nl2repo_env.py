"""NL2RepoEnv end to end on the local sandbox backend (fast; what is isolated is tested
in tests/sandbox and, for grading, in tests/scoring/test_tamper.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from gyre_env.envs.nl2repo.env import EnvInfraError, NL2RepoEnv
from nl2repo_task import GOLD, PARTIAL, call

import gyre_env
from gyre_env.scoring import OUTCOMES

# This machine's Python has many pytest plugins; loading them costs seconds per run. The
# agent's and the grader's pytest runs here load none (the Docker image has none anyway).
FAST = dict(
    sandbox_backend="local",
    sandbox={"env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}},
    grading={"pytest_plugins": []},
)


def make_env(task_dir, **options) -> NL2RepoEnv:
    return NL2RepoEnv(task_path=str(task_dir), **{**FAST, **options})


@pytest.fixture
def env(task_dir):
    env = make_env(task_dir)
    yield env
    env.close()


def run(env, actions):
    rewards, info = [], None
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return rewards, obs, terminated, truncated, info
    return rewards, obs, False, False, info


def test_reset_gives_prompt_tools_and_task(env):
    obs, info = env.reset(seed=0)
    assert "# Specification" in obs and "add, sub, mul and div" in obs
    assert [t["name"] for t in info["tools"]] == [
        "bash",
        "read_file",
        "write_file",
        "str_replace",
        "list_dir",
        "run_tests",
        "submit",
    ]
    assert all(t["parameters"]["type"] == "object" for t in info["tools"])
    assert info["task"]["id"] == "calc" and info["task"]["test_count"] == 4
    assert info["outcome"] is None and info["reward_valid"] is True
    assert env.observation_space.contains(obs)
    listing = env.step(call("list_dir"))[0]
    assert listing.splitlines() == ["SPEC.md", "tests/", "tests/test_visible.py"]


def test_gold_episode_return_equals_final_score(env):
    env.reset(seed=1)
    rewards, obs, terminated, truncated, info = run(
        env,
        [
            call("write_file", path="calc.py", content=GOLD),
            call("run_tests"),
            call("submit"),
        ],
    )
    assert (terminated, truncated, info["outcome"]) == (True, False, "success")
    assert info["reward"]["final_score"] == 1.0 and sum(rewards) == 1.0
    assert rewards[0] > 0  # the potential paid for a file that compiles and lints
    assert info["grading"]["passed"] == 4 and info["grading"]["count_mismatch"] is False
    assert "4 of 4 passed" in obs
    assert env.sandbox is None  # freed at the end of the episode


def test_tool_errors_are_observations_and_return_is_exact(env):
    env.reset(seed=2)
    steps = [
        (call("nope"), "unknown tool 'nope'"),
        ({"name": "read_file", "arguments": "{oops"}, "not valid JSON"),
        (call("read_file"), "missing required argument 'path'"),
        (call("read_file", path="../../etc/passwd"), "outside the workspace"),
        (call("read_file", path="missing.py"), "no such file"),
        (call("write_file", path="calc.py", content=PARTIAL + "\nadd = add\nadd = add\n"), None),
        (call("str_replace", path="calc.py", old_str="add = add", new_str="x"), "occurs 2 times"),
        (call("str_replace", path="calc.py", old_str="zzz", new_str="x"), "not found"),
        (call("list_dir", path="/"), "outside the workspace"),
        (call("bash", command="exit 3"), None),
    ]
    rewards = []
    for action, error in steps:
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        assert not (terminated or truncated)
        if error is not None:
            assert error in obs and info["tool_ok"] is False, obs
    assert obs.endswith("[exit code 3]")
    obs, reward, terminated, _, info = env.step(call("submit"))
    rewards.append(reward)
    assert info["outcome"] == "failure" and info["reward"]["final_score"] == 0.25
    assert sum(rewards) == 0.25


@pytest.mark.parametrize(
    "bad", ["submit", None, ["bash", "ls"], {"name": "bash"}, {"name": "bash", "arguments": 3}]
)
def test_wrong_action_type_raises(env, bad):
    env.reset(seed=0)
    with pytest.raises(TypeError, match="invalid action"):
        env.step(bad)


def test_step_limit_truncates_with_the_partial_score(task_dir):
    env = make_env(task_dir, max_steps=2)
    env.reset(seed=0)
    rewards, obs, terminated, truncated, info = run(
        env, [call("write_file", path="calc.py", content=PARTIAL), call("bash", command="true")]
    )
    assert (terminated, truncated, info["outcome"]) == (False, True, "timeout")
    assert info["reward"]["final_score"] == 0.25 and sum(rewards) == 0.25
    with pytest.raises(RuntimeError, match="reset"):
        env.step(call("bash", command="true"))
    env.close()


def test_wall_clock_limit_cuts_a_long_command(task_dir):
    env = make_env(task_dir, wall_clock_s=2)
    env.reset(seed=0)
    obs, _, terminated, truncated, info = env.step(call("bash", command="sleep 30"))
    assert truncated and info["outcome"] == "timeout" and "timed out" in obs
    env.close()


def test_workspace_that_hangs_the_grader_is_agent_error(task_dir):
    env = make_env(task_dir, grading={"timeout_s": 4, "pytest_plugins": []}, reward_mode="sparse")
    env.reset(seed=0)
    env.step(call("write_file", path="calc.py", content="import time\ntime.sleep(300)\n"))
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and info["outcome"] == "agent_error" and info["reward_valid"] is True
    assert reward == 0.0 and info["reward"]["final_score"] == 0.0
    assert info["grading"]["status"] == "workspace_error"
    env.close()


def test_dead_sandbox_is_infra_error_not_a_zero(env):
    env.reset(seed=0)
    env.sandbox.close()  # the container dies under the env
    _, reward, terminated, truncated, info = env.step(call("bash", command="ls"))
    assert info["outcome"] == "infra_error" and info["reward_valid"] is False
    assert truncated and not terminated and info["reward"]["final_score"] is None


@pytest.mark.parametrize("mode, expected", [("sparse", [0.0, 0.25]), ("interim", [0.5, 0.25])])
def test_other_reward_modes(task_dir, mode, expected):
    """interim: Φ = 0.1 syntax + 0.1 lint + 0.3 visible tests (all pass), then the score."""
    env = make_env(task_dir, reward_mode=mode)
    env.reset(seed=0)
    rewards, *_, info = run(
        env, [call("write_file", path="calc.py", content=PARTIAL), call("submit")]
    )
    assert rewards == pytest.approx(expected, abs=1e-12)
    assert info["outcome"] == "failure"
    env.close()


def test_reset_options_and_seeding(env):
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"task": "calc"})
    with pytest.raises(ValueError, match="no task matches"):
        env.reset(options={"task_id": "other"})
    obs, info = env.reset(seed=5, options={"task_id": "calc", "tier": "micro"})
    assert info["task"]["id"] == "calc"


def test_options_are_checked():
    with pytest.raises(TypeError, match="unknown NL2RepoEnv options"):
        NL2RepoEnv(reward="sparse")
    with pytest.raises(ValueError, match="reward_mode"):
        NL2RepoEnv(reward_mode="dense")


def _marker_count(obs: str, limit: int) -> tuple[int, int]:
    """``(omitted, total)`` from the one truncation marker of ``obs``, checking it names
    ``limit`` and that the characters shown plus those omitted make the total."""
    markers = re.findall(
        r"^\[output truncated: ([\d,]+) of ([\d,]+) characters omitted; limit ([\d,]+)\]$",
        obs,
        flags=re.M,
    )
    assert len(markers) == 1, obs[:300]
    omitted, total, stated = (int(n.replace(",", "")) for n in markers[0])
    assert stated == limit and len(obs) <= limit
    marker_line = f"[output truncated: {markers[0][0]} of {markers[0][1]} characters "
    marker_line += f"omitted; limit {markers[0][2]}]"
    assert len(obs) - len(marker_line) - 2 + omitted == total  # 2: the marker's newlines
    return omitted, total


def test_a_huge_output_is_cut_once_stating_the_true_count_and_the_limit(env):
    """100 MB from `bash` (far over the sandbox's 1 MiB memory cap too) comes back as one
    observation of at most 30,000 characters: head, one marker with the exact count of
    characters omitted out of the whole output, and the tail with the exit code."""
    _, info = env.reset(seed=0)
    assert env.config.max_output_chars == 30_000
    # the marker tells the model the limit; the schemas stay as they were
    assert not any("30,000" in t["description"] for t in info["tools"])
    obs, _, _, _, info = env.step(call("bash", command="yes | head -c 100000000"))
    assert info["tool_ok"] and env.observation_space.contains(obs)
    omitted, total = _marker_count(obs, 30_000)
    assert total == 100_000_000 + len("[exit code 0]")  # yes's output ends in a newline
    assert omitted > 99_000_000
    assert obs.startswith("y\ny\n") and obs.endswith("y\ny\n[exit code 0]")
    assert "[gyre]" not in obs  # no second marker from the sandbox


def test_the_one_limit_is_configurable_and_counts_characters(task_dir):
    """A smaller ``max_output_chars`` is the limit every long-output tool obeys and its
    marker states; the count is in characters (multi-byte ones too), not bytes."""
    env = make_env(task_dir, max_output_chars=2000)
    try:
        env.reset(seed=0)
        assert env.observation_space.max_length >= 2000
        obs = env.step(call("bash", command="python3 -c \"print('é' * 50000)\""))[0]
        assert _marker_count(obs, 2000)[1] == 50_001 + len("[exit code 0]")
        env.step(call("write_file", path="big.txt", content="line\n" * 10_000))
        obs = env.step(call("read_file", path="big.txt"))[0]
        assert _marker_count(obs, 2000)[1] == 50_000
        short = env.step(call("bash", command="echo hi"))[0]
        assert short == "hi\n[exit code 0]"
    finally:
        env.close()


def test_output_limit_options_are_checked():
    with pytest.raises(ValueError, match="max_output_chars must be >= 1000"):
        NL2RepoEnv(max_output_chars=10)
    with pytest.raises(ValueError, match="cannot hold max_output_chars"):
        NL2RepoEnv(max_output_chars=200_000, sandbox={"output_limit": 1 << 20})


def test_clip_keeps_head_and_tail_within_the_limit():
    from gyre_env.envs.nl2repo.tools import clip

    assert clip("short", 1000) == "short"
    text = "".join(f"{i:06d}\n" for i in range(10_000))
    out = clip(text, 1000)
    assert len(out) <= 1000 and out.startswith("000000\n") and out.endswith("009999\n")
    assert _marker_count(out, 1000)[1] == len(text)
    # Characters a sandbox dropped from the middle count in the marker, not in the text.
    assert _marker_count(clip(text, 1000, omitted=5), 1000)[1] == len(text) + 5


def test_setup_failure_raises_env_infra_error(tmp_path):
    from nl2repo_task import TASK_TOML, make_task_dir

    folder = make_task_dir(tmp_path / "t", TASK_TOML + 'setup_commands = ["exit 7"]\n')
    env = make_env(folder)
    with pytest.raises(EnvInfraError, match="exit 7"):
        env.reset(seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(call("bash", command="true"))
    env.close()


def test_close_is_idempotent_and_frees_the_sandbox(env):
    env.reset(seed=0)
    workspace = env.sandbox.workspace
    assert os.path.isdir(workspace)
    env.close()
    env.close()
    assert not os.path.exists(workspace) and env.sandbox is None
    with pytest.raises(RuntimeError, match="closed"):
        env.step(call("bash", command="true"))


@pytest.mark.slow
def test_check_env_bare_and_through_make(task_dir):
    bare = make_env(task_dir)
    check_env(bare)
    bare.close()
    made = gym.make("Gyre/NL2Repo-v0", task_path=str(task_dir), **FAST)
    check_env(made)
    made.close()


def test_registered_ids_and_module_prefix():
    assert "Gyre/NL2Repo-v0" in gym.registry and "Gyre/NL2Repo-micro-v0" in gym.registry
    micro = gym.make("Gyre/NL2Repo-micro-v0", sandbox_backend="local")
    assert micro.unwrapped.tasks and {t.tier for t in micro.unwrapped.tasks} == {"micro"}
    micro.close()
    code = (
        "import sys, gymnasium as gym\n"
        "env = gym.make('gyre_env:Gyre/NL2Repo-v0', sandbox_backend='local')\n"
        "print(type(env.unwrapped).__name__, 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.split() == ["NL2RepoEnv", "False"]


def test_register_task_env_one_call(task_dir, tmp_path):
    gyre_env.register_task_env("Test/Calc-v0", task_dir, reward_mode="sparse", **FAST)
    env = gym.make("Test/Calc-v0")
    obs, info = env.reset(seed=0)
    assert info["task"]["id"] == "calc" and env.unwrapped.config.reward_mode == "sparse"
    env.close()
    with pytest.raises(FileNotFoundError):
        gyre_env.register_task_env("Test/Nothing-v0", tmp_path / "missing")
    with pytest.raises(TypeError, match="unknown NL2RepoEnv options"):
        gyre_env.register_task_env("Test/Calc-v1", task_dir, rewards="sparse")


def test_make_vec_sync_and_threaded_step_concurrently(task_dir):
    import time

    kwargs = dict(task_path=str(task_dir), reward_mode="sparse", **FAST)
    sleep = {"name": "bash", "arguments": {"command": "sleep 1"}}
    timings = {}
    for mode in ("sync", "vector_entry_point"):
        envs = gym.make_vec("Gyre/NL2Repo-v0", num_envs=3, vectorization_mode=mode, **kwargs)
        obs, infos = envs.reset(seed=0)
        assert len(obs) == 3 and list(infos["task"]["id"]) == ["calc"] * 3
        start = time.monotonic()
        obs, rewards, terms, truncs, infos = envs.step((sleep,) * 3)
        timings[mode] = time.monotonic() - start
        assert all(o.endswith("[exit code 0]") for o in obs) and not terms.any()
        envs.close()
        envs.close()
    assert type(envs).__name__ == "ThreadVectorEnv"
    assert timings["sync"] >= 3.0 and timings["vector_entry_point"] < 2.5, timings


def test_outcomes_are_one_documented_list():
    """One definition: the env's outcomes, and ``cancelled`` / ``killed`` that only the
    runner gives."""
    import gyre_env.runner
    import gyre_env.scoring

    assert OUTCOMES == (
        "success", "failure", "timeout", "agent_error", "infra_error", "cancelled", "killed"
    )  # fmt: skip
    for outcome in OUTCOMES:
        assert f"``{outcome}``" in gyre_env.scoring.__doc__
    assert not hasattr(gyre_env.runner, "OUTCOMES")


@pytest.mark.docker
def test_docker_episode_gold_and_partial(task_dir):
    """The real setup: agent sandbox and evaluator are containers of the task's image."""
    env = NL2RepoEnv(task_path=str(task_dir), sandbox_backend="docker")
    obs, info = env.reset(seed=0)
    assert "/workspace" not in obs
    # The hidden tests are nowhere in the agent's container (not in the image either).
    found, first, *_ = env.step(
        call(
            "bash",
            command="find / -xdev -name 'test_calc.py' 2>/dev/null; "
            "grep -rl 'def test_div' /workspace /tmp /root",
        )
    )
    assert "test_calc" not in found and found.strip().endswith("[exit code 1]"), found
    rewards, obs, terminated, _, info = run(
        env, [call("write_file", path="calc.py", content=GOLD), call("run_tests"), call("submit")]
    )
    assert info["outcome"] == "success" and first + sum(rewards) == 1.0, obs
    assert env.last_grading.privilege_drop
    env.reset(seed=0)
    rewards, *_, info = run(
        env, [call("write_file", path="calc.py", content=PARTIAL), call("submit")]
    )
    assert info["outcome"] == "failure" and sum(rewards) == 0.25
    env.close()


@pytest.mark.docker
def test_warm_pool_resets_take_started_sandboxes_never_shared(task_dir):
    """With ``warm_pool`` the env takes a started container at reset (no cold start), the
    pool refills in the background, and no container serves two episodes."""
    from gyre_env.sandbox.pool import close_shared_pools, shared_pools

    envs = [NL2RepoEnv(task_path=str(task_dir), sandbox_backend="docker", warm_pool=2)]
    envs.append(NL2RepoEnv(task_path=str(task_dir), sandbox_backend="docker", warm_pool=2))
    try:
        envs[0].reset(seed=0)
        [pool] = shared_pools()
        assert pool.wait_ready(timeout=60)
        seen = {envs[0].sandbox.id}
        for env in envs * 2:
            assert pool.wait_ready(timeout=60)  # refilled in the background
            env.reset(seed=0)
            assert env.sandbox.id not in seen
            seen.add(env.sandbox.id)
            _, _, _, _, info = env.step(call("bash", command="echo warm"))
            assert info["tool_ok"]
        assert pool.cold_starts == 1  # only the very first reset, before the pool was warm
    finally:
        for env in envs:
            env.close()
        close_shared_pools()


def test_cli_agent_api_sandbox_handle_and_interim_reward(task_dir):
    """What an agent acting inside the sandbox uses: the sandbox, and interim rewards at
    its model-turn boundaries that sum with the final reward to the score."""
    env = make_env(task_dir, reward_mode="potential")
    with pytest.raises(RuntimeError, match="reset"):
        env.sandbox_handle()
    env.reset(seed=0)
    sandbox = env.sandbox_handle()
    first, _ = env.interim_reward()
    sandbox.write_file("calc.py", PARTIAL)  # the agent's own process writes the file
    reward, info = env.interim_reward()
    assert info["reward"]["value"] == reward and reward > 0
    assert info["reward"]["potential"]["phi"] == pytest.approx(first + reward)
    assert env.last_scoring_s > 0
    _, final, *_ = env.step(call("submit"))
    assert first + reward + final == pytest.approx(0.25)  # the return is the score
    env.close()
    sparse = make_env(task_dir, reward_mode="sparse")
    sparse.reset(seed=0)
    assert sparse.interim_reward() == (0.0, {})
    sparse.close()
