"""The verdict of a test command, decided outside the process that ran the tests.

How it travels. The grader's pytest launcher (``_pytest_launcher``) runs in the tested
process: the hidden tests import the agent's modules there. Its relay writes pytest's own
events to a pipe as they happen: ``start`` (before any test module is imported), each
phase report (setup, call, teardown: outcome, message, node id), each collection error,
``finish`` with the count of reports. It holds no key and decides nothing. The evaluator's
root process (``_evaluator_run``) reads the pipe while the command runs, keeps the bytes
and MACs them with a per-command key the host made (the key never reaches a process that
runs workspace code: it is in a root-only file the evaluator deletes before anything of
the workspace runs). Here the host checks that MAC (``check_stream``), then derives the
cases itself (``read_verdict``): the order of the events, which phase decides a case (an
error wins, then a failure, then a skip, as in pytest's JUnit report), the names, the
counts.

What this guarantees, whatever the workspace's code does:

- There is no key or signer in the tested process to find (through ``gc`` or memory) and
  use: nothing there can produce anything the host trusts more than the raw events.
- Events are final once sent: the root reader holds them as they arrive, so a failure
  reported before the agent's code acted cannot be taken back or rewritten (an
  ``atexit`` hook, a second stream, a report file are useless); a record after
  ``finish``, a phase reported twice or out of order, a count that does not match, a
  line that is not a record, the relay's own ``tampered`` record: ``VerdictTampered``.
  A stream that stops before ``finish`` (``os._exit``, a crash, a kill) is
  ``VerdictIncomplete``: the run is judged suspect, never a pass.
- Nothing the workspace leaves running changes the bytes after the command (its uid is
  killed, the file is root's, and the MAC covers them).
- The outcome rules run here, in code the tested process cannot patch.

What it does not guarantee, and no grader that runs the tests in the agent's process can:
that a "passed" event means the test's assertions held. The only evidence of a pass (an
assertion that did not raise) exists inside a process that the agent's code controls
from the moment it is imported. Code there can write well-formed events onto the relay's
pipe itself (the descriptor is in its process), patch the relay or pytest for a single
call, rewrite the test functions it is imported by, or return objects whose ``__eq__``
always answers True. The relay's tripwires (plugins registered at run time, pytest's,
pluggy's and its own functions replaced) catch the generic tricks and send ``tampered``,
but a deliberate attack on this protocol passes them. Closing that needs assertions that
run in a process which never imports the workspace (hidden tests that reach the solution
across a process boundary): a property of a task's tests, not of this grader.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from gyre_env.scoring.junit import TestCase

MAX_VERDICT_BYTES = 64 << 20
MESSAGE_LIMIT = 2000
PHASES = ("setup", "call", "teardown")


class VerdictError(ValueError):
    """A verdict stream that gives no valid result."""


class VerdictIncomplete(VerdictError):
    """The stream ended before the relay's ``finish`` record (or is empty)."""


class VerdictTampered(VerdictError):
    """The stream holds something the grader's relay never writes, or was changed."""


def stream_mac(key: bytes, nonce: str, index: int, data: bytes) -> str:
    """The MAC the evaluator's root process puts on the bytes it received for command
    ``index`` of run ``nonce`` (``_evaluator_run._stream_mac`` computes the same)."""
    return hmac.new(key, f"{nonce}:{index}:".encode() + data, hashlib.sha256).hexdigest()


def check_stream(data: bytes, *, key: bytes, nonce: str, index: int, mac: str | None) -> None:
    """Raise ``VerdictTampered`` unless ``mac`` is the evaluator's MAC of ``data``."""
    if not isinstance(mac, str) or not hmac.compare_digest(
        stream_mac(key, nonce, index, data), mac
    ):
        raise VerdictTampered(
            "the verdict's bytes are not the ones the evaluator received (MAC mismatch)"
        )


def read_verdict(data: bytes, *, rootdir: str) -> list[TestCase]:
    """The test cases of a complete stream of the relay's events (see the module
    docstring for the rules)."""
    if len(data) > MAX_VERDICT_BYTES:
        raise VerdictTampered(f"the verdict is {len(data)} bytes, over {MAX_VERDICT_BYTES}")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise VerdictIncomplete("no verdict: the grader's relay sent nothing")
    cases = _Cases()
    finished = False
    for seq, line in enumerate(lines):
        record = _record(line, seq)
        kind = record.get("k")
        if finished:
            raise VerdictTampered(f"a record after the finish record: {kind!r}")
        if seq == 0:
            if kind != "start":
                raise VerdictTampered(f"the first record is {kind!r}, not 'start'")
            if record.get("rootdir") != rootdir:
                raise VerdictIncomplete(
                    f"pytest ran in {record.get('rootdir')!r}, not in the workspace {rootdir!r}"
                )
        elif kind == "collect":
            cases.collected(record)
        elif kind == "phase":
            cases.phase(record)
        elif kind == "tampered":
            raise VerdictTampered(f"the grader's relay saw tampering: {record.get('why')}")
        elif kind == "finish":
            if record.get("reports") != cases.reports:
                raise VerdictTampered(
                    f"the finish record counts {record.get('reports')} reports, "
                    f"{cases.reports} arrived"
                )
            finished = True
        else:
            raise VerdictTampered(f"an unexpected record kind {kind!r}")
    if not finished:
        raise VerdictIncomplete(
            f"no finish record after {len(cases.done)} cases: the test process ended early"
        )
    if cases.open:
        raise VerdictIncomplete(f"tests without a teardown report: {sorted(cases.open)[:5]}")
    return cases.done


def _record(line: bytes, seq: int) -> dict:
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            raise TypeError("not an object")
    except (ValueError, TypeError) as e:
        raise VerdictTampered(f"line {seq} is not a verdict record: {line[:200]!r}") from e
    if record.get("i") != seq:
        raise VerdictTampered(f"line {seq} carries sequence number {record.get('i')}")
    return record


class _Cases:
    """Cases assembled from phase reports, each decided at its teardown."""

    def __init__(self) -> None:
        self.done: list[TestCase] = []
        self.open: dict[str, dict[str, tuple[str, str]]] = {}
        self.closed: set[str] = set()
        self.reports = 0

    def collected(self, record: dict) -> None:
        """A module or class that failed (``error``) or was skipped at collection."""
        self.reports += 1
        outcome = _field(record, "outcome")
        if outcome not in ("failed", "skipped"):
            raise VerdictTampered(f"a collection report with outcome {outcome!r}")
        self._add(record, "error" if outcome == "failed" else "skipped", _field(record, "message"))

    def phase(self, record: dict) -> None:
        self.reports += 1
        nodeid, when = _field(record, "nodeid"), _field(record, "when")
        outcome = _field(record, "outcome")
        if when not in PHASES or outcome not in ("passed", "failed", "skipped"):
            raise VerdictTampered(f"a {when!r} report of {nodeid!r} with outcome {outcome!r}")
        if nodeid in self.closed:
            raise VerdictTampered(f"{nodeid!r} was reported again after its teardown")
        phases = self.open.setdefault(nodeid, {})
        if when in phases or any(PHASES.index(w) > PHASES.index(when) for w in phases):
            raise VerdictTampered(f"the {when} report of {nodeid!r} is out of order")
        phases[when] = (outcome, _field(record, "message"))
        if when == "teardown":
            del self.open[nodeid]
            self.closed.add(nodeid)
            self._add(record, *_case_outcome(phases))

    def _add(self, record: dict, outcome: str, message: str) -> None:
        classname, name = junit_names(_field(record, "nodeid"))
        message = message.strip()
        if len(message) > MESSAGE_LIMIT:  # the same cut as ``parse_junit``
            message = message[: MESSAGE_LIMIT // 2] + "\n[...]\n" + message[-MESSAGE_LIMIT // 2 :]
        self.done.append(
            TestCase(
                classname=classname,
                name=name,
                file=_field(record, "file"),
                outcome=outcome,
                message=message,
            )
        )


def _field(record: dict, name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        raise VerdictTampered(f"record {record.get('i')} has no string {name!r}")
    return value


def _case_outcome(phases: dict) -> tuple[str, str]:
    """One case's outcome from its setup/call/teardown reports, as the JUnit file has it
    once ``parse_junit`` reads it (an error wins, then a failure, then a skip)."""
    setup, call, teardown = (phases.get(w, ("passed", "")) for w in PHASES)
    if setup[0] == "failed":
        return "error", setup[1]
    if setup[0] == "skipped":
        return "skipped", setup[1]
    if call[0] == "failed":
        return "failed", call[1]
    if teardown[0] == "failed":
        return "error", teardown[1]
    if call[0] == "skipped":
        return "skipped", call[1]
    return "passed", ""


def junit_names(nodeid: str) -> tuple[str, str]:
    """(classname, name) exactly as pytest's xunit1 JUnit writer mangles a node id."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".")
    if names[0].endswith(".py"):
        names[0] = names[0][:-3]
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]
