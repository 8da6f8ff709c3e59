"""``gyre bench`` end to end (real env, Docker sandboxes, grading), and what a killed bench
leaves behind. ``python -m gyre_env.bench`` is the same code as ``gyre bench``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gyre_env.bench import cli as bench_cli
from gyre_env.bench import select_tasks

pytestmark = pytest.mark.docker


def _containers_of(pid: int):
    from gyre_env.sandbox.docker import LABEL_KIND, docker_client

    # ignore_removed: docker-py lists, then inspects each container; one the bench (or a
    # reaper) removes in between is gone, not an error (as in ``sandbox.docker.reap``)
    return docker_client().containers.list(
        all=True, filters={"label": [LABEL_KIND, f"gyre.owner_pid={pid}"]}, ignore_removed=True
    )


@pytest.mark.slow
def test_gold_agent_scores_one_on_the_micro_tier(tmp_path, capsys):
    """The scripted gold agent through ``gyre bench`` solves every micro task; the JSON
    results, streamed JSONL and HTML report (three embedded plots) are written."""
    out = tmp_path / "bench"
    rc = bench_cli.main(
        [
            "--agent",
            "scripted",
            "--tasks",
            "micro",
            "--parallel",
            "3",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    summary = data["summary"]
    assert summary["episodes"] == summary["solved"] == summary["valid"] >= 6
    assert summary["mean_score"] == 1.0 and summary["outcomes"] == {"success": summary["episodes"]}
    assert all(
        r["score"] == 1.0 and r["total_reward"] == pytest.approx(1.0) for r in data["results"]
    )
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == summary["episodes"]
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    printed = capsys.readouterr().out
    assert "micro-lru-cache" in printed and "mean score 1.000" in printed


def test_task_selection_errors_name_the_problem():
    with pytest.raises(ValueError, match="did you mean 'micro-lru-cache'"):
        select_tasks("micro-lru-cach")
    assert {t.tier for t in select_tasks("micro")} == {"micro"}
    assert [t.id for t in select_tasks("micro-rational,micro-lru-cache")] == [
        "micro-lru-cache",
        "micro-rational",
    ]


def _start_bench(tmp_path, sleep_s: int) -> subprocess.Popen:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"name": "bash", "arguments": {"command": f"sleep {sleep_s}"}}]))
    cmd = [
        sys.executable,
        "-m",
        "gyre_env.bench",
        "--agent",
        "scripted",
        "--script",
        str(script),
        "--tasks",
        "micro-lru-cache,micro-rational",
        "--parallel",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while len([c for c in _containers_of(proc.pid) if c.status == "running"]) < 2:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the bench never started its sandboxes"
        time.sleep(0.2)
    time.sleep(0.5)  # the agents are inside their `sleep`
    return proc


def test_sigkilled_bench_leaves_nothing_after_the_reaper(tmp_path):
    """SIGKILL cannot be caught: the containers outlive the process until the reaper
    (``gyre sandbox gc``; also run when any later sandbox starts) removes them."""
    from gyre_env.sandbox.docker import reap

    proc = _start_bench(tmp_path, 60)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _containers_of(proc.pid)  # leaked until reaped
    reap()
    deadline = time.monotonic() + 15  # another process's reaper may be removing them too
    while (left := _containers_of(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
        reap()
    assert left == [], [(c.name, c.status) for c in left]


def test_sigterm_cancels_the_bench_and_closes_its_sandboxes(tmp_path):
    """SIGTERM cancels the run: episodes end, sandboxes are closed, exit status 130."""
    proc = _start_bench(tmp_path, 5)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=90)[0].decode()
    assert proc.returncode == 130, output[-3000:]
    assert time.monotonic() - start < 60
    assert _containers_of(proc.pid) == []
    assert not os.path.exists(tmp_path / "out" / "report.html")  # no report for a cancelled run


def test_langgraph_through_an_upstream_passthrough(tmp_path):
    """``--base-url``: the bench's proxy forwards the agent's calls to an OpenAI-compatible
    upstream (here another Gyre proxy serving a scripted policy: our own code, standing in
    for a hosted API) and records them; the policy writes the gold file and submits."""
    from gyre_env.engines.tiny import load_tokenizer
    from gyre_env.proxy.records import read_jsonl
    from gyre_env.proxy.scripted import ScriptedEngine
    from gyre_env.proxy.serving import ModelService, ModelServiceConfig
    from gyre_env.tasks import get_task

    tok = load_tokenizer()
    gold = (get_task("micro-lru-cache").gold_dir / "lru.py").read_text()

    def call(name, arguments):
        body = json.dumps({"name": name, "arguments": arguments})
        return f"<tool_call>\n{body}\n</tool_call><|im_end|>"

    def script(prompt_ids, params):
        done = "bytes to lru.py" in tok.decode(prompt_ids)
        text = (
            call("submit", {}) if done else call("write_file", {"path": "lru.py", "content": gold})
        )
        return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids

    upstream = ModelService(ModelServiceConfig(), engines=[ScriptedEngine(script)], tokenizer=tok)
    upstream.start()
    out = tmp_path / "bench"
    try:
        rc = bench_cli.main(
            [
                "--agent",
                "langgraph",
                "--tasks",
                "micro-lru-cache",
                "--out",
                str(out),
                "--no-progress",
                "--base-url",
                f"{upstream.proxy.base_url}/v1",
                "--model",
                "hosted-model",
                "--store",
                str(tmp_path / "store.db"),
                "--run",
                "pt",
            ]
        )
    finally:
        upstream.stop()
    assert rc == 0
    [result] = json.loads((out / "results.json").read_text())["results"]
    assert result["outcome"] == "success" and result["score"] == 1.0, result
    records = read_jsonl(out / "records.jsonl")
    assert len(records) == result["model_calls"] == 2
    assert {r.session for r in records} == {"micro-lru-cache.0"}
    from gyre_env.trajectory.store import TrajectoryStore
    from gyre_env.trajectory.tree import read_episodes_jsonl

    # episodes.jsonl says which records form a group (a task's repeats) and how they ended
    [info] = read_episodes_jsonl(out / "episodes.jsonl")
    assert (info.session, info.group, info.outcome, info.reward) == (
        "micro-lru-cache.0",
        "micro-lru-cache",
        "success",
        1.0,
    )

    store = TrajectoryStore(tmp_path / "store.db", readonly=True)
    [episode] = store.episodes(run="pt")
    assert (episode.session, episode.task, episode.outcome) == (
        "micro-lru-cache.0",
        "micro-lru-cache",
        "success",
    )
    assert episode.reward == 1.0
    # the write_file step followed call 0, the submit followed call 1: rewards sum to 1
    assert set(episode.step_rewards) == {0, 1}
    assert sum(episode.step_rewards.values()) == pytest.approx(1.0)
    assert len(list(store.records([episode.session]))) == 2
    store.close()


@pytest.mark.slow
def test_rollouts_example_runs(tmp_path):
    """``examples/rollouts.py`` with tiny budgets: LangGraph + tiny model + runner."""
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "rollouts.py")
    proc = subprocess.run(
        [
            sys.executable,
            example,
            "--episodes",
            "2",
            "--parallel",
            "2",
            "--max-steps",
            "2",
            "--max-new-tokens",
            "16",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "episodes 2, completed 2, valid 2" in proc.stdout
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == 2


def test_store_keeps_a_tasks_repeats_as_one_grpo_group(tmp_path):
    """``--repeats 2 --store``: both attempts of the task land in one group in the store
    and in episodes.jsonl, so trees read back from the store give nonzero group structure."""
    out, db = tmp_path / "bench", tmp_path / "store.db"
    rc = bench_cli.main(
        [
            "--agent", "langgraph", "--tasks", "micro-roman-numerals", "--repeats", "2",
            "--max-steps", "1", "--max-new-tokens", "8", "--out", str(out),
            "--store", str(db), "--run", "grp", "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0
    from gyre_env.trajectory.store import TrajectoryStore
    from gyre_env.trajectory.tree import read_episodes_jsonl

    with TrajectoryStore(db, readonly=True) as store:
        episodes = store.episodes(run="grp")
        assert {e.group for e in episodes} == {"micro-roman-numerals"}
        assert store.stats(run="grp").groups == 1
        [tree] = store.trees(run="grp")
        assert set(tree.episodes) == {"micro-roman-numerals.0", "micro-roman-numerals.1"}
    groups = {i.session: i.group for i in read_episodes_jsonl(out / "episodes.jsonl")}
    assert groups == {e.session: e.group for e in episodes}
