"""The built-in suite: its shape, and the gold preflight over every task.

The preflight is real: each task's gold solution and an empty workspace are graded by
the episodes' grader (``grade_workspace``, in a fresh sandbox of the default backend),
so this test proves every gold scores 1.0, every empty workspace scores 0.0, and every
declared test count is what pytest collects.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import time

import pytest

from gyre_env.scoring.preflight import check_task, check_tasks
from gyre_env.tasks import builtin_suite_dir, load_suite, load_task
from gyre_env.tasks.task import tomllib

SUITE = load_suite("builtin")
BY_TIER = {tier: [t for t in SUITE if t.tier == tier] for tier in ("micro", "small", "repo")}


def test_suite_shape():
    assert len(SUITE) >= 12
    assert len(BY_TIER["micro"]) >= 6 and len(BY_TIER["small"]) >= 4 and len(BY_TIER["repo"]) >= 2
    assert {t.domain for t in SUITE} >= {
        "parsing",
        "data-structures",
        "text",
        "cli",
        "concurrency",
        "numerics",
    }
    for t in BY_TIER["micro"]:
        assert 8 <= t.test_count <= 15, t.id
    for t in BY_TIER["small"]:
        assert 20 <= t.test_count <= 60, t.id
    for t in BY_TIER["repo"]:
        assert t.test_count >= 80 and t.spec_words >= 1500, t.id
    assert all(t.gold_dir is not None for t in SUITE)


def _imports(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("task", SUITE, ids=lambda t: t.id)
def test_gold_uses_only_the_stdlib_and_installs_with_setuptools(task):
    own = {p.name for p in task.gold_dir.iterdir() if p.is_dir()}
    own |= {p.stem for p in task.gold_dir.glob("*.py")}
    for py in task.gold_dir.rglob("*.py"):
        third_party = set(_imports(py)) - set(sys.stdlib_module_names) - own
        assert not third_party, f"{py} imports {third_party}"
    for test in task.hidden_tests_dir.rglob("*.py"):
        extra = set(_imports(test)) - set(sys.stdlib_module_names) - own - {"pytest"}
        assert not extra, f"{test} imports {extra}"
    pyproject = task.gold_dir / "pyproject.toml"
    if task.tier == "micro":
        assert not pyproject.exists()
        assert not any("pip install" in c for c in task.test_commands)
    else:
        meta = tomllib.loads(pyproject.read_text())
        assert meta["build-system"]["build-backend"] == "setuptools.build_meta"
        assert not meta["project"].get("dependencies")
        assert any("--no-build-isolation --no-deps -e ." in c for c in task.test_commands)


@pytest.mark.slow
def test_whole_suite_preflight():
    """Every gold scores 1.0, every empty workspace 0.0, declared == collected."""
    start = time.monotonic()
    results = check_tasks(SUITE)
    took = time.monotonic() - start
    problems = {r.task.id: r.problems for r in results if not r.ok}
    assert not problems, problems
    for r in results:
        assert r.gold.score == 1.0 and r.gold.collected == r.task.test_count == r.gold.passed
        assert r.empty.score == 0.0 and r.empty.passed == 0
        if r.task.has_visible_tests:
            assert r.visible.counts.passed == r.visible.counts.collected > 0
    assert sum(r.visible is not None for r in results) >= 2  # the env's run_tests has data
    print(f"\nwhole-suite preflight ({len(SUITE)} tasks, gold + empty): {took:.1f}s")


def test_preflight_catches_broken_gold_and_wrong_count(tmp_path):
    """The check can fail: a gold with a bug and a wrong declared count are reported."""
    root = tmp_path / "lru"
    shutil.copytree(builtin_suite_dir() / "micro-lru-cache", root)
    gold = root / "gold" / "lru.py"
    gold.write_text(gold.read_text().replace("self.hits += 1", "self.hits += 2"))
    toml = root / "task.toml"
    toml.write_text(toml.read_text().replace("test_count = 12", "test_count = 13"))
    result = check_task(load_task(root))
    assert not result.ok
    assert result.gold.passed == 11 and result.gold.counts.failed == 1
    assert "gold scores" in " ".join(result.problems)
    assert "declared 13 tests but 12 collected" in result.problems


@pytest.mark.slow
def test_partial_solution_gets_partial_credit(tmp_path):
    """Hidden tests are split by module and run with --continue-on-collection-errors, so
    a half-built package earns a partial score (the reward arrives before the end):
    minikv with only its tokenizer, formatter and glob matcher passes exactly the
    protocol and glob tests."""
    task = load_task(builtin_suite_dir() / "repo-minikv")
    assert all("--continue-on-collection-errors" in c for c in task.test_commands if "pytest" in c)
    partial = tmp_path / "partial"
    shutil.copytree(task.gold_dir, partial)
    for module in ("store", "session", "persist", "cli", "__main__"):
        (partial / "minikv" / f"{module}.py").unlink()
    task.gold_dir = partial
    result = check_task(task).gold
    expected = _count_cases(task, ["tests/test_protocol.py", "tests/test_globmatch.py"], tmp_path)
    assert 0 < result.passed == expected < task.test_count
    assert result.counts.errors == 3  # the three test files that cannot import their module
    assert 0.0 < result.score < 1.0


def _count_cases(task, files, tmp_path):
    """How many test cases pytest collects from some hidden test files (gold workspace)."""
    work = tmp_path / "count"
    shutil.copytree(task.hidden_tests_dir, work)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=work,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(builtin_suite_dir() / "repo-minikv" / "gold")},
        timeout=120,
    ).stdout
    return sum("::" in line for line in out.splitlines())
