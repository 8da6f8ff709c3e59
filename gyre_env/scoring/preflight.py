"""Preflight of task data: does the gold solution score 1.0 and an empty workspace 0?

The preflight grades the way episodes are graded, so a task that passes here scores the
same in an env: the gold (or an empty) workspace goes through ``grade_workspace`` (a
fresh evaluator sandbox from the task's image, the hidden tests, ``GradingResult``), and
the gold against the visible tests goes through ``run_visible_tests`` in an agent
sandbox, as the ``run_tests`` tool runs them. The sandbox backend is chosen like the
env's: ``auto`` (``$GYRE_SANDBOX``, else Docker, else bubblewrap, else local), or named.
In Docker and bubblewrap nothing runs in the Python that runs ``gyre``, so a virtualenv
there changes nothing; the local backend isolates nothing (``gyre_env.sandbox.local``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gyre_env.sandbox import SandboxConfig, SandboxError, choose_backend, make_sandbox
from gyre_env.scoring import (
    GradingConfig,
    GradingResult,
    TestCounts,
    VisibleRun,
    grade_sandbox,
    grade_workspace,
    run_visible_tests,
)
from gyre_env.tasks.task import Task, TaskSetupError


def run_preflight(task: Task, *, gold: bool = True, backend: str = "auto") -> GradingResult:
    """Grade the task's gold solution (or an empty workspace) with the episodes' grader.

    No control run: a grading run that fails is reported as it is, never retried on gold.
    A run whose evaluator died (``infra_error``: the daemon, the host, another process
    killing it) says nothing of the task, so it is graded once more, as an episode's
    grade would be; a second ``infra_error`` is reported, with both reasons.
    """
    config = GradingConfig(backend=backend, control_run=False)
    if gold and task.gold_dir is None and task.solution_script is not None:
        return run_solution(task, config)
    if gold and task.gold_dir is None:
        raise ValueError(f"task {task.id!r} has no gold solution")
    # "Empty" is the workspace an episode starts from: a SWE task's repository unchanged.
    workspace = task.gold_dir if gold else task.workspace_dir
    first = grade_workspace(task, workspace, config)
    if first.status != "infra_error":
        return first
    again = grade_workspace(task, workspace, config)
    if again.status == "infra_error" and again.reason != first.reason:
        again.reason = f"{again.reason} (and before, once: {first.reason})"
    return again


def run_solution(task: Task, config: GradingConfig) -> GradingResult:
    """Run the task's solution script in an agent sandbox set up as an episode's, then
    grade that sandbox's workspace as an episode's is graded."""
    try:
        sandbox = make_sandbox(SandboxConfig(image=task.image), config.backend)
    except Exception as e:  # no daemon, missing image: nothing the solution did
        reason = f"could not start a sandbox: {type(e).__name__}: {e}"
        return GradingResult(
            status="infra_error", score=0.0, declared=task.test_count, reason=reason
        )
    try:
        task.prepare_workspace(sandbox)
        script = task.solution_script.read_text(encoding="utf-8")
        sandbox.write_file(".gyre-solve.sh", script)
        run = sandbox.exec("bash .gyre-solve.sh; s=$?; rm -f .gyre-solve.sh; exit $s", timeout=900)
        if not run.ok:
            reason = f"{task.solution_script} failed (exit {run.exit_code}): {run.output[-2000:]}"
            return GradingResult(
                status="infra_error", score=0.0, declared=task.test_count, reason=reason
            )
        return grade_sandbox(task, sandbox, config)
    except (TaskSetupError, SandboxError, OSError) as e:
        reason = f"the solution's sandbox failed: {type(e).__name__}: {e}"
        return GradingResult(
            status="infra_error", score=0.0, declared=task.test_count, reason=reason
        )
    finally:
        sandbox.close()


def run_visible_preflight(task: Task, *, backend: str = "auto") -> VisibleRun:
    """Run the visible tests against the gold solution in an agent sandbox, set up as the
    env sets one up (visible tests, then ``setup_commands``, then the agent's files)."""
    if task.gold_dir is None or not task.has_visible_tests:
        raise ValueError(f"task {task.id!r} needs a gold solution and visible tests")
    try:
        sandbox = make_sandbox(SandboxConfig(image=task.image), backend)
    except Exception as e:  # no daemon, missing image: reported like the grader reports it
        return _visible_failure(f"could not start a sandbox: {type(e).__name__}: {e}")
    try:
        task.prepare_workspace(sandbox)
        sandbox.put_dir(str(task.gold_dir), ".")
        return run_visible_tests(sandbox, task)
    except TaskSetupError as e:
        return _visible_failure(str(e), e.output)
    except (SandboxError, OSError) as e:
        return _visible_failure(f"the sandbox failed: {type(e).__name__}: {e}")
    finally:
        sandbox.close()


def _visible_failure(problem: str, output: str = "") -> VisibleRun:
    return VisibleRun(counts=TestCounts(), problems=[problem], output=output[-8000:])


@dataclass(kw_only=True)
class TaskCheck:
    """The full preflight verdict for one task."""

    task: Task
    gold: GradingResult | None
    empty: GradingResult
    visible: VisibleRun | None = None
    """The gold solution against the visible tests, for tasks that have them."""
    require_gold: bool = True
    """A task without a gold solution fails the check (else only the empty run counts)."""

    @property
    def problems(self) -> list[str]:
        """Why the task fails the preflight; empty when it passes."""
        out = []
        gold, empty, visible = self.gold, self.empty, self.visible
        if gold is None:
            if self.require_gold:
                out.append("no gold solution")
        elif not gold.valid:
            out.append(f"gold not graded: {gold.reason}")
        else:
            if gold.score < 1.0:
                out.append(f"gold scores {gold.score:.3f} ({gold.passed} passed)")
            if gold.collected != self.task.test_count:
                out.append(f"declared {self.task.test_count} tests but {gold.collected} collected")
            if gold.status != "ok":
                out.append(f"gold run: {gold.reason}")
        if not empty.valid:
            out.append(f"empty workspace not graded: {empty.reason}")
        elif empty.score > 0.0:
            out.append(f"empty workspace scores {empty.score:.3f}")
        if visible is not None:
            c = visible.counts
            if c.passed == 0 or c.passed != c.collected or visible.problems:
                out.append(
                    f"gold passes {c.passed} of {c.collected} visible tests"
                    + "".join(f"; {p}" for p in visible.problems)
                )
        return out

    @property
    def ok(self) -> bool:
        return not self.problems


def check_task(task: Task, *, require_gold: bool = True, backend: str = "auto") -> TaskCheck:
    """Grade the gold, the gold against the visible tests, and an empty workspace.

    ``require_gold=False`` accepts a task without gold (NL2Repo tasks): the empty run
    still catches a leak, e.g. the project's own package already in the image.
    """
    has_gold = task.has_gold
    gold = run_preflight(task, gold=True, backend=backend) if has_gold else None
    visible = None
    if task.gold_dir is not None and task.has_visible_tests:
        visible = run_visible_preflight(task, backend=backend)
    empty = run_preflight(task, gold=False, backend=backend)
    return TaskCheck(task=task, gold=gold, empty=empty, visible=visible, require_gold=require_gold)


def check_tasks(
    tasks: list[Task],
    *,
    workers: int | None = None,
    require_gold: bool = True,
    backend: str = "auto",
) -> list[TaskCheck]:
    """``check_task`` over many tasks in parallel (the work is in sandboxes), in order."""
    backend = choose_backend(backend)  # once, not once per sandbox
    workers = workers or min(8, max(2, (os.cpu_count() or 2) * 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(
            pool.map(lambda t: check_task(t, require_gold=require_gold, backend=backend), tasks)
        )
