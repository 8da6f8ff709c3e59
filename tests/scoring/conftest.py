"""Fixtures of the grader tests (helpers live in ``calc_task.py``)."""

from __future__ import annotations

import pytest
from calc_task import PARTIAL, PYPROJECT, TASK_TOML_PIP, make_calc_task, write_tree


@pytest.fixture
def calc_task(tmp_path):
    return make_calc_task(tmp_path / "calc-task")


@pytest.fixture
def calc_pip_task(tmp_path):
    return make_calc_task(tmp_path / "calc-pip-task", TASK_TOML_PIP)


@pytest.fixture
def partial_ws(tmp_path):
    """A workspace passing 1 of the 4 hidden tests."""
    ws = tmp_path / "ws"
    write_tree(ws, {"calc.py": PARTIAL, "pyproject.toml": PYPROJECT})
    return ws
