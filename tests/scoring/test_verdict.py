"""The host's side of a verdict: the evaluator's MAC over the bytes it received, then the
cases derived from the relay's raw events. Every way a stream can be other than the
relay's own, complete output is refused, with a reason."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from gyre_env.scoring.verdict import (
    VerdictIncomplete,
    VerdictTampered,
    check_stream,
    read_verdict,
    stream_mac,
)

KEY, NONCE, ROOT = b"k" * 32, "n0", "/workspace/repo"
FILE = "tests/test_calc.py"


def stream(*records: dict) -> bytes:
    return b"".join(
        (json.dumps({**r, "i": i}, sort_keys=True, separators=(",", ":")) + "\n").encode()
        for i, r in enumerate(records)
    )


def phases(name: str, call: str = "passed", message: str = "") -> list[dict]:
    node = f"{FILE}::{name}"
    base = {"k": "phase", "nodeid": node, "file": FILE, "message": ""}
    return [
        {**base, "when": "setup", "outcome": "passed"},
        {**base, "when": "call", "outcome": call, "message": message},
        {**base, "when": "teardown", "outcome": "passed"},
    ]


START = {"k": "start", "rootdir": ROOT, "pid": 7}
ADD = phases("test_add")
SUB = phases("test_sub", "failed", "assert 0 == 2")


def finish(reports: int) -> dict:
    return {"k": "finish", "reports": reports, "exit": 1}


def read(data: bytes):
    return read_verdict(data, rootdir=ROOT)


def test_a_complete_stream_gives_its_cases():
    cases = read(stream(START, *ADD, *SUB, finish(6)))
    assert [(c.name, c.outcome, c.message) for c in cases] == [
        ("test_add", "passed", ""),
        ("test_sub", "failed", "assert 0 == 2"),
    ]
    assert cases[0].key == ("tests.test_calc", "test_add")


def test_the_host_decides_each_case_from_its_phases():
    """An error in setup or teardown wins over the call; a collection error is a case."""
    broken_teardown = [*phases("test_x")[:2], {**phases("test_x")[2], "outcome": "failed"}]
    skipped = [{**phases("test_y")[0], "outcome": "skipped", "message": "no"}, phases("test_y")[2]]
    collect = {
        "k": "collect",
        "nodeid": "tests/test_more.py",
        "file": "tests/test_more.py",
        "outcome": "failed",
        "message": "ImportError",
    }
    cases = read(stream(START, collect, *broken_teardown, *skipped, finish(6)))
    assert [(c.classname, c.name, c.outcome) for c in cases] == [
        ("", "tests.test_more", "error"),  # as pytest's JUnit writer names it
        ("tests.test_calc", "test_x", "error"),
        ("tests.test_calc", "test_y", "skipped"),
    ]


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "sent nothing"),
        (stream(START, *ADD), "no finish record after 1 cases"),
        (stream({**START, "rootdir": "/tmp/elsewhere"}, finish(0)), "not in the workspace"),
        (stream(START, *ADD[:2], finish(2)), "without a teardown report"),
    ],
)
def test_a_stream_that_stops_is_incomplete(data, reason):
    with pytest.raises(VerdictIncomplete, match=reason):
        read(data)


@pytest.mark.parametrize(
    "data, reason",
    [
        (stream(START, *ADD, *SUB, finish(6)) + b"<testsuites/>\n", "not a verdict record"),
        (stream(START, *ADD, finish(5)), "counts 5 reports, 3 arrived"),
        (stream(*ADD, finish(3)), "first record is 'phase'"),
        (stream(START, {"k": "tampered", "why": "X.y was replaced"}), "X.y was replaced"),
        (stream(START, *ADD, finish(3), *SUB), "a record after the finish"),
        (stream(START, *phases("test_add", "xpassed"), finish(3)), "outcome 'xpassed'"),
        (stream(START, *ADD, *ADD, finish(6)), "reported again after its teardown"),
        (stream(START, ADD[1], ADD[0], ADD[2], finish(3)), "setup report .* out of order"),
        (stream(START, ADD[0], ADD[1], ADD[1], ADD[2], finish(4)), "out of order"),
        (stream(START, {**ADD[0], "nodeid": 3}, finish(1)), "no string 'nodeid'"),
    ],
)
def test_anything_but_the_relays_stream_is_tampering(data, reason):
    with pytest.raises(VerdictTampered, match=reason):
        read(data)


def test_a_dropped_or_reordered_record_is_tampering():
    lines = stream(START, *ADD, finish(3)).splitlines(keepends=True)
    with pytest.raises(VerdictTampered, match="sequence number 2"):
        read(lines[0] + lines[2] + lines[3] + lines[4])
    with pytest.raises(VerdictTampered, match="sequence number 2"):
        read(lines[0] + lines[2] + lines[1] + lines[3] + lines[4])


def test_only_the_bytes_the_evaluator_received_pass_its_mac():
    data = stream(START, *ADD, finish(3))
    mac = stream_mac(KEY, NONCE, 2, data)
    check_stream(data, key=KEY, nonce=NONCE, index=2, mac=mac)
    for changed in (
        dict(data=data + b"\n"),
        dict(key=b"x" * 32),
        dict(nonce="n1"),
        dict(index=1),
        dict(mac=None),
    ):
        args = {"data": data, "key": KEY, "nonce": NONCE, "index": 2, "mac": mac, **changed}
        with pytest.raises(VerdictTampered, match="MAC mismatch"):
            check_stream(args.pop("data"), **args)


def test_the_evaluator_macs_what_the_host_checks():
    """The evaluator's own MAC (stdlib only, run inside the evaluator) is the host's."""
    from gyre_env.scoring import _evaluator_run as evaluator

    data = stream(START, *ADD, finish(3))
    grant = {"key": KEY.hex(), "nonce": NONCE, "index": 3}
    check_stream(data, key=KEY, nonce=NONCE, index=3, mac=evaluator._stream_mac(grant, data))


def test_the_launchers_relay_writes_what_the_host_reads():
    """The relay's serializer (stdlib only, run in the tested process) writes raw events
    this module accepts; it holds no key."""
    from gyre_env.scoring import _pytest_launcher as launcher

    read_fd, write_fd = os.pipe()
    relay = launcher._Relay(write_fd, [])
    assert not any("key" in name or "mac" in name for name in vars(relay))
    config = SimpleNamespace(rootpath=ROOT, pluginmanager=SimpleNamespace(get_plugins=list))
    relay.pytest_configure(config)
    relay.pytest_collection(SimpleNamespace(config=config))
    for when, outcome, longrepr in (("setup", "passed", None), ("call", "failed", "assert 0 == 2")):
        relay.pytest_runtest_logreport(
            SimpleNamespace(
                nodeid=f"{FILE}::test_sub",
                when=when,
                outcome=outcome,
                longrepr=longrepr,
                location=(FILE, 3, "test_sub"),
            )
        )
    relay.pytest_runtest_logreport(
        SimpleNamespace(
            nodeid=f"{FILE}::test_sub",
            when="teardown",
            outcome="passed",
            longrepr=None,
            location=(FILE, 3, "test_sub"),
        )
    )
    relay.pytest_sessionfinish(SimpleNamespace(config=config), 1)
    os.close(write_fd)
    with open(read_fd, "rb") as fh:
        data = fh.read()
    cases = read_verdict(data, rootdir=ROOT)
    assert [(c.name, c.outcome, c.message) for c in cases] == [
        ("test_sub", "failed", "assert 0 == 2")
    ]
