"""Fixtures of the env tests (helpers live in ``nl2repo_task.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nl2repo_task import make_task_dir


@pytest.fixture(scope="session")
def task_dir(tmp_path_factory) -> Path:
    return make_task_dir(tmp_path_factory.mktemp("tasks") / "calc")
