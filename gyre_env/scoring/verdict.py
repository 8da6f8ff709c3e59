"""Reading the signed verdict the grader's pytest plugin streamed (see ``_pytest_launcher``).

The host makes one key per test command and a nonce per grading run; only the launcher
that the evaluator hands the key to can sign. ``read_verdict`` accepts a stream only if
every line is a record signed with that key, for this run and this command, numbered
0, 1, 2, ... with no gap, starting with ``start`` (whose rootdir is the workspace copy)
and ending with ``finish`` (whose case count matches). A stream that merely stops (the
process died or exited early) raises ``VerdictIncomplete``; anything that could only come
from tampering (a line that is not a signed record, a gap, a record after ``finish``,
the plugin's own ``tampered`` record) raises ``VerdictTampered``.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from gyre_env.scoring.junit import TEST_OUTCOMES, TestCase

MAX_VERDICT_BYTES = 64 << 20
MESSAGE_LIMIT = 2000


class VerdictError(ValueError):
    """A verdict stream that gives no valid result."""


class VerdictIncomplete(VerdictError):
    """The stream ended before the plugin's ``finish`` record (or is empty)."""


class VerdictTampered(VerdictError):
    """The stream holds something the grader's plugin never writes."""


def sign(key: bytes, body: bytes) -> str:
    """The MAC of one record's body (the launcher computes the same with ``_hashlib``)."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def read_verdict(data: bytes, *, key: bytes, nonce: str, index: int, rootdir: str) -> list:
    """The test cases of a complete, authentic verdict stream (see the module docstring)."""
    if len(data) > MAX_VERDICT_BYTES:
        raise VerdictTampered(f"the verdict is {len(data)} bytes, over {MAX_VERDICT_BYTES}")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    cases: list[TestCase] = []
    finished = False
    for seq, line in enumerate(lines):
        record = _record(line, seq, key=key, nonce=nonce, index=index)
        kind = record["k"]
        if finished:
            raise VerdictTampered(f"a record after the finish record: {kind!r}")
        if seq == 0 and kind != "start":
            raise VerdictTampered(f"the first record is {kind!r}, not 'start'")
        if kind == "start":
            if seq != 0:
                raise VerdictTampered("a second start record")
            if record.get("rootdir") != rootdir:
                raise VerdictIncomplete(
                    f"pytest ran in {record.get('rootdir')!r}, not in the workspace {rootdir!r}"
                )
        elif kind == "case":
            cases.append(_case(record))
        elif kind == "tampered":
            raise VerdictTampered(f"the grader's plugin saw tampering: {record.get('why')}")
        elif kind == "finish":
            if record.get("cases") != len(cases):
                raise VerdictTampered(
                    f"the finish record counts {record.get('cases')} cases, {len(cases)} arrived"
                )
            finished = True
        else:
            raise VerdictTampered(f"an unknown record kind {kind!r}")
    if not lines:
        raise VerdictIncomplete("no verdict: the grader's plugin sent nothing")
    if not finished:
        raise VerdictIncomplete(
            f"no finish record after {len(cases)} cases: the test process ended early"
        )
    return cases


def _record(line: bytes, seq: int, *, key: bytes, nonce: str, index: int) -> dict:
    try:
        outer = json.loads(line)
        body, mac = outer["r"], outer["m"]
        if not isinstance(body, str) or not isinstance(mac, str):
            raise TypeError("r and m must be strings")
    except (ValueError, TypeError, KeyError) as e:
        raise VerdictTampered(f"line {seq} is not a verdict record: {line[:200]!r}") from e
    if not hmac.compare_digest(sign(key, body.encode()), mac):
        raise VerdictTampered(f"line {seq} is not signed with this run's key")
    record = json.loads(body)
    if record.get("n") != nonce or record.get("c") != index:
        raise VerdictTampered(f"line {seq} belongs to another run or command")
    if record.get("i") != seq:
        raise VerdictTampered(f"line {seq} carries sequence number {record.get('i')}")
    return record


def _case(record: dict) -> TestCase:
    if record.get("outcome") not in TEST_OUTCOMES:
        raise VerdictTampered(f"a case with outcome {record.get('outcome')!r}")
    message = str(record.get("message", "")).strip()
    if len(message) > MESSAGE_LIMIT:  # the same cut as ``parse_junit``
        message = message[: MESSAGE_LIMIT // 2] + "\n[...]\n" + message[-MESSAGE_LIMIT // 2 :]
    return TestCase(
        classname=str(record.get("classname", "")),
        name=str(record.get("name", "")),
        file=record.get("file"),
        outcome=record["outcome"],
        message=message,
    )
