"""Tests marked ``docker``/``bwrap`` skip on a developer machine without them, and FAIL in CI.

Runs pytest in a subprocess on a two-test file with Docker and bubblewrap made unreachable
(``DOCKER_HOST`` pointing nowhere, ``PATH`` without ``bwrap``), once with ``CI`` unset and
once with ``CI=true``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import pytest

@pytest.mark.docker
def test_needs_docker():
    pass

@pytest.mark.bwrap
def test_needs_bwrap():
    pass
"""


@pytest.mark.parametrize(("ci", "expected"), [("", "2 skipped"), ("true", "2 error")])
def test_missing_docker_and_bwrap_skip_locally_and_fail_in_ci(tmp_path, ci, expected):
    probe = tmp_path / "test_probe.py"
    probe.write_text(_PROBE)
    env = {
        **os.environ,
        "CI": ci,
        "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock",
        "PATH": os.path.dirname(sys.executable),  # no bwrap here
        "PYTHONPATH": str(ROOT / "tests"),  # `-p conftest` loads tests/conftest.py
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # other installed plugins cost seconds
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "pytest_timeout",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(probe)],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert expected in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (proc.returncode != 0) == bool(ci)
    if ci:
        assert "CI must provide a Docker daemon" in proc.stdout
        assert "CI must provide bubblewrap" in proc.stdout
