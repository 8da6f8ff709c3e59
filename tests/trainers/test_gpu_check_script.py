"""``benchmarks/gpu/check.py`` (the one GPU script of issue 35) run as ``--smoke`` on CPU:
the scripts it drives still print what it parses (a format drift would turn a GPU run's
figures into FAIL lines only once a device is lent), and a check that fails prints a FAIL
line with its log while the rest still run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "check.py"


@pytest.mark.slow
def test_smoke_run_parses_every_figure_of_the_scripts_it_drives(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(CHECK), "--smoke", "--out", str(tmp_path), "--only", "switch", "tree", "engine"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    # a figure parsed is the point, not its verdict: a loaded machine (a parallel test
    # run) can take the tree's speed-up under its target, and then the exit status is 1
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr[-3000:]
    figures = [x.split(" ", 1)[1] for x in lines if x[:5] in ("PASS ", "FAIL ")]
    assert any(
        x.startswith("switch round trip (tiny): ") and " s; -> TRAINING" in x for x in figures
    ), lines
    assert any(x.startswith("tree vs flat: ") and "of an ideal" in x for x in figures), lines
    assert any(x.startswith("INFO engine tokens/s: ") for x in lines), lines
    assert (tmp_path / "switch.log").is_file() and (tmp_path / "tree-vs-flat.log").is_file()


def test_a_check_whose_command_fails_is_a_fail_line_and_the_run_goes_on(tmp_path, monkeypatch):
    sys.path.insert(0, str(CHECK.parent))
    import check

    c = check.Checks()
    monkeypatch.setattr(check, "BENCH", tmp_path)  # no scripts there: each one exits 2
    args = type("A", (), {"smoke": True, "timeout": 60})
    check.check_switch(c, args, tmp_path, {})
    check.check_tree(c, args, tmp_path, None)
    assert [(s, n) for s, n, _ in c.rows] == [
        ("FAIL", "switch round trip (tiny)"),
        ("FAIL", "tree vs flat"),
    ]
    assert "exit 2" in c.rows[0][2] and "see switch.log" in c.rows[0][2]
    assert "No such file" in (tmp_path / "switch.log").read_text()
