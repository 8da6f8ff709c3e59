"""Hostile agents against the env's bound: every ``env.step`` returns within its timeout
plus a bounded grace, whatever the agent ran, and the episode still ends with an outcome.

Each test drives one attack through the public env API (``gym.make("Gyre/NL2Repo-v0")``)
on Docker and on bubblewrap: fork and memory bombs whose command ends normally or times
out, a solution whose import spins (in ``run_tests``, in the interim reward and in final
grading), daemons that ignore ``SIGTERM`` and leave their process group, and a ``SIGTERM``
to the process running the env while a test run spins. After each attack the next step
(``echo ok``) must answer within its own timeout plus ``GRACE_S``, nothing the attack
started may be left running, and ``submit`` must return an outcome.

The bounds are generous (CI machines have two cores) but far below what the attacks
cost before: a wedged sandbox never answered again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import gyre_env  # noqa: F401  (registers the env ids)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scoring"))
from calc_task import write_tree  # noqa: E402

from gyre_env.scoring import OUTCOMES

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("bwrap", marks=pytest.mark.bwrap),
]
GRACE_S = 30.0
"""Seconds a step may take beyond its own timeouts (sandbox cleanup, a loaded CI box)."""
LIMITS = {"memory_mb": 256, "pids": 128}
"""The agent sandbox's limits: small, so that the bombs reach them fast."""
TESTS_TIMEOUT_S = 6.0
GRADING_TIMEOUT_S = 12.0
"""Short, so that the spinning solutions reach them fast; long enough for the gold
solution's tests on a loaded CI box (about 2 s)."""

GOLD = "def add(a, b):\n    return a + b\n"
SPIN = "while True:\n    pass\n"
# Imported by the tests: ignores SIGTERM, leaves a spinning child in its own session
# (out of the process group a timeout kills), then spins itself.
NASTY = """import os, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            pass
    os._exit(0)
while True:
    pass
"""
TASK_TOML = f"""id = "bombs"
title = "add"
tier = "micro"
domain = "numerics"
test_commands = ["python -m pytest -q tests/test_hidden.py"]
test_count = 2
max_steps = 40
wall_clock_s = 1800
grading_timeout_s = {GRADING_TIMEOUT_S}
"""
HIDDEN = (
    "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_add_negative():\n    assert add(-2, 1) == -1\n"
)
VISIBLE = "from calc import add\n\n\ndef test_add_visible():\n    assert add(1, 1) == 2\n"

# Counts the live (not zombie) processes of the sandbox's pid namespace.
PROBE = (
    "import os\nn = 0\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        try:\n"
    "            s = open('/proc/%s/stat' % p).read()\n        except OSError:\n"
    "            continue\n        n += s.rsplit(') ', 1)[1][0] != 'Z'\nprint('processes', n)"
)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bomb-task")
    files = {
        "task.toml": TASK_TOML,
        "spec.md": "Write `calc.py` with a function add(a, b).\n",
        "hidden_tests/tests/test_hidden.py": HIDDEN,
        "visible_tests/tests/test_visible.py": VISIBLE,
        "gold/calc.py": GOLD,
    }
    return write_tree(root, files)


# Prints "state PID S" for each pid: its state letter (Z: dead, not yet reaped), or "gone".
STATES = (
    "for p in {pids}; do s=$(cat /proc/$p/stat 2>/dev/null); s=${{s##*) }}; "
    'echo "state $p ${{s%% *}}"; done'
)


def states(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if line.startswith("state "):
            _, pid, *state = line.split()
            found[pid] = state[0] if state else "gone"
    return found


def make_env(task_dir: Path, backend: str, **options):
    settings = dict(
        task_path=str(task_dir),
        sandbox_backend=backend,
        reward_mode="sparse",
        sandbox=dict(LIMITS),
        grading={"pytest_plugins": []},
    )
    return gym.make("Gyre/NL2Repo-v0", **{**settings, **options})


def bash(command: str, timeout: int) -> dict:
    return {"name": "bash", "arguments": {"command": command, "timeout": timeout}}


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def timed_step(env, action: dict, bound_s: float):
    """``env.step(action)``, asserted to return within ``bound_s`` seconds."""
    start = time.monotonic()
    obs, reward, terminated, truncated, info = env.step(action)
    elapsed = time.monotonic() - start
    assert elapsed < bound_s, f"{action['name']} took {elapsed:.1f}s (bound {bound_s:.0f}s)"
    return obs, terminated or truncated, info


def process_count(env) -> int:
    obs, done, info = timed_step(env, bash(f'python3 -c "{PROBE}"', 30), 30 + GRACE_S)
    assert not done and "[exit code 0]" in obs, obs
    return int(obs.split("processes", 1)[1].split()[0])


def assert_answers(env, baseline: int) -> None:
    """The next step answers within its timeout plus the grace, and the attack left
    nothing running (the probe's count is not above the one before the attack)."""
    obs, done, info = timed_step(env, bash("echo ok", 10), 10 + GRACE_S)
    assert not done and obs == "ok\n[exit code 0]", obs
    assert process_count(env) <= baseline


def assert_graded(env, expected: str = "failure", bound_s: float = 120.0) -> dict:
    """``submit`` returns an outcome (never raises) within ``bound_s``."""
    obs, done, info = timed_step(env, call("submit"), bound_s)
    assert done and info["outcome"] in OUTCOMES, obs
    assert info["outcome"] == expected, (info["outcome"], info.get("grading"), obs)
    return info


def attack_then_check(task_dir: Path, backend: str, command: str, timeout: int) -> str:
    """Start an episode, run ``command`` with the bash tool, check the env still answers
    and leaves nothing behind, grade. Returns the attack's observation."""
    env = make_env(task_dir, backend)
    try:
        env.reset(seed=0)
        baseline = process_count(env)
        obs, done, info = timed_step(env, bash(command, timeout), timeout + GRACE_S)
        assert not done, obs
        assert_answers(env, baseline)
        assert_graded(env)
        return obs
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_bomb_whose_command_ends_normally(task_dir, backend):
    obs = attack_then_check(task_dir, backend, ":(){ :|:& };: ; sleep 2; echo done", 20)
    assert "Resource temporarily unavailable" in obs, obs[-2000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_bomb_that_times_out(task_dir, backend):
    obs = attack_then_check(task_dir, backend, ":(){ :|:& };: ; while :; do :; done", 5)
    assert "timed out after 5s" in obs, obs[-2000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_bomb_whose_command_ends_normally(task_dir, backend):
    # One hog is killed at the limit; six holders of 60 MB each (past the 256 MB limit
    # together) are left sleeping when the command ends.
    hold = "import time; a = bytearray(60 << 20); time.sleep(100000)"
    command = (
        "python3 -c 'bytearray(1 << 30)'; echo hog exit $?; "
        f"for i in 1 2 3 4 5 6; do python3 -c '{hold}' & done; sleep 3; echo done"
    )
    obs = attack_then_check(task_dir, backend, command, 60)
    assert "hog exit 0" not in obs and "done" in obs, obs[-2000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_bomb_that_times_out(task_dir, backend):
    command = "while :; do python3 -c 'a = bytearray(1 << 30)'; done"
    obs = attack_then_check(task_dir, backend, command, 4)
    assert "timed out after 4s" in obs, obs[-2000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_daemons_that_ignore_sigterm_and_leave_the_process_group_are_killed(task_dir, backend):
    command = (
        # its own session, SIGTERM and SIGHUP ignored, spinning
        "setsid bash -c 'trap \"\" TERM HUP INT; while :; do :; done' "
        "</dev/null >/dev/null 2>&1 & echo pid $!; "
        # double fork: orphaned to init at once
        "( bash -c 'trap \"\" TERM HUP; exec sleep 100000' </dev/null >/dev/null 2>&1 & "
        "echo pid $! ); echo started"
    )
    env = make_env(task_dir, backend)
    try:
        env.reset(seed=0)
        baseline = process_count(env)
        obs, done, info = timed_step(env, bash(command, 20), 20 + GRACE_S)
        assert "started" in obs, obs
        pids = [line.split()[1] for line in obs.splitlines() if line.startswith("pid ")]
        assert len(pids) == 2, obs
        obs, done, info = timed_step(env, bash(STATES.format(pids=" ".join(pids)), 10), 40)
        assert set(states(obs).values()) <= {"gone", "Z"}, obs
        assert_answers(env, baseline)
        assert_graded(env)
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_spinning_import_in_run_tests_and_the_interim_reward(task_dir, backend):
    """The visible tests (``run_tests``, and the interim reward after each write) stop at
    their ``tests_timeout_s``, though the solution spins at import and ignores SIGTERM."""
    env = make_env(
        task_dir,
        backend,
        reward_mode="potential",
        potential={"tests_timeout_s": TESTS_TIMEOUT_S},
    )
    try:
        env.reset(seed=0)
        baseline = process_count(env)
        bound = TESTS_TIMEOUT_S + GRACE_S
        obs, done, info = timed_step(env, call("write_file", path="calc.py", content=NASTY), bound)
        assert not done and info["reward"]["potential"]["tests"] == 0.0, info
        obs, done, info = timed_step(env, call("run_tests"), bound)
        assert not done and "timed out" in obs, obs
        assert_answers(env, baseline)
        timed_step(env, call("write_file", path="calc.py", content=GOLD), bound)
        assert_graded(env, expected="success")
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_spinning_import_in_final_grading_is_the_workspaces_failure(task_dir, backend):
    env = make_env(task_dir, backend)
    try:
        env.reset(seed=0)
        timed_step(env, call("write_file", path="calc.py", content=NASTY), GRACE_S)
        # The workspace run stops at the grading timeout; a control run on the gold
        # solution (another evaluator) then puts the blame on the workspace.
        info = assert_graded(env, expected="agent_error", bound_s=3 * GRADING_TIMEOUT_S + 60)
        assert info["reward_valid"] and info["grading"]["status"] == "workspace_error", info
        assert "timed out" in info["grading"]["reason"], info["grading"]
    finally:
        env.close()


_OWNER = r"""
import json, sys
import gymnasium as gym
import gyre_env
backend, task_dir, spin = sys.argv[1:4]
env = gym.make("Gyre/NL2Repo-v0", task_path=task_dir, sandbox_backend=backend,
               reward_mode="sparse", sandbox={"memory_mb": 256, "pids": 128})
env.reset(seed=0)
sandbox = env.unwrapped.sandbox
print(json.dumps({"container": getattr(getattr(sandbox, "container", None), "id", None),
                  "host_dir": getattr(sandbox, "host_dir", None)}), flush=True)
env.step({"name": "write_file", "arguments": {"path": "calc.py", "content": spin}})
print("running", flush=True)
env.step({"name": "run_tests", "arguments": {}})  # spins for the default 300 s
print("finished", flush=True)
"""


def _sandbox_gone(backend: str, made: dict) -> bool:
    if backend == "docker":
        from gyre_env.sandbox.docker import docker_client

        try:
            docker_client().containers.get(made["container"])
            return False
        except Exception as e:
            assert type(e).__name__ == "NotFound", e
            return True
    return not os.path.exists(made["host_dir"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigterm_stops_an_env_whose_test_run_spins(task_dir, backend):
    """The process running the env answers SIGTERM mid-step: it closes its sandbox and
    dies of the signal, instead of waiting for the spinning test run."""
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, backend, str(task_dir), NASTY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = owner.stdout.readline()
        assert line, owner.stderr.read()[-3000:] if owner.poll() is not None else "no output"
        made = json.loads(line)
        assert owner.stdout.readline().strip() == "running"
        time.sleep(3)  # inside run_tests, which spins
        assert owner.poll() is None
        start = time.monotonic()
        owner.send_signal(signal.SIGTERM)
        code = owner.wait(timeout=GRACE_S)
        assert code == -signal.SIGTERM, owner.stderr.read()[-3000:]
        assert time.monotonic() - start < GRACE_S
        assert _sandbox_gone(backend, made), made
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


@pytest.mark.parametrize("backend", [*BACKENDS, "local"])
def test_keep_background_keeps_what_its_command_leaves_and_nothing_else(backend):
    """What a ``keep_background`` command leaves running (the proxy forwarder, a CLI agent)
    and its later children outlive the next commands; what those commands leave does not."""
    from gyre_env.sandbox import SandboxConfig, make_sandbox

    with make_sandbox(SandboxConfig(**LIMITS), backend=backend) as sandbox:
        kept = sandbox.exec(
            "setsid bash -c 'sleep 100000 & sleep 100001 & wait' </dev/null >/dev/null 2>&1 & "
            "echo $!",
            timeout=30,
            keep_background=True,
        )
        root = kept.stdout.strip()
        assert root.isdigit(), kept
        left = sandbox.exec("sleep 100002 </dev/null >/dev/null 2>&1 & echo $!", timeout=30)
        other = left.stdout.strip()
        assert other.isdigit(), left
        try:
            # The kept root may still be starting on a loaded machine (state R, fewer than
            # its two children yet): poll until it waits on them, then check.
            deadline = time.monotonic() + 30
            while True:
                found = states(
                    sandbox.exec(STATES.format(pids=f"{root} {other}"), timeout=30).stdout
                )
                children = sandbox.exec(f"cat /proc/{root}/task/{root}/children", timeout=30)
                settled = found[root] == "S" and len(children.stdout.split()) == 2
                if settled or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert found[root] == "S", found
            assert found[other] in ("gone", "Z"), found
            # The kept root's children live on too (two sleeps).
            assert len(children.stdout.split()) == 2, children
        finally:
            sandbox.exec(f"kill -KILL -- -{root}", timeout=30)  # the local backend's host


@pytest.mark.docker
def test_a_workspace_that_cannot_be_copied_out_is_the_agents_failure(task_dir):
    """The agent (root in its container) replaces ``tar``: copying the workspace out for
    grading reads garbage. ``submit`` returns ``agent_error``; no ``tarfile`` error escapes."""
    env = make_env(task_dir, "docker")
    try:
        env.reset(seed=0)
        fake = "printf '#!/bin/sh\\necho not-a-tar\\n' > /usr/local/bin/tar; chmod +x /usr/local/bin/tar"
        obs, done, info = timed_step(env, bash(fake, 30), 30 + GRACE_S)
        assert "[exit code 0]" in obs, obs
        info = assert_graded(env, expected="agent_error")
        assert info["grading"]["status"] == "workspace_error", info
        assert "could not be copied out" in info["grading"]["reason"], info["grading"]
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_killing_every_process_it_may_leaves_the_sandbox_answering(task_dir, backend):
    """``kill -9 -1`` as the agent's root. On Docker it used to kill the container's
    keep-alive: the container stopped and the episode became an ``infra_error`` (left out
    of training: an escape from a low score). Now the keep-alive runs as another uid the
    agent's container lacks the capabilities to signal; the shell is started again."""
    obs = attack_then_check(task_dir, backend, "sleep 0.5; kill -9 -1; echo after", 20)
    assert "new shell was started" in obs or "after" in obs, obs[-2000:]


def _docker(*args: str) -> None:
    subprocess.run(["docker", *args], capture_output=True, timeout=60)


@pytest.mark.docker
@pytest.mark.parametrize(
    "stop, outcome",
    [
        # nobody (the keep-alive's uid) kills its own processes: the container's main
        # process exits and the container stops, as when a command still finds a way to
        # end its own sandbox (the one known way, above, no longer does)
        (("exec", "-u", "65534:65534", "{cid}", "kill", "-9", "-1"), "agent_error"),
        # removed from outside (an operator, a reaper): not the agent's doing
        (("rm", "-f", "{cid}"), "infra_error"),
    ],
)
def test_a_container_that_stops_under_a_command_is_the_agents_error(task_dir, stop, outcome):
    import threading

    env = make_env(task_dir, "docker")
    try:
        env.reset(seed=0)
        cid = env.unwrapped.sandbox_handle().container.id
        argv = [a.format(cid=cid) for a in stop]
        threading.Timer(1.0, _docker, argv).start()
        obs, done, info = timed_step(env, bash("sleep 20", 30), 30 + GRACE_S)
        assert done and info["outcome"] == outcome, (info["outcome"], obs)
        assert info["reward_valid"] == (outcome == "agent_error"), info
        if outcome == "agent_error":
            assert info["reward"]["final_score"] == 0.0
            assert "ended the sandbox itself" in obs, obs
    finally:
        env.close()
