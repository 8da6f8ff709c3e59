"""Runs /app/wordcount.py on files written here and compares with what wc would print."""

import subprocess
import sys

import pytest

CASES = [
    ("one line\n", "1 2 9"),
    ("no newline", "0 2 10"),
    ("a  b\t\tc\n\nd\n", "3 4 11"),
    ("", "0 0 0"),
    ("héllo wörld\n", "1 2 12"),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_counts(tmp_path, text, expected):
    path = tmp_path / "input.txt"
    path.write_text(text, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "/app/wordcount.py", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == expected


def test_script_kept_its_name():
    assert subprocess.run([sys.executable, "/app/wordcount.py", "/dev/null"]).returncode == 0
