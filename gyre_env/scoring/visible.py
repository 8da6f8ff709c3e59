"""Visible tests: run in the agent's own sandbox, for the ``run_tests`` tool and for Φ.

These runs give feedback and shaping only; nothing here is tamper-proof (the agent can
edit the visible tests). Like the grader, only cases from the visible test files count.
"""

from __future__ import annotations

import base64
import secrets
import shlex
import time
from dataclasses import dataclass, field

from gyre_env.scoring.junit import JUnitError, TestCounts, parse_junit, select_cases
from gyre_env.tasks import Task

PYTEST_ADDOPTS = "-o junit_family=xunit1 -p no:cacheprovider"


def visible_env(plugins: list[str] | None = None) -> dict[str, str]:
    """The environment of a visible test command: pytest loads the plugins the grader
    loads (``GradingConfig.pytest_plugins``). None: every installed one (pytest's own
    autoload; the grader's default loads the image's). A list: those modules and no other,
    so ``[]`` is plain pytest. In bubblewrap the sandbox's Python is the host's, whose
    plugins (hypothesis, langsmith, ...) cost 4 s of imports per run on this project's CI
    machine against 0.3 s for a nano task's tests."""
    if plugins is None:
        return {"PYTEST_ADDOPTS": PYTEST_ADDOPTS}
    addopts = " ".join([PYTEST_ADDOPTS, *(f"-p {shlex.quote(m)}" for m in plugins)])
    return {"PYTEST_ADDOPTS": addopts, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@dataclass(kw_only=True)
class VisibleRun:
    """The result of the visible test commands."""

    counts: TestCounts
    problems: list[str] = field(default_factory=list)
    """Commands that timed out or wrote no (readable) report."""
    output: str = ""
    """Tail of the commands' output (shown only when no report explains the result)."""

    @property
    def pass_fraction(self) -> float:
        return self.counts.passed / self.counts.collected if self.counts.collected else 0.0

    def render(self) -> str:
        """A deterministic text summary for the agent: counts, then each non-passing case.
        Not cut here: the env cuts the ``run_tests`` observation to its one output limit."""
        c = self.counts
        lines = [
            f"Visible tests: {c.passed} passed, {c.failed} failed, {c.errors} errors, "
            f"{c.skipped} skipped ({c.collected} collected)."
        ]
        lines += [f"Problem: {p}" for p in self.problems]
        for case in c.cases:
            if case.outcome in ("failed", "error"):
                lines.append(f"\n{case.outcome.upper()} {case.display_name}\n{case.message}")
        if self.problems and self.output:
            lines.append("\nOutput (tail):\n" + self.output[-4000:])
        return "\n".join(lines)


def run_visible_tests(
    sandbox, task: Task, timeout_s: float = 300.0, *, plugins: list[str] | None = None
) -> VisibleRun:
    """Run ``task.visible_test_commands`` in the workspace and read their reports
    (``plugins``: see ``visible_env``).

    ``timeout_s`` bounds all the commands together: each gets what is left of it, and the
    sandbox kills a command at its timeout with everything it started, so a run lasts
    ``timeout_s`` plus the sandbox's few seconds of cleanup, whatever the tests do."""
    deadline = time.monotonic() + timeout_s
    report_dir = f"/tmp/gyre-visible-{secrets.token_hex(6)}"
    env = visible_env(plugins)
    sandbox.exec(f"mkdir -p {report_dir}", timeout=30)
    cases, problems, outputs = [], [], []
    try:
        for cmd in task.visible_grading_commands(report_dir):
            left = deadline - time.monotonic()
            if left <= 0:
                problems.append(f"`{cmd.command}` not run: the {timeout_s:.0f}s were used up")
                continue
            result = sandbox.exec(cmd.command, timeout=left, env=env)
            outputs.append(f"$ {cmd.command}\n{result.output}")
            if result.timed_out:
                problems.append(f"`{cmd.command}` timed out after {timeout_s:.0f}s")
            if cmd.junit_path is None:
                continue
            raw = sandbox.exec(f"base64 -w0 {cmd.junit_path} 2>/dev/null", timeout=60)
            if raw.exit_code != 0:
                problems.append(f"`{cmd.command}` wrote no report (exit {result.exit_code})")
                continue
            try:
                cases += parse_junit(base64.b64decode(raw.stdout))
            except (JUnitError, ValueError) as e:
                problems.append(f"`{cmd.command}` wrote an unreadable report: {e}")
    finally:
        sandbox.exec(f"rm -rf {report_dir}", timeout=30)
    counts = TestCounts.of(select_cases(cases, task.visible_test_paths))
    return VisibleRun(counts=counts, problems=problems, output="\n".join(outputs)[-8000:])
