"""Reward modes (the potential return equals the final score exactly) and JUnit parsing."""

from __future__ import annotations

import random

import pytest

from gyre_env.scoring import GRID, JUnitError, RewardTracker, parse_junit, quantize, select_cases


def test_potential_return_equals_final_score_exactly():
    """Any potentials, any score passed/declared: sum(rewards) == score, bit for bit."""
    rng = random.Random(0)
    for _ in range(3000):
        declared = rng.randint(1, 500)
        score = quantize(min(1.0, rng.randint(0, declared + 3) / declared))
        tracker = RewardTracker("potential")
        rewards = [
            tracker.step(rng.random() * 0.5 if rng.random() < 0.8 else None)
            for _ in range(rng.randint(0, 40))
        ]
        rewards.append(tracker.final(score))
        assert sum(rewards) == score
        assert sum(reversed(rewards)) == score  # any order: every partial sum is exact
    # Without the grid the same telescoping is off in the last bits for such scores:
    phis, naive = [0.3, 0.1 + 0.2], []
    prev = 0.0
    for phi in phis:
        naive.append(phi - prev)
        prev = phi
    naive.append(1 / 30 - prev)
    assert sum(naive) != 1 / 30
    assert abs(quantize(1 / 30) - 1 / 30) < GRID


def test_interim_and_sparse_modes():
    interim = RewardTracker("interim")
    assert [interim.step(0.1), interim.step(None), interim.step(0.3)] == [
        quantize(0.1),
        quantize(0.1),
        quantize(0.3),
    ]
    assert interim.final(0.75) == 0.75
    sparse = RewardTracker("sparse")
    assert [sparse.step(0.4), sparse.step(0.2), sparse.final(0.5)] == [0.0, 0.0, 0.5]
    with pytest.raises(ValueError, match="unknown reward mode"):
        RewardTracker("dense")


REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="7">
<testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py" time="0.1"/>
<testcase classname="tests.test_a" name="test_bad" file="tests/test_a.py">
  <failure message="assert 1 == 2">tests/test_a.py:3: AssertionError</failure></testcase>
<testcase classname="tests.test_a.TestK" name="test_skip" file="tests/test_a.py">
  <skipped message="no"/></testcase>
<testcase classname="tests.test_a" name="test_teardown" file="tests/test_a.py">
  <failure message="f"/><error message="teardown"/></testcase>
<testcase classname="" name="tests.test_b"><error message="collection failure">boom</error></testcase>
<testcase classname="tests.test_extra" name="test_free" file="tests/test_extra.py"/>
<testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py"/>
</testsuite></testsuites>"""


def test_parse_junit_outcomes_and_selection():
    cases = parse_junit(REPORT)
    assert [c.outcome for c in cases] == [
        "passed",
        "failed",
        "skipped",
        "error",
        "error",
        "passed",
        "passed",
    ]
    assert "assert 1 == 2" in cases[1].message
    chosen = select_cases(cases, ["tests/test_a.py", "tests/test_b.py"])
    # the planted tests/test_extra.py case and the duplicate of test_ok are not counted
    assert [(c.classname, c.name) for c in chosen] == [
        ("tests.test_a", "test_ok"),
        ("tests.test_a", "test_bad"),
        ("tests.test_a.TestK", "test_skip"),
        ("tests.test_a", "test_teardown"),
        ("", "tests.test_b"),
    ]


def test_select_cases_without_file_attribute_uses_classname():
    xml = (
        '<testsuite><testcase classname="pkg.tests.test_x.TestY" name="t1"/>'
        '<testcase classname="pkg.tests.test_xy" name="t2"/></testsuite>'
    )
    chosen = select_cases(parse_junit(xml), ["pkg/tests/test_x.py"])
    assert [c.name for c in chosen] == ["t1"]


@pytest.mark.parametrize("data", ["", "<html/>", "<testsuite><testcase", "x" * 10])
def test_parse_junit_rejects_non_reports(data):
    with pytest.raises(JUnitError):
        parse_junit(data)
