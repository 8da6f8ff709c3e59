"""The rollout runner with real envs (Docker sandboxes, hidden-test grading): infra failures
injected by killing the evaluator's container mid-grading, time limits, cancellation, and
the live waterlevel. No model is needed: the agents are scripted (gold solutions)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest
from gyre_env.agents import GoldAgent, ScriptedAgent
from gyre_env.agents.base import EpisodeClock
from gyre_env.agents.scripted import gold_actions

from gyre_env.bench.summary import summarize
from gyre_env.phases import PhaseCounts
from gyre_env.runner import EpisodeSpec, Runner, RunnerConfig
from gyre_env.tasks import get_task

pytestmark = pytest.mark.docker
ENV = "Gyre/NL2Repo-v0"
TASK = "micro-roman-numerals"
KW = {"sandbox_backend": "docker"}


def _mine():
    """This process's sandbox containers (running ones), oldest first."""
    from gyre_env.sandbox.docker import LABEL_KIND, docker_client

    found = docker_client().containers.list(
        filters={"label": [LABEL_KIND, f"gyre.owner_pid={os.getpid()}"]}, ignore_removed=True
    )
    return sorted(found, key=lambda c: c.attrs["Created"])


class Killer(threading.Thread):
    """Kills (``docker kill``) the first ``times`` containers of this process that
    ``pick(containers)`` returns: an injected infrastructure crash."""

    def __init__(self, pick, times: int = 1):
        super().__init__(daemon=True)
        self.pick, self.times, self.killed, self.stop = pick, times, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and len(self.killed) < self.times:
            victim = self.pick(_mine())
            if victim is not None and victim.id not in self.killed:
                victim.kill()
                self.killed.append(victim.id)
            time.sleep(0.05)


def evaluator():
    """Picks an evaluator: a container started while an agent sandbox exists (grading copies
    the workspace into a fresh one), once grading is under way."""
    seen: set[str] = set()

    def pick(containers):
        fresh = [c for c in containers if c.id not in seen]
        seen.update(c.id for c in fresh)
        if len(containers) >= 2 and fresh:
            time.sleep(0.3)
            return fresh[-1]
        return None

    return pick


def sleeping(containers):
    """Picks a container in which the agent's ``sleep`` command runs."""
    for c in containers:
        try:
            if any("sleep" in " ".join(p) for p in c.top().get("Processes") or []):
                return c
        except Exception:  # it may have just gone
            continue
    return None


def _spec(eid: str, task: str = TASK) -> EpisodeSpec:
    return EpisodeSpec(episode_id=eid, env_id=ENV, env_kwargs=KW, reset_options={"task_id": task})


@pytest.mark.slow
def test_dead_agent_sandbox_is_infra_error_retried_and_never_a_zero():
    """The agent's container is killed mid-run (during a command): the attempt ends as
    ``infra_error`` and is retried; without retries it stays ``infra_error`` with no score,
    and the summary does not average it in as a 0."""
    *writes, submit = gold_actions(get_task(TASK).gold_dir)
    agent = ScriptedAgent([*writes, {"name": "bash", "arguments": {"command": "sleep 5"}}, submit])
    killer = Killer(sleeping)
    killer.start()
    [result] = Runner(agent, RunnerConfig(max_retries=2)).run([_spec("dead-1")])
    killer.stop.set()
    assert len(killer.killed) == 1
    assert result.attempts == 2 and len(result.infra_errors) == 1, result
    assert result.outcome == "success" and result.score == 1.0

    killer = Killer(sleeping)
    killer.start()
    [lost] = Runner(agent, RunnerConfig(max_retries=0)).run([_spec("dead-2")])
    killer.stop.set()
    assert lost.outcome == "infra_error" and lost.score is None and not lost.reward_valid
    summary = summarize([result, lost])
    assert summary["valid"] == 1 and summary["mean_score"] == 1.0  # the crash is not a 0
    assert summary["outcomes"] == {"infra_error": 1, "success": 1}


def test_evaluator_crash_is_retried_and_never_a_zero():
    """The evaluator's container is killed mid-grading: ``infra_error``, retried."""
    killer = Killer(evaluator())
    killer.start()
    [result] = Runner(GoldAgent(), RunnerConfig(max_retries=2)).run([_spec("crash-1")])
    killer.stop.set()
    assert len(killer.killed) == 1
    assert result.attempts == 2 and len(result.infra_errors) == 1, result
    assert result.outcome == "success" and result.score == 1.0


def test_time_limit_grades_the_work_done_and_waterlevel_tracks_phases():
    """The agent is stopped at its next step after the limit and the workspace is graded;
    a sampler sees the episode in the tool phase while its command runs."""
    task = get_task(TASK)
    *writes, _submit = gold_actions(task.gold_dir)
    script = [
        *writes,
        {"name": "bash", "arguments": {"command": "sleep 3"}},
        {"name": "list_dir", "arguments": {}},
    ]
    runner = Runner(ScriptedAgent(script), RunnerConfig(time_limit_s=2))
    seen, done = [], threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(runner.waterlevel.snapshot())
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    [result] = runner.run([_spec("limit-1")])
    done.set()
    sampler.join()
    assert result.end_reason == "time_limit", result
    assert result.outcome == "success" and result.score == 1.0  # graded at the limit
    assert [s["tool"] for s in result.trace][-2:] == ["bash", "submit"]
    assert max(s["tool"] for s in seen) == 1 and max(s["scoring"] for s in seen) == 1
    assert max(s["setup"] for s in seen) == 1
    final = runner.waterlevel.snapshot()
    assert all(final[k] == 0 for k in ("model", "tool", "scoring", "setup", "running"))
    t = result.times
    assert t["tool"] >= 2.5 and t["scoring"] > 0 and t["setup"] > 0
    assert sum(t[k] for k in ("setup", "model", "tool", "scoring", "agent")) == pytest.approx(
        t["wall"], rel=0.02
    )


def test_cancel_stops_running_episodes_and_frees_their_sandboxes():
    # A running command may finish before its sandbox closes (DockerSandbox.close waits
    # for the shell), so the command is short; the third episode must never start.
    script = [{"name": "bash", "arguments": {"command": "sleep 8"}}]
    runner = Runner(ScriptedAgent(script), RunnerConfig(parallel=2))
    specs = [_spec(f"cancel-{i}", t) for i, t in enumerate(["micro-lru-cache", TASK, TASK])]

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 60
        while runner.waterlevel.snapshot()["tool"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        runner.cancel()

    threading.Thread(target=cancel_when_running, daemon=True).start()
    start = time.monotonic()
    results = runner.run(specs)
    assert time.monotonic() - start < 40
    assert [r.outcome for r in results] == ["cancelled"] * 3
    assert results[2].message == "run cancelled before start"
    assert all(r.score is None for r in results)
    assert _mine() == []


def test_clock_nests_phases_and_rejects_unknown_ones():
    level = PhaseCounts()
    clock = EpisodeClock(level)
    with clock.phase("tool"):
        with clock.phase("model"):  # a sub-agent's model call inside a tool call
            assert level.snapshot()["model"] == 1 and level.snapshot()["tool"] == 0
            time.sleep(0.05)
        assert level.snapshot()["tool"] == 1
    with pytest.raises(ValueError, match="unknown phase"):
        with clock.phase("lunch"):
            pass
    totals = clock.close()
    assert totals["model"] >= 0.05 and totals["tool"] < totals["model"]
    assert level.snapshot()["agent"] == 0 and level.snapshot()["tool"] == 0


def test_episode_stuck_past_the_grace_is_killed_and_never_trained_on():
    """Blocked in a tool call past its time limit and the grace: the runner closes its
    env; nothing was graded, so the outcome is ``killed`` (reward unknown, not 0) and the
    episode is left out of GRPO advantages."""
    from gyre_env.trajectory.sampling import SampleConfig, group_advantages
    from gyre_env.trajectory.tree import TokenTree

    script = [{"name": "bash", "arguments": {"command": "sleep 60"}}]
    runner = Runner(ScriptedAgent(script), RunnerConfig(time_limit_s=1, hard_kill_grace_s=1))
    start = time.monotonic()
    [result] = runner.run([_spec("stuck-1")])
    assert time.monotonic() - start < 30
    assert result.outcome == "killed" and not result.reward_valid and result.score is None
    [info] = result.episode_infos(run="r")
    assert info.outcome == "killed"
    tree = TokenTree()
    tree.episodes = {
        "stuck-1": info,
        "ok-1": dataclasses.replace(info, session="ok-1", outcome="failure", reward=0.0),
        "ok-2": dataclasses.replace(info, session="ok-2", outcome="success", reward=1.0),
    }
    assert sorted(group_advantages(tree, SampleConfig())) == ["ok-1", "ok-2"]
