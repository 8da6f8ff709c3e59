"""Scoring: the interim potential Φ, the final hidden-test score, rewards and outcomes.

- ``interim``: Φ from syntax, lint and visible tests, recomputed incrementally.
- ``final``: hidden tests in a fresh evaluator sandbox, tamper-proof, with blame
  assignment (``ok`` / ``workspace_error`` / ``infra_error``).
- ``rewards``: the ``potential``, ``interim`` and ``sparse`` reward modes.
- ``junit``: JUnit XML parsing restricted to a task's own test files.

An episode ends with one of ``OUTCOMES``:

- ``success``: submitted, final score >= the env's success threshold (1.0 by default);
- ``failure``: submitted with a lower score (a failed ``pip install`` whose tests then
  fail is a failure: the reports were written);
- ``timeout``: the step or wall-clock limit cut the episode (``truncated=True``); the work
  done is graded like a submission;
- ``agent_error``: submitted, and the workspace broke grading itself (no report: the
  interpreter crashed, the tests hung) while the grader works on the gold workspace;
  scored, and the score is valid;
- ``infra_error``: a failure outside the agent's reach (dead sandbox, missing image, a
  grader that fails on the gold workspace too); ``reward_valid`` is False;
- ``cancelled``: never from the env itself: the runner cancelled the episode (a stopped
  run) and did not grade it;
- ``killed``: never from the env itself: the episode did not stop within the runner's
  grace after its time limit (blocked in a tool call), so the runner closed its env and
  nothing was graded. Its reward is unknown, not 0: like ``infra_error`` and
  ``cancelled`` it stays in the store and out of training.

Training leaves ``infra_error`` and ``cancelled`` episodes out (``SampleConfig``).
"""

from __future__ import annotations

from gyre_env.scoring.final import (
    CommandRun,
    GradingConfig,
    GradingResult,
    grade_sandbox,
    grade_workspace,
)
from gyre_env.scoring.interim import Potential, PotentialConfig, PotentialScorer
from gyre_env.scoring.junit import JUnitError, TestCase, TestCounts, parse_junit, select_cases
from gyre_env.scoring.rewards import GRID, REWARD_MODES, RewardTracker, quantize
from gyre_env.scoring.visible import VisibleRun, run_visible_tests

OUTCOMES = ("success", "failure", "timeout", "agent_error", "infra_error", "cancelled", "killed")
"""Every way an episode ends (the one definition; the runner and the store use it)."""

__all__ = [
    "GRID",
    "OUTCOMES",
    "REWARD_MODES",
    "CommandRun",
    "GradingConfig",
    "GradingResult",
    "JUnitError",
    "Potential",
    "PotentialConfig",
    "PotentialScorer",
    "RewardTracker",
    "TestCase",
    "TestCounts",
    "VisibleRun",
    "grade_sandbox",
    "grade_workspace",
    "parse_junit",
    "quantize",
    "run_visible_tests",
    "select_cases",
]
