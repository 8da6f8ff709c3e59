"""The preflight (``gyre_env.scoring.preflight``): from a fresh virtualenv, and when it cannot grade.

The preflight grades in sandboxes, so the Python that runs ``gyre`` does not matter. A
plain virtualenv is the case that broke when the preflight ran the task's commands on
the host (issue 14): pip refuses ``--user`` installs there, so ``pip install -e .`` failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gyre_env.scoring.preflight import check_task
from gyre_env.tasks import builtin_suite_dir, load_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_check_from_a_fresh_virtualenv(tmp_path):
    """A task whose gold and visible tests `pip install -e .` passes from a plain venv."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    python = venv / "bin" / "python"
    # The condition of the report: no user site in this venv, so pip refuses --user.
    user_site = subprocess.run(
        [python, "-c", "import site; print(site.ENABLE_USER_SITE)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert user_site.stdout.strip() == "False"
    install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*install, "-e", f"{ROOT}[docker]"], check=True, timeout=600)
    # An activated venv: its python and pip come first on PATH, as in a user's shell.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{env['PATH']}")
    proc = subprocess.run(
        [venv / "bin" / "gyre", "tasks", "check", "--task", "small-todo-cli"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "PASS small-todo-cli: gold 30/30 passed, 30 collected; empty 0/30; visible 2/2" in out
    assert "1 passed, 0 failed" in out


@pytest.mark.docker
def test_a_task_that_cannot_be_graded_fails_the_check_and_says_why(tmp_path):
    """A missing image is an infra error of every run, reported, never a low score."""
    root = tmp_path / "lru"
    shutil.copytree(builtin_suite_dir() / "micro-lru-cache", root)
    task = load_task(root)
    task.image = "gyre-never-built:x"
    result = check_task(task, backend="docker")
    assert not result.ok and result.gold.status == result.empty.status == "infra_error"
    assert [p.split(":")[0] for p in result.problems] == [
        "gold not graded",
        "empty workspace not graded",
        "gold passes 0 of 0 visible tests; could not start a sandbox",
    ]
    assert all("gyre-never-built:x" in p for p in result.problems)


def test_a_grading_run_whose_evaluator_died_is_graded_once_more(monkeypatch, tmp_path):
    """An evaluator killed under the preflight (exit 137 in CI, with another worker's
    sandboxes beside it) is infrastructure, not the task: the run is graded again once,
    and only a second death is reported. Stand-in grader: no sandbox needed."""
    from gyre_env.scoring import preflight
    from gyre_env.scoring.final import GradingResult

    task = load_task(builtin_suite_dir() / "micro-lru-cache")
    died = GradingResult(status="infra_error", score=0.0, declared=3, reason="evaluator died")
    ok = GradingResult(status="ok", score=0.0, declared=3, reason="")
    runs = []

    def grade(task, workspace, config):
        runs.append(workspace)
        return [died, ok][len(runs) - 1] if len(runs) <= 2 else died

    monkeypatch.setattr(preflight, "grade_workspace", grade)
    assert preflight.run_preflight(task, gold=False).status == "ok" and len(runs) == 2
    runs.clear()
    monkeypatch.setattr(preflight, "grade_workspace", lambda *a: runs.append(1) or died)
    result = preflight.run_preflight(task, gold=False)
    assert result.status == "infra_error" and len(runs) == 2  # once more, not forever
