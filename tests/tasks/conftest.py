"""Fixtures for the task tests: a small synthetic NL2RepoBench checkout."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

SPEC = """## Project Introduction

Build `mini`, a package with `double(x)`.

## Environment Configuration

### Python Version

The Python version used in the current project is: Python 3.12.4

### Core Dependency Library Versions

```Plain
Package        Version
-------------- -------
attrs          23.1.0
pip            21.0.1
setuptools     53.0.0
# Test framework (a comment, not a heading)
requests>=2.31
flake8 >= 3.7.9, != 4.0   # spaces and a trailing comment
pre - commit >= 2.0.1
colorama                  # a bare name
Some_Pkg[extra]: 1.0
json>=2.0.9
python-mini>=0.1
Core dependencies
mini           0.1      /workspace
```

## Project Architecture

numpy 1.0 here is prose and must not count.
"""

MINI_TESTS = {
    "tests/test_mini.py": "from mini import double\n\n"
    "def test_double():\n    assert double(2) == 4\n\n"
    "def test_zero():\n    assert double(0) == 0\n",
    "tests/data/sample.txt": "x\n",
}


def _task_dir(root: Path, name: str, spec: str | None, tests: list[str], count: int) -> None:
    d = root / "test_files" / name
    d.mkdir(parents=True)
    if spec is None:
        (d / "start.md.download_failed.txt").write_text("download failed")
    else:
        (d / "start.md").write_text(spec)
    (d / "test_case_count.txt").write_text(f"{count}\n")
    (d / "test_commands.json").write_text(
        json.dumps(["pip install -e .", "pytest --continue-on-collection-errors tests"])
    )
    (d / "test_files.json").write_text(json.dumps(tests))


def _sdist(path: Path, top: str, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A checkout with three tasks: one from an sdist, one from a folder, one broken."""
    repo = tmp_path / "NL2RepoBench"
    _task_dir(repo, "mini", SPEC, ["tests"], 2)
    _task_dir(repo, "Other_Lib", "# Other\n\nNo dependency section.\n", ["test_other.py"], 1)
    _task_dir(repo, "pdfplumber-stable", None, ["tests"], 10)
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    _sdist(
        upstream / "mini-0.1.tar.gz",
        "mini-0.1",
        {
            **MINI_TESTS,
            "mini/__init__.py": "def double(x):\n    return 2 * x\n",
            "pyproject.toml": "[project]\nname='mini'\n",
        },
    )
    (upstream / "other-lib").mkdir()
    (upstream / "other-lib" / "test_other.py").write_text("def test_x():\n    pass\n")
    return repo, upstream


@pytest.fixture
def nl2repo_spec() -> str:
    """The spec of the checkout's "mini" task, with a dependency section."""
    return SPEC
