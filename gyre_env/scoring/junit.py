"""Reading pytest's JUnit XML reports (with ``xml.etree``, never regexes over text).

Only test cases that belong to the task's own test files count: a workspace that adds
its own passing tests next to the hidden ones (collected by ``pytest tests``) must not
raise the score. A case belongs to a test file when its ``file`` attribute (written by
``junit_family=xunit1``) is that path, or when its dotted ``classname`` starts with the
file's module path (``tests/test_a.py`` -> ``tests.test_a``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

MAX_REPORT_BYTES = 64 << 20
TEST_OUTCOMES = ("passed", "failed", "error", "skipped")


class JUnitError(ValueError):
    """A report is missing, too large or not JUnit XML."""


@dataclass(frozen=True)
class TestCase:
    """One ``<testcase>`` of a report."""

    __test__ = False  # not a pytest test class

    classname: str
    name: str
    file: str | None
    outcome: str
    """One of ``TEST_OUTCOMES``; an error (also a collection error) wins over a failure."""
    message: str = ""
    """The failure/error/skip message and text (traceback), trimmed."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.classname, self.name)

    @property
    def display_name(self) -> str:
        return f"{self.classname}::{self.name}" if self.classname else self.name


@dataclass(kw_only=True)
class TestCounts:
    """Test cases by outcome."""

    __test__ = False

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    cases: list[TestCase] = field(default_factory=list)

    @property
    def collected(self) -> int:
        return self.passed + self.failed + self.errors + self.skipped

    @classmethod
    def of(cls, cases: Iterable[TestCase]) -> TestCounts:
        counts = cls()
        for case in cases:
            counts.cases.append(case)
            if case.outcome == "passed":
                counts.passed += 1
            elif case.outcome == "failed":
                counts.failed += 1
            elif case.outcome == "error":
                counts.errors += 1
            else:
                counts.skipped += 1
        return counts


def parse_junit(data: str | bytes, *, message_limit: int = 2000) -> list[TestCase]:
    """All test cases of a JUnit XML report, in document order."""
    if len(data) > MAX_REPORT_BYTES:
        raise JUnitError(f"report is {len(data)} bytes, over the {MAX_REPORT_BYTES} limit")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise JUnitError(f"report is not valid XML: {e}") from e
    if root.tag not in ("testsuites", "testsuite"):
        raise JUnitError(f"not a JUnit report: root element is <{root.tag}>")
    cases = []
    for case in root.iter("testcase"):
        by_tag = {child.tag: child for child in case}
        outcome, detail = "passed", None
        for tag, name in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")):
            if tag in by_tag:
                outcome, detail = name, by_tag[tag]
                break
        message = ""
        if detail is not None:
            message = (detail.get("message", "") + "\n" + (detail.text or "")).strip()
            if len(message) > message_limit:
                message = (
                    message[: message_limit // 2] + "\n[...]\n" + message[-message_limit // 2 :]
                )
        cases.append(
            TestCase(
                classname=case.get("classname", ""),
                name=case.get("name", ""),
                file=case.get("file"),
                outcome=outcome,
                message=message,
            )
        )
    return cases


def _module_of(path: str) -> str:
    p = PurePosixPath(path)
    return ".".join(p.with_suffix("").parts) if p.suffix == ".py" else ".".join(p.parts)


def belongs_to(case: TestCase, paths: Iterable[str]) -> bool:
    """Whether ``case`` comes from one of the workspace-relative test ``paths``."""
    norm = {str(PurePosixPath(p)) for p in paths}
    if case.file:
        return str(PurePosixPath(case.file)) in norm
    for path in norm:
        mod = _module_of(path)
        if case.classname == mod or case.classname.startswith(mod + "."):
            return True
        if not case.classname and case.name in (mod, path):  # collection error
            return True
    return False


def select_cases(cases: Iterable[TestCase], paths: Iterable[str]) -> list[TestCase]:
    """The cases from ``paths``, each (classname, name) once (first report wins)."""
    paths = list(paths)
    seen: set[tuple[str, str]] = set()
    out = []
    for case in cases:
        if case.key in seen or not belongs_to(case, paths):
            continue
        seen.add(case.key)
        out.append(case)
    return out
