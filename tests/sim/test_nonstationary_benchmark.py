"""``benchmarks/waterlevel_nonstationary.py --waterlevel NAME=VALUE``: a setting is read as
a ``[policies.waterlevel]`` table is, and a bad one stops the benchmark before any run,
naming what was wrong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "waterlevel_nonstationary.py"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("admit_ahead=1", "unknown key 'policies.waterlevel.admit_ahead'"),
        ("admit_ahead_batches=x", "policies.waterlevel.admit_ahead_batches must be int"),
        ("admit_ahead_room=-1", "must be >= 0: admit_ahead_room = -1.0"),
        ("enabled=false", "always runs the waterlevel"),
        ("novalue", "expected NAME=VALUE"),
    ],
)
def test_a_bad_waterlevel_setting_is_refused_by_name_before_any_run(setting, message):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--waterlevel", setting],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert message in proc.stderr and "runs," not in proc.stderr  # no run was planned


def test_waterlevel_settings_are_the_tables_own_types():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from waterlevel_nonstationary import waterlevel_settings
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert waterlevel_settings([]) is None
    got = waterlevel_settings(["admit_ahead_batches=1", "admit_ahead_room=1"])
    assert got == (("admit_ahead_batches", 1), ("admit_ahead_room", 1.0))
    assert isinstance(got[1][1], float)


def test_the_elastic_benchmark_takes_the_same_settings_for_its_waterlevel():
    """``benchmarks/elastic.py --waterlevel``: the real cells' run of the policy with a
    setting (read by the same parser), and a bad one refused before the model loads."""
    import argparse

    elastic = SCRIPT.parent / "elastic.py"
    proc = subprocess.run(
        [sys.executable, str(elastic), "--only", "waterlevel", "--waterlevel", "admit_ahead=1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "unknown key 'policies.waterlevel.admit_ahead'" in proc.stderr
    assert "2 cells" not in proc.stdout  # stopped before the run's header
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from elastic import _policies
    finally:
        sys.path.remove(str(SCRIPT.parent))
    args = argparse.Namespace(
        max_batch_growth=1.0, waterlevel_settings=(("admit_ahead_batches", 1),)
    )
    policy = _policies(args)["waterlevel"]()
    assert policy.admit_ahead_batches == 1 and policy.max_batch_growth == 1.0
    args.waterlevel_settings = (("max_batch_growth", 2.0),)  # the setting wins
    assert _policies(args)["waterlevel"]().max_batch_growth == 2.0
