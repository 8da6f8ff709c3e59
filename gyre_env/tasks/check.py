"""Local preflight of task data: does the gold solution pass and an empty workspace fail?

This is a data-validation check, not the grader: it runs the task's test commands with
bash in a temporary folder on this machine, with no sandbox and no protection against
the workspace's code. Use it on trusted folders (gold solutions). Editable installs the
commands make go to a private ``PYTHONUSERBASE`` inside the temporary folder, so the
machine's Python environment is left untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gyre_env.tasks.task import Task


@dataclass(kw_only=True)
class TestCounts:
    """Counts read from JUnit XML reports."""

    __test__ = False  # not a pytest test class

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def collected(self) -> int:
        return self.passed + self.failed + self.errors + self.skipped


@dataclass(kw_only=True)
class PreflightResult:
    """One task run against one workspace (gold or empty)."""

    task_id: str
    workspace: str
    """``"gold"`` or ``"empty"``."""
    declared: int
    counts: TestCounts
    duration_s: float
    reports_missing: list[str] = field(default_factory=list)
    """Report paths a pytest command should have written but did not."""
    log: str = ""
    """Combined output of the commands (tail), for diagnosing failures."""

    @property
    def passed(self) -> int:
        return self.counts.passed

    @property
    def collected(self) -> int:
        return self.counts.collected

    @property
    def score(self) -> float:
        return min(1.0, self.counts.passed / self.declared)


def parse_junit(path: str | Path) -> TestCounts:
    """Count test cases in a pytest JUnit XML report by outcome.

    A collection error is reported by pytest as an errored test case, so it counts as
    collected-with-error, never as passed.
    """
    root = ET.parse(path).getroot()
    counts = TestCounts()
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        if "error" in tags:
            counts.errors += 1
        elif "failure" in tags:
            counts.failed += 1
        elif "skipped" in tags:
            counts.skipped += 1
        else:
            counts.passed += 1
    return counts


def run_preflight(
    task: Task, *, gold: bool = True, visible: bool = False, timeout_s: float | None = None
) -> PreflightResult:
    """Copy gold (or nothing) plus the hidden tests to a temp folder and run the tests.

    With ``visible=True`` the visible tests and their commands are used instead, the way
    the env's ``run_tests`` tool runs them in the agent's workspace.
    """
    if gold and task.gold_dir is None:
        raise ValueError(f"task {task.id!r} has no gold solution")
    if visible and not task.has_visible_tests:
        raise ValueError(f"task {task.id!r} has no visible tests")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"gyre-preflight-{task.id}-") as tmp:
        work = Path(tmp) / "workspace"
        reports = Path(tmp) / "reports"
        reports.mkdir()
        if gold:
            shutil.copytree(task.gold_dir, work, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            work.mkdir()
        if visible:
            shutil.copytree(task.visible_tests_dir, work, dirs_exist_ok=True)
            commands = task.visible_grading_commands(str(reports))
        else:
            for rel in task.remove_before_grading:
                _remove(work / rel)
            shutil.copytree(task.hidden_tests_dir, work, dirs_exist_ok=True)
            commands = task.grading_commands(str(reports))
        env = _isolated_env(Path(tmp))
        counts, missing, log = TestCounts(), [], []
        deadline = start + (timeout_s or task.grading_timeout_s)
        for cmd in commands:
            left = max(1.0, deadline - time.monotonic())
            log.append(_run(cmd.command, work, env, left))
            if cmd.junit_path is None:
                continue
            if not Path(cmd.junit_path).is_file():
                missing.append(cmd.junit_path)
                continue
            part = parse_junit(cmd.junit_path)
            counts.passed += part.passed
            counts.failed += part.failed
            counts.errors += part.errors
            counts.skipped += part.skipped
    return PreflightResult(
        task_id=task.id,
        workspace=("gold" if gold else "empty") + (" (visible tests)" if visible else ""),
        declared=task.test_count,
        counts=counts,
        duration_s=time.monotonic() - start,
        reports_missing=missing,
        log="\n".join(log)[-8000:],
    )


def _run(command: str, cwd: Path, env: dict[str, str], timeout: float) -> str:
    try:
        proc = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"$ {command}\n[timed out after {timeout:.0f}s]"
    return f"$ {command}\n[exit {proc.returncode}]\n{proc.stdout}{proc.stderr}"


def _isolated_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PIP_"))}
    env.pop("PYTHONPATH", None)
    env.update(
        PYTHONUSERBASE=str(tmp / "userbase"),
        PIP_USER="1",
        PIP_BREAK_SYSTEM_PACKAGES="1",
        PIP_NO_INPUT="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_ROOT_USER_ACTION="ignore",
        PIP_NO_INDEX="1",  # the preflight never needs the network
        PYTHONDONTWRITEBYTECODE="1",
        # Hidden tests use plain pytest; plugins installed on this machine only slow it.
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    return env


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@dataclass(kw_only=True)
class TaskCheck:
    """The full preflight verdict for one task."""

    task: Task
    gold: PreflightResult | None
    empty: PreflightResult
    visible: PreflightResult | None = None
    """The gold solution against the visible tests, for tasks that have them."""
    require_gold: bool = True
    """A task without a gold solution fails the check (else only the empty run counts)."""

    @property
    def problems(self) -> list[str]:
        """Why the task fails the preflight; empty when it passes."""
        out = []
        if self.gold is None:
            if self.require_gold:
                out.append("no gold solution")
        else:
            if self.gold.score < 1.0:
                out.append(f"gold scores {self.gold.score:.3f} ({self.gold.passed} passed)")
            if self.gold.collected != self.task.test_count:
                out.append(
                    f"declared {self.task.test_count} tests but {self.gold.collected} collected"
                )
            if self.gold.reports_missing:
                out.append(f"gold run wrote no report: {self.gold.reports_missing}")
        if self.empty.score > 0.0:
            out.append(f"empty workspace scores {self.empty.score:.3f}")
        v = self.visible
        if v is not None and (v.passed == 0 or v.passed != v.collected or v.reports_missing):
            out.append(f"gold passes {v.passed} of {v.collected} visible tests")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems


def check_task(task: Task, *, require_gold: bool = True) -> TaskCheck:
    """Run the gold and the empty-workspace preflight of one task.

    ``require_gold=False`` accepts a task without gold (NL2Repo tasks): the empty run
    still catches a leak, e.g. the project's own package already installed.
    """
    has_gold = task.gold_dir is not None
    gold = run_preflight(task, gold=True) if has_gold else None
    visible = run_preflight(task, visible=True) if has_gold and task.has_visible_tests else None
    empty = run_preflight(task, gold=False)
    return TaskCheck(task=task, gold=gold, empty=empty, visible=visible, require_gold=require_gold)


def check_tasks(
    tasks: list[Task], *, workers: int | None = None, require_gold: bool = True
) -> list[TaskCheck]:
    """``check_task`` over many tasks in parallel (the work is subprocesses), in order."""
    workers = workers or min(8, max(2, (os.cpu_count() or 2) * 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda t: check_task(t, require_gold=require_gold), tasks))
