"""The NL2RepoBench loader against a small synthetic checkout built in tmp_path."""

from __future__ import annotations

import pytest

from gyre_env.scoring.preflight import run_preflight
from gyre_env.tasks import TaskFormatError, load_suite
from gyre_env.tasks.nl2repo import (
    NL2RepoSkipWarning,
    load_nl2repo,
    offline_pip,
    parse_spec_python_version,
    parse_spec_requirements,
)


def test_loads_tasks_and_skips_missing_spec_with_warning(checkout, tmp_path):
    repo, upstream = checkout
    with pytest.warns(NL2RepoSkipWarning, match="pdfplumber-stable.*download"):
        tasks = load_nl2repo(repo, upstream, cache_dir=tmp_path / "cache")
    assert [t.id for t in tasks] == ["Other_Lib", "mini"]
    mini = tasks[1]
    assert mini.tier == "repo" and mini.test_count == 2
    assert mini.spec.startswith("## Project Introduction")
    # only the test paths were taken from the sdist, never the implementation
    assert mini.hidden_test_paths == ["tests/data/sample.txt", "tests/test_mini.py"]
    assert not (mini.hidden_tests_dir / "mini").exists()
    assert mini.test_commands[0] == "pip install --no-build-isolation --no-deps -e ."
    assert mini.remove_before_grading == ["tests", "conftest.py"]
    assert mini.image == "gyre-nl2repo-mini:latest" and mini.python_version == "3.12"
    assert "python-mini>=0.1" not in mini.requirements  # its own distribution
    other = tasks[0]
    assert other.hidden_test_paths == ["test_other.py"] and other.requirements == []


def test_spec_dependency_section_becomes_requirements(nl2repo_spec):
    """Real specs mix pip-list lines, specifiers, comments and prose (see conftest's SPEC).

    Left out: tooling (pip, setuptools), stdlib names (json), prose, an editable line,
    and, given the project, its own distribution (python-mini for task "mini").
    """
    common = [
        "attrs==23.1.0",
        "requests>=2.31",
        "flake8>=3.7.9,!=4.0",
        "pre-commit>=2.0.1",
        "colorama",
        "Some_Pkg[extra]==1.0",
    ]
    assert parse_spec_requirements(nl2repo_spec, project="mini") == common
    assert parse_spec_requirements(nl2repo_spec) == [*common, "python-mini>=0.1"]
    assert parse_spec_requirements("# Nothing here\n") == []
    assert parse_spec_python_version(nl2repo_spec) == "3.12"
    assert parse_spec_python_version("Python Python 3.9.23") is None


def test_other_heading_spellings_and_optional_subsections():
    spec = (
        "## Dependency Library Configuration\n\nprose\n\n"
        "### Versions of Core Dependent Libraries\n\n"
        "#### Main\n- pkg-a==1.0\n#### Optional Dependencies [all]\n- pkg-b==2.0\n"
        "#### Testing\n- pytest>=8\n### Next section\n- pkg-c==3.0\n"
    )
    assert parse_spec_requirements(spec) == ["pkg-a==1.0", "pytest>=8"]


def test_requirements_file_wins_over_spec(checkout, tmp_path):
    repo, upstream = checkout
    reqs = tmp_path / "reqs"
    reqs.mkdir()
    (reqs / "mini.txt").write_text("# pinned by hand\nattrs==22.2.0\n--index-url x\n")
    (task,) = load_nl2repo(
        repo, upstream, requirements=reqs, cache_dir=tmp_path / "c", only=["mini"]
    )
    assert task.requirements == ["attrs==22.2.0"]


def test_missing_tests_skips_task_and_nothing_loadable_is_an_error(checkout, tmp_path):
    repo, _ = checkout
    empty = tmp_path / "none"
    empty.mkdir()
    with pytest.warns(
        NL2RepoSkipWarning,
        match=r"2 NL2Repo task\(s\) skipped: no upstream tests .*: Other_Lib, mini",
    ):
        with pytest.raises(TaskFormatError, match="no NL2Repo task could be loaded"):
            load_nl2repo(repo, empty, cache_dir=tmp_path / "c")


def test_bad_checkout_and_malformed_tasks(tmp_path, checkout):
    """Malformed task files skip the task with a warning; strict=True raises instead."""
    with pytest.raises(TaskFormatError, match="not an NL2RepoBench checkout"):
        load_nl2repo(tmp_path / "nowhere", {}, cache_dir=tmp_path / "c")
    repo, upstream = checkout
    (repo / "test_files" / "mini" / "test_case_count.txt").write_text("many")
    with pytest.raises(TaskFormatError, match="test_case_count.txt"):
        load_nl2repo(repo, upstream, cache_dir=tmp_path / "c", only=["mini"], strict=True)
    (repo / "test_files" / "Other_Lib" / "test_files.json").write_text('["test_gone.py"]')
    with pytest.warns(NL2RepoSkipWarning) as record:
        with pytest.raises(TaskFormatError, match="no NL2Repo task could be loaded"):
            load_nl2repo(repo, upstream, cache_dir=tmp_path / "c")
    messages = [str(w.message) for w in record]
    assert any("'mini' skipped" in m and "test_case_count.txt" in m for m in messages)
    assert any("'Other_Lib' skipped" in m and "'test_gone.py' not found" in m for m in messages)


def test_offline_pip_rewrite():
    assert offline_pip("pip install -e .") == "pip install --no-build-isolation --no-deps -e ."
    assert offline_pip("python -m pip install --no-deps .") == (
        "python -m pip install --no-build-isolation --no-deps ."
    )
    assert offline_pip("pytest tests") == "pytest tests"


@pytest.mark.slow
def test_registered_suite_and_preflight_scores_upstream_solution(checkout, tmp_path):
    """The loaded task grades a workspace: the upstream solution passes, empty fails."""
    repo, upstream = checkout
    with pytest.warns(NL2RepoSkipWarning):
        tasks = load_suite("nl2repo", checkout=repo, tests=upstream, cache_dir=tmp_path / "c")
    mini = next(t for t in tasks if t.id == "mini")
    solution = tmp_path / "solution"
    (solution / "mini").mkdir(parents=True)
    (solution / "mini" / "__init__.py").write_text("def double(x):\n    return 2 * x\n")
    (solution / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "mini"\nversion = "0.1"\n'
        '[tool.setuptools]\npackages = ["mini"]\n'
    )
    mini.gold_dir = solution
    # The local backend, as in the env tests: the task's own image is never built here.
    gold = run_preflight(mini, gold=True, backend="local")
    assert (gold.status, gold.passed, gold.collected, gold.score) == ("ok", 2, 2, 1.0), gold
    empty = run_preflight(mini, gold=False, backend="local")
    assert empty.valid and empty.passed == 0 and empty.score == 0.0


def test_overlay_is_reused_and_never_changed_in_place(checkout, tmp_path):
    """A second load reuses the hidden-test folder; a changed source gets a new one and
    the folder an earlier Task points at stays as it was."""
    repo, upstream = checkout
    cache = tmp_path / "cache"
    (first,) = load_nl2repo(repo, upstream, cache_dir=cache, only=["Other_Lib"])
    (again,) = load_nl2repo(repo, upstream, cache_dir=cache, only=["Other_Lib"])
    assert again.hidden_tests_dir == first.hidden_tests_dir
    (upstream / "other-lib" / "test_other.py").write_text("def test_y():\n    pass\n")
    (changed,) = load_nl2repo(repo, upstream, cache_dir=cache, only=["Other_Lib"])
    assert changed.hidden_tests_dir != first.hidden_tests_dir
    assert "test_x" in (first.hidden_tests_dir / "test_other.py").read_text()
    assert "test_y" in (changed.hidden_tests_dir / "test_other.py").read_text()
