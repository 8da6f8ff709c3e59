"""The task folder format, its validation, the grading-command contract and the registry."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gyre_env.tasks import (
    SUITES,
    TaskFormatError,
    UnknownNameError,
    get_task,
    is_pytest_command,
    load_suite,
    load_task,
    register_suite,
)

TOML = """
id = "tiny"
tier = "micro"
domain = "numerics"
test_commands = ["python -m pytest -q tests/test_tiny.py"]
test_count = 2
"""


def make_task(root: Path, toml: str = TOML, *, gold: bool = True, visible: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "spec.md").write_text("# Tiny\n\nWrite `tiny.py` with `double(x)`.\n")
    (root / "task.toml").write_text(textwrap.dedent(toml))
    tests = root / "hidden_tests" / "tests"
    tests.mkdir(parents=True, exist_ok=True)
    (tests / "test_tiny.py").write_text(
        "from tiny import double\n\ndef test_a():\n    assert double(1) == 2\n\n"
        "def test_b():\n    assert double(0) == 0\n"
    )
    if gold:
        (root / "gold").mkdir(exist_ok=True)
        (root / "gold" / "tiny.py").write_text("def double(x):\n    return 2 * x\n")
    if visible:
        (root / "visible_tests").mkdir(exist_ok=True)
        (root / "visible_tests" / "test_visible.py").write_text("def test_v():\n    pass\n")
    return root


def test_load_minimal_task_defaults(tmp_path):
    task = load_task(make_task(tmp_path / "tiny"))
    assert (task.id, task.tier, task.domain, task.title) == ("tiny", "micro", "numerics", "tiny")
    assert task.hidden_test_paths == ["tests/test_tiny.py"]  # derived from the overlay
    assert task.hidden_tests_dir == (tmp_path / "tiny" / "hidden_tests").resolve()
    assert task.gold_dir == (tmp_path / "tiny" / "gold").resolve()
    assert task.image == "gyre-base:latest" and task.max_steps == 100
    assert task.visible_test_paths == [] and task.visible_tests_dir is None
    assert task.spec_words == 6  # "#", "Tiny", "Write", "`tiny.py`", "with", "`double(x)`."
    assert task.source == str((tmp_path / "tiny").resolve())


def test_visible_tests_get_a_default_command(tmp_path):
    task = load_task(make_task(tmp_path / "tiny", visible=True))
    assert task.visible_test_paths == ["test_visible.py"]
    assert task.visible_test_commands == ["python -m pytest -q test_visible.py"]
    assert task.has_visible_tests


def test_no_gold_is_allowed(tmp_path):
    assert load_task(make_task(tmp_path / "t", gold=False)).gold_dir is None


@pytest.mark.parametrize(
    "extra,match",
    [
        ("tset_count = 3\n", r"unknown keys \['tset_count'\]"),
        ('max_steps = "many"\n', "'max_steps' must be int"),
        ("max_steps = true\n", "'max_steps' must be int"),
        ("requirements = [1, 2]\n", "'requirements' must be a list of strings"),
        ('hidden_tests = ["tests/missing.py"]\n', "tests/missing.py' not found"),
        ('remove_before_grading = ["../outside"]\n', "must be a relative path"),
        ("wall_clock_s = -1\n", "wall_clock_s: must be > 0"),
        ('python_version = "3"\n', "python_version: expected major.minor"),
    ],
)
def test_invalid_toml_is_rejected_with_a_clear_error(tmp_path, extra, match):
    root = make_task(tmp_path / "bad", TOML + extra)
    with pytest.raises(TaskFormatError, match=match):
        load_task(root)


@pytest.mark.parametrize(
    "old,new,match",
    [
        ('tier = "micro"', 'tier = "huge"', "tier: 'huge' is not one of"),
        ('id = "tiny"', 'id = "has space"', "id: bad id"),
        ("test_count = 2", "test_count = 0", "test_count: must be > 0"),
        ('domain = "numerics"\n', "", "missing required key 'domain'"),
        ("test_count = 2", "test_count = [", "invalid TOML"),
    ],
)
def test_bad_values(tmp_path, old, new, match):
    root = make_task(tmp_path / "bad", TOML.replace(old, new))
    with pytest.raises(TaskFormatError, match=match):
        load_task(root)


def test_missing_files(tmp_path):
    with pytest.raises(TaskFormatError, match="not a folder"):
        load_task(tmp_path / "nowhere")
    root = make_task(tmp_path / "t")
    (root / "spec.md").unlink()
    with pytest.raises(TaskFormatError, match="no spec.md"):
        load_task(root)


def test_grading_commands_contract(tmp_path):
    toml = TOML.replace(
        'test_commands = ["python -m pytest -q tests/test_tiny.py"]',
        'test_commands = ["python -m pip install -e .", "pytest -q tests", '
        '"cd sub && pytest --junitxml={junitxml} x", "python3 -m pytest a b"]',
    )
    task = load_task(make_task(tmp_path / "t", toml))
    cmds = task.grading_commands("/r")
    assert [(c.command, c.junit_path) for c in cmds] == [
        ("python -m pip install -e .", None),
        ("pytest -q tests --junitxml=/r/hidden-1.xml", "/r/hidden-1.xml"),
        ("cd sub && pytest --junitxml=/r/hidden-2.xml x", "/r/hidden-2.xml"),
        ("python3 -m pytest a b --junitxml=/r/hidden-3.xml", "/r/hidden-3.xml"),
    ]


@pytest.mark.parametrize(
    "cmd,expected",
    [
        ("pytest", True),
        ("python -m pytest -q t", True),
        ("python3.11 -m pytest", True),
        ("pytest a; rm -rf x", False),
        ("echo pytest", False),
        ("python -m pip install .", False),
        ("pytest 'unclosed", False),
    ],
)
def test_is_pytest_command(cmd, expected):
    assert is_pytest_command(cmd) is expected


def test_folder_suite_and_duplicate_ids(tmp_path):
    make_task(tmp_path / "suite" / "b")
    make_task(tmp_path / "suite" / "a", TOML.replace('id = "tiny"', 'id = "other"'))
    assert [t.id for t in load_suite(tmp_path / "suite")] == ["other", "tiny"]
    make_task(tmp_path / "suite" / "c")
    with pytest.raises(TaskFormatError, match=r"duplicate task ids \['tiny'\]"):
        load_suite(str(tmp_path / "suite"))


def test_registry_entry_points_are_lazy(tmp_path, monkeypatch):
    """Registering imports nothing; the module is imported when the suite is loaded."""
    make_task(tmp_path / "data" / "tiny")
    module = tmp_path / "my_suite_mod.py"
    module.write_text(
        "from gyre_env.tasks import load_task\nLOADS = []\n"
        f"def load(scale=1):\n    LOADS.append(scale)\n"
        f"    return [load_task({str(tmp_path / 'data' / 'tiny')!r})]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    register_suite("mine", "my_suite_mod:load", description="test", overwrite=True)
    register_suite("broken", "no_such_module_xyz:load", overwrite=True)
    try:
        import sys

        assert "my_suite_mod" not in sys.modules
        assert [t.id for t in load_suite("mine", scale=3)] == ["tiny"]
        assert sys.modules["my_suite_mod"].LOADS == [3]
        with pytest.raises(ModuleNotFoundError):
            load_suite("broken")
        with pytest.raises(ValueError, match="already registered"):
            register_suite("mine", "x:y")
        register_suite("folder", tmp_path / "data", overwrite=True)
        assert [t.id for t in load_suite("folder")] == ["tiny"]
    finally:
        for name in ("mine", "broken", "folder"):
            SUITES.pop(name, None)


def test_did_you_mean(tmp_path):
    with pytest.raises(UnknownNameError, match="Did you mean 'builtin'"):
        load_suite("bultin")
    with pytest.raises(UnknownNameError, match="Did you mean 'micro-lru-cache'"):
        get_task("micro-lru-cahce")
    assert str(UnknownNameError("plain")) == "plain"
