"""The final grader's verdicts (ok / workspace_error / infra_error) and the incremental Φ."""

from __future__ import annotations

import dataclasses
import time

import pytest
from calc_task import GOLD, TASK_TOML, make_calc_task, write_tree

from gyre_env.sandbox.local import LocalSandbox
from gyre_env.scoring import GradingConfig, PotentialConfig, PotentialScorer, grade_workspace

LOCAL = GradingConfig(backend="local", pytest_plugins=[])  # this host has many plugins


def test_gold_scores_one_and_empty_scores_zero(calc_task):
    gold = grade_workspace(calc_task, calc_task.gold_dir, LOCAL)
    assert (gold.status, gold.score, gold.passed, gold.count_mismatch) == ("ok", 1.0, 4, False)
    empty = grade_workspace(calc_task, None, LOCAL)
    assert (empty.status, empty.score) == ("ok", 0.0)
    assert empty.count_mismatch  # one collection error instead of 4 cases: reported


def test_hanging_workspace_is_the_agents_failure(calc_task, tmp_path):
    """Tests that hang are scored against the workspace, not turned into infra_error."""
    ws = write_tree(tmp_path / "hang", {"calc.py": "import time\ntime.sleep(600)\n"})
    start = time.monotonic()
    result = grade_workspace(calc_task, ws, dataclasses.replace(LOCAL, timeout_s=4))
    assert time.monotonic() - start < 60
    assert result.status == "workspace_error" and result.valid and result.score == 0.0
    assert "timed out" in result.reason and result.control.status == "ok"


def test_crashing_interpreter_is_the_agents_failure(calc_task, tmp_path):
    ws = write_tree(tmp_path / "crash", {"calc.py": "import os\nos.kill(os.getpid(), 9)\n"})
    result = grade_workspace(calc_task, ws, LOCAL)
    assert (result.status, result.score) == ("workspace_error", 0.0), result.reason


def test_grader_failing_on_gold_too_is_infra_error(tmp_path):
    broken = TASK_TOML.replace(
        '"python -m pytest -q tests"', '"python -m pytest --no-such-flag tests"'
    )
    task = make_calc_task(tmp_path / "t", broken)
    result = grade_workspace(task, task.gold_dir, LOCAL)
    assert result.status == "infra_error" and not result.valid and result.score == 0.0
    assert "gold" in result.reason


def test_unstartable_evaluator_is_infra_error(calc_task):
    task = dataclasses.replace(calc_task, image="gyre-no-such-image:never")
    result = grade_workspace(task, task.gold_dir, GradingConfig(backend="docker"))
    assert result.status == "infra_error" and "evaluator" in result.reason


@pytest.fixture
def sandbox():
    box = LocalSandbox()
    yield box
    box.close()


def test_potential_parts_and_incremental_recheck(sandbox, calc_task):
    scorer = PotentialScorer.for_sandbox(sandbox, calc_task)
    assert scorer.ruff, "ruff must be found in the sandbox"
    assert scorer.update().phi == 0.0
    sandbox.write_file("calc.py", GOLD)
    sandbox.write_file("broken.py", "def f(:\n")
    sandbox.write_file("lint.py", "def g():\n    return undefined_name\n")
    p = scorer.update()
    assert (p.files, p.rechecked) == (3, 3)
    assert p.syntax == pytest.approx(2 / 3) and p.lint == pytest.approx(1 / 3)
    assert p.phi == pytest.approx(0.1 * 2 / 3 + 0.1 * 1 / 3)
    assert scorer.update().rechecked == 0  # nothing changed: no file re-checked
    sandbox.write_file("broken.py", "def f():\n    pass\n")
    p = scorer.update()
    assert p.rechecked == 1 and p.syntax == 1.0
    sandbox.exec("rm lint.py")
    p = scorer.update()
    assert (p.files, p.syntax, p.lint, p.phi) == (2, 1.0, 1.0, pytest.approx(0.2))
    sandbox.exec(f"rm -f {scorer.manifest}.old")  # lost state: a full, consistent recheck
    assert scorer.update().rechecked == 2 and scorer.current.phi == p.phi


def test_non_incremental_rechecks_every_file(sandbox, calc_task):
    cfg = PotentialConfig(incremental=False)
    scorer = PotentialScorer.for_sandbox(sandbox, calc_task, cfg)
    for i in range(5):
        sandbox.write_file(f"m{i}.py", "x = 1\n")
    assert scorer.update().rechecked == 5
    assert scorer.update().rechecked == 5


def test_editable_install_with_a_renamed_package_folder(calc_pip_task, tmp_path):
    """setuptools installs such a package through an import-hook .pth, which the grader
    never runs; it reads the hook's mapping as data and imports from the mapped folder."""
    ws = write_tree(
        tmp_path / "renamed",
        {
            "code/calc_impl/__init__.py": GOLD,
            "pyproject.toml": PYPROJECT_RENAMED,
        },
    )
    result = grade_workspace(calc_pip_task, ws, LOCAL)
    assert (result.status, result.score) == ("ok", 1.0), result.commands[-1].output


PYPROJECT_RENAMED = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "calc"
version = "0.1"

[tool.setuptools]
packages = ["calc"]
package-dir = {"calc" = "code/calc_impl"}
"""


def test_memoize_reuses_identical_workspaces_only(calc_task, tmp_path, monkeypatch):
    """``memoize``: a byte-identical workspace of the same task is graded once (also when
    graded concurrently); any changed byte, file name or mode grades again; an
    infra_error is never kept."""
    from concurrent.futures import ThreadPoolExecutor

    from calc_task import PARTIAL

    from gyre_env.scoring import final

    monkeypatch.setattr(final, "_MEMO", final._Memo())
    runs = []
    real = final._grade_once

    def counted(task, ws, config):
        runs.append(ws)
        return real(task, ws, config)

    monkeypatch.setattr(final, "_grade_once", counted)
    memo = dataclasses.replace(LOCAL, memoize=True)
    copies = [write_tree(tmp_path / f"ws{i}", {"calc.py": PARTIAL}) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda ws: grade_workspace(calc_task, ws, memo), copies))
    assert len(runs) == 1
    assert {(r.status, r.score) for r in results} == {("ok", 0.25)}
    assert sum(r.reused for r in results) == 3
    assert final._MEMO.hits == 3 and final._MEMO.misses == 1

    gold = write_tree(tmp_path / "gold", {"calc.py": GOLD})
    assert grade_workspace(calc_task, gold, memo).score == 1.0  # other bytes: graded
    renamed = write_tree(tmp_path / "renamed", {"calc2.py": PARTIAL})
    assert grade_workspace(calc_task, renamed, memo).score == 0.0  # other name: graded
    (copies[0] / "calc.py").chmod(0o600)
    assert grade_workspace(calc_task, copies[0], memo).reused is False  # other mode
    assert len(runs) == 4
    assert grade_workspace(calc_task, copies[1], LOCAL).reused is False  # memo off: graded
    assert len(runs) == 5

    broken = dataclasses.replace(calc_task, image="gyre-no-such-image:never")
    off = dataclasses.replace(memo, backend="docker")
    first = grade_workspace(broken, copies[2], off)
    assert first.status == "infra_error"
    assert grade_workspace(broken, copies[2], off).reused is False  # retried, not kept


PLUGINS_CHECK = """
import types


def test_plugins(pytestconfig):
    plugins = pytestconfig.pluginmanager.get_plugins()
    names = [p.__name__ for p in plugins if isinstance(p, types.ModuleType)]
    outside = [n for n in names if not n.startswith(("_pytest", "pytest.", "tests", "test_"))]
    assert outside == WANTED, outside
"""


@pytest.mark.parametrize("plugins", [[], ["pytest_timeout"]])
def test_visible_tests_load_the_plugins_the_grader_loads(tmp_path, sandbox, plugins):
    """``run_tests`` runs the visible tests with the grader's ``pytest_plugins`` and no
    other: ``[]`` is plain pytest. This host has several plugins (hypothesis, langsmith,
    xdist, ...); autoloaded, they cost seconds of imports per ``run_tests`` in a
    bubblewrap sandbox, which shares the host's Python."""
    from gyre_env.scoring.visible import run_visible_tests

    check = PLUGINS_CHECK.replace("WANTED", repr(plugins))
    toml = TASK_TOML + (
        'visible_tests = ["tests/test_visible.py"]\n'
        'visible_test_commands = ["python -m pytest -q tests/test_visible.py"]\n'
    )
    write_tree(tmp_path / "t", {"visible_tests/tests/test_visible.py": check})
    task = make_calc_task(tmp_path / "t", toml)
    sandbox.write_file("tests/test_visible.py", check)
    run = run_visible_tests(sandbox, task, timeout_s=60, plugins=plugins)
    assert (run.counts.passed, run.counts.collected, run.problems) == (1, 1, []), run.render()
