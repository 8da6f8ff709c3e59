"""The host's check of a signed verdict stream: every way a stream can be other than the
grader plugin's own, complete output is refused, with a reason."""

from __future__ import annotations

import json
import os

import pytest

from gyre_env.scoring.verdict import (
    VerdictIncomplete,
    VerdictTampered,
    read_verdict,
    sign,
)

KEY, NONCE, ROOT = b"k" * 32, "n0", "/workspace/repo"


def line(record: dict, key: bytes = KEY) -> bytes:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return (json.dumps({"m": sign(key, body.encode()), "r": body}) + "\n").encode()


def stream(*records: dict, key: bytes = KEY, index: int = 0) -> bytes:
    return b"".join(line({"n": NONCE, "c": index, "i": i, **r}, key) for i, r in enumerate(records))


START = {"k": "start", "rootdir": ROOT, "pid": 7}
CASE = {
    "k": "case",
    "classname": "tests.test_calc",
    "name": "test_add",
    "file": "tests/test_calc.py",
    "outcome": "passed",
    "message": "",
}
FAILED = {**CASE, "name": "test_sub", "outcome": "failed", "message": "assert 0 == 2"}
FINISH = {"k": "finish", "cases": 2, "exit": 1}


def read(data: bytes, index: int = 0):
    return read_verdict(data, key=KEY, nonce=NONCE, index=index, rootdir=ROOT)


def test_a_complete_stream_gives_its_cases():
    cases = read(stream(START, CASE, FAILED, FINISH))
    assert [(c.name, c.outcome, c.message) for c in cases] == [
        ("test_add", "passed", ""),
        ("test_sub", "failed", "assert 0 == 2"),
    ]
    assert cases[0].key == ("tests.test_calc", "test_add")


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "sent nothing"),
        (stream(START, CASE), "no finish record after 1 cases"),
        (stream({**START, "rootdir": "/tmp/elsewhere"}, FINISH), "not in the workspace"),
    ],
)
def test_a_stream_that_stops_is_incomplete(data, reason):
    with pytest.raises(VerdictIncomplete, match=reason):
        read(data)


@pytest.mark.parametrize(
    "data, reason",
    [
        (stream(START, CASE, FINISH, key=b"x" * 32), "not signed with this run's key"),
        (stream(START, CASE, FAILED, FINISH, index=1), "another run or command"),
        (stream(START, CASE, FAILED, FINISH) + b"<testsuites/>\n", "not a verdict record"),
        (stream(START, CASE, {**FINISH, "cases": 4}), "counts 4 cases, 1 arrived"),
        (stream(CASE, FINISH), "first record is 'case'"),
        (stream(START, {"k": "tampered", "why": "X.y was replaced"}), "X.y was replaced"),
        (stream(START, CASE, {**FINISH, "cases": 1}, CASE), "a record after the finish"),
        (stream(START, {**CASE, "outcome": "xpassed"}, FINISH), "outcome 'xpassed'"),
    ],
)
def test_anything_but_the_plugins_stream_is_tampering(data, reason):
    with pytest.raises(VerdictTampered, match=reason):
        read(data)


def test_a_dropped_or_reordered_record_is_tampering():
    lines = stream(START, CASE, FAILED, FINISH).splitlines(keepends=True)
    with pytest.raises(VerdictTampered, match="sequence number 2"):
        read(lines[0] + lines[2] + lines[3])
    with pytest.raises(VerdictTampered, match="sequence number 2"):
        read(lines[0] + lines[2] + lines[1] + lines[3])


def test_the_launcher_signs_what_the_host_checks():
    """The launcher's own serializer and MAC (stdlib only, run in the evaluator) produce
    records this module accepts."""
    import _hashlib

    from gyre_env.scoring import _pytest_launcher as launcher

    grant = {"key": KEY.hex(), "nonce": NONCE, "index": 3}
    read_fd, write_fd = os.pipe()
    verdict = launcher._Verdict(grant, write_fd)
    assert grant["key"] is None  # the key is not kept in the grant
    assert isinstance(verdict._mac, _hashlib.HMAC)
    verdict._emit("start", rootdir=ROOT, pid=1)
    verdict._case("tests.test_calc", "test_add", "tests/test_calc.py", "passed", "")
    verdict._emit("finish", cases=1, exit=0)
    os.close(write_fd)
    with open(read_fd, "rb") as fh:
        data = fh.read()
    cases = read_verdict(data, key=KEY, nonce=NONCE, index=3, rootdir=ROOT)
    assert [(c.name, c.outcome) for c in cases] == [("test_add", "passed")]
