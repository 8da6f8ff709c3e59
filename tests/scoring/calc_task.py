"""Helpers for grader tests. A tiny installable task (``calc``) for grader tests: 4 hidden tests; the ``partial``
workspace passes exactly one of them (score 0.25), the gold one passes all four."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

from gyre_env.scoring import parse_junit
from gyre_env.tasks import load_task

HIDDEN = """
from calc import add, div, mul, sub

def test_add():
    assert add(2, 3) == 5

def test_sub():
    assert sub(5, 3) == 2

def test_mul():
    assert mul(4, 3) == 12

def test_div():
    assert div(8, 2) == 4
"""

GOLD = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b\n"
)
PARTIAL = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return 0\n\n"
    "def mul(a, b):\n    return 0\n\ndef div(a, b):\n    return 0\n"
)

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "calc"
version = "0.1"

[tool.setuptools]
py-modules = ["calc"]
"""

TASK_TOML = """
id = "calc"
tier = "micro"
domain = "numerics"
test_commands = ["python -m pytest -q tests"]
hidden_tests = ["tests/test_calc.py"]
test_count = 4
max_steps = 10
grading_timeout_s = 60
"""

# The same task, installed first the way NL2RepoBench tasks are.
TASK_TOML_PIP = TASK_TOML.replace(
    'test_commands = ["python',
    'test_commands = ["pip install --no-build-isolation --no-deps -e .", "python',
)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n") if rel.endswith(".toml") else text)
    return root


def make_calc_task(root: Path, toml: str = TASK_TOML, with_gold: bool = True):
    write_tree(
        root,
        {
            "task.toml": toml,
            "spec.md": "Write calc.py with add, sub, mul, div.\n",
            "hidden_tests/tests/test_calc.py": HIDDEN,
        },
    )
    if with_gold:
        write_tree(root / "gold", {"calc.py": GOLD, "pyproject.toml": PYPROJECT})
    return load_task(root)


def naive_score(task, ws: Path, tmp: Path, autoload: bool = False) -> float:
    """Run the task's commands the naive way (plain bash and pytest in a copy of ``ws``,
    a private user site for ``pip install``) and count every case. ``autoload``: let pytest
    load installed plugins (slow on a machine with many; only the entry-point trick needs it)."""
    work = tmp / "naive"
    shutil.copytree(ws, work)
    shutil.copytree(task.hidden_tests_dir, work, dirs_exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PIP_"))}
    env.update(
        PYTHONUSERBASE=str(tmp / "naive-userbase"),
        PIP_USER="1",
        PIP_NO_INDEX="1",
        PIP_BREAK_SYSTEM_PACKAGES="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    if not autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    (tmp / "naive-reports").mkdir()
    passed = 0
    for cmd in task.grading_commands(str(tmp / "naive-reports")):
        subprocess.run(
            ["bash", "-c", cmd.command], cwd=work, env=env, capture_output=True, timeout=120
        )
        if cmd.junit_path and Path(cmd.junit_path).is_file():
            cases = parse_junit(Path(cmd.junit_path).read_bytes())
            passed += sum(c.outcome == "passed" for c in cases)
    return min(1.0, passed / task.test_count)
