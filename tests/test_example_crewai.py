"""The CrewAI example (``examples/crewai_crew.py``) smoke-tested on real parts: CrewAI's own
agents and LLM client, the proxy, a Docker sandbox, hidden-test grading, the store.

CrewAI pins ``openai<3`` (through ``instructor``), older than the ``openai`` the rest of
the suite uses, so it lives in its own virtualenv on top of this Python's packages
(``.ci/setup`` makes it at ``$GYRE_CREWAI_PYTHON``, default ``/opt/gyre-crewai``): these
tests run the example and this file's ``__main__`` driver with that interpreter. In CI a
missing CrewAI fails; elsewhere it skips, naming the install.

The scripted run's policy is our ScriptedEngine (a model that writes the ReAct text a
capable model would, so the crew's tool calls are deterministic); the other run uses the
random tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "crewai_crew.py"
CREWAI_VENV = "/opt/gyre-crewai"


def crewai_python() -> str:
    """An interpreter that imports both CrewAI and this checkout's gyre_env."""
    for python in (
        sys.executable,
        os.environ.get("GYRE_CREWAI_PYTHON"),
        f"{CREWAI_VENV}/bin/python",
    ):
        if not python or not os.path.exists(python):
            continue
        probe = subprocess.run(
            [python, "-c", "import crewai, gyre_env; print(gyre_env.__file__)"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if probe.returncode == 0 and Path(probe.stdout.strip()).is_relative_to(ROOT):
            return python
    message = (
        "CrewAI is not installed for this checkout: make a virtualenv with "
        "--system-site-packages and pip install 'gyre-env[crewai]' there (see .ci/setup), "
        "or set GYRE_CREWAI_PYTHON"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.slow
@pytest.mark.docker
def test_scripted_crew_solves_the_task_with_env_tools(tmp_path):
    """The engineer writes the gold file with the env's ``write_file``, the reviewer runs
    ``run_tests``; the runner grades 1.0. Every call is a record of the one episode, the
    engineer's ``main``, the reviewer's ``sub-agent``, each agent on branches of its own,
    and the store's token tree of the episode holds both roles' sampled tokens."""
    _run([crewai_python(), __file__, "scripted", str(tmp_path)], cwd=tmp_path)
    out = json.loads((tmp_path / "summary.json").read_text())
    assert out["outcome"] == "success" and out["score"] == 1.0, out
    assert out["tools"] == ["write_file", "run_tests", "submit"], out
    calls = out["calls"]
    assert [c["agent"] for c in calls] == ["engineer", "engineer", "reviewer", "reviewer"]
    assert all(
        c["role"] == {"engineer": "main", "reviewer": "sub-agent"}[c["agent"]] for c in calls
    )
    assert len({c["session"] for c in calls}) == 1
    by_agent = {
        a: {c["branch"] for c in calls if c["agent"] == a} for a in ("engineer", "reviewer")
    }
    assert not by_agent["engineer"] & by_agent["reviewer"], by_agent
    assert out["trees"] == 1 and set(out["sampled_roles"]) == {"main", "sub-agent"}
    assert out["model_seconds"] > 0


@pytest.mark.slow
@pytest.mark.docker
def test_example_runs_with_the_tiny_model(tmp_path):
    """``python examples/crewai_crew.py`` as a user runs it (the random tiny model, tiny
    budgets): it ends, the episode is graded, and both agents' calls are in the store."""
    proc = _run(
        [crewai_python(), str(EXAMPLE), "--out", str(tmp_path / "out"), "--max-iter", "2",
         "--max-new-tokens", "16"],
        cwd=tmp_path,
    )  # fmt: skip
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("micro-lru-cache: ") and "roles ['main', 'sub-agent']" in last, last
    assert (tmp_path / "out" / "store.db").is_file()


# ---------------------------------------------------------------- driver (CrewAI's venv)


def _scripted_episode(out: Path) -> None:
    """Run one crew episode against a ScriptedEngine; write what the test checks."""
    import importlib.util

    from gyre_env.engines.tiny import load_tokenizer
    from gyre_env.proxy.scripted import ScriptedEngine
    from gyre_env.proxy.serving import ModelService, ModelServiceConfig
    from gyre_env.runner import StoreResultSink
    from gyre_env.tasks import get_task
    from gyre_env.trajectory.store import TrajectoryStore

    spec = importlib.util.spec_from_file_location("crewai_crew", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    sys.modules["crewai_crew"] = example  # dataclasses look their module up
    spec.loader.exec_module(example)

    gold = (get_task("micro-lru-cache").gold_dir / "lru.py").read_text()
    tok = load_tokenizer()
    agents_of: dict[int, str] = {}

    def reply(prompt: str) -> str:
        agent = "reviewer" if "You are reviewer" in prompt else "engineer"
        agents_of[len(agents_of)] = agent
        if prompt.count("<|im_start|>assistant") > 1:  # the tool's observation is back
            return f"Thought: I now know the final answer\nFinal Answer: {agent} done."
        if agent == "engineer":
            args = json.dumps({"path": "lru.py", "content": gold})
            return f"Thought: I write the module.\nAction: write_file\nAction Input: {args}"
        return "Thought: I run the tests.\nAction: run_tests\nAction Input: {}"

    def script(prompt_ids, params):
        text = reply(tok.decode(prompt_ids)) + "<|im_end|>"
        return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids

    store = TrajectoryStore(out / "store.db")
    service = ModelService(
        ModelServiceConfig(records_path=str(out / "records.jsonl")),
        engines=[ScriptedEngine(script)],
        tokenizer=tok,
        sinks=(store,),
    ).start()
    try:
        result = example.run_episode(
            service,
            "micro-lru-cache",
            "crew-scripted",
            example.CrewConfig(max_iter=4),
            sink=StoreResultSink(store, run="crewai"),
        )
    finally:
        service.stop()
    with TrajectoryStore(out / "store.db", readonly=True) as store:
        records = sorted(store.records([result.episode_id]), key=lambda r: r.call_index)
        trees = store.trees(run="crewai")
    sampled_roles = sorted({n.role for t in trees for n in t.nodes if n.sampled})
    summary = {
        "outcome": result.outcome,
        "score": result.score,
        "tools": [s["tool"] for s in result.trace],
        "calls": [
            {
                "agent": agents_of[r.call_index],
                "role": r.role,
                "branch": r.branch,
                "session": r.session,
            }
            for r in records
        ],
        "trees": len(trees),
        "model_seconds": result.times["model"],
        "sampled_roles": sampled_roles,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["scripted"]:
        _scripted_episode(Path(sys.argv[2]))
