"""Code under test forging its own grade from inside the pytest process, on every backend.

The hidden tests import the agent's module, so whatever it does at import time or when a
test calls it runs inside the grader's pytest process. Each attack below is the calc
task's partial solution (1 of 4 hidden tests passes: honest score 0.25) plus a forging
trick, and is first shown to WORK against a naive runner (``calc_task.naive_score``:
plain pytest, the score read from the JUnit file), so no test here can pass vacuously.
The grader must then give 0, say why, and never count the run as ``infra_error`` (which
would leave it out of training and hide the failure from the policy).

The grader's verdict is derived outside the tested process (``gyre_env.scoring.verdict``),
which holds no key: ``gc_finds_the_signer`` (which forged a signed verdict with the
launcher's own signer when it held one) finds nothing to sign with, and
``test_the_tested_process_holds_no_key`` scans the process's memory for the run's keys.
What is not covered, and so not tested: code that writes well-formed raw events onto the
relay's pipe itself, or patches pytest for one call (see ``verdict``'s docstring: no
grader that runs the tests in the agent's process can tell that from a real pass).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scoring"))
from calc_task import (  # noqa: E402
    PARTIAL,
    PYPROJECT,
    make_calc_task,
    naive_score,
    write_tree,
)

from gyre_env.scoring import GradingConfig, grade_workspace  # noqa: E402

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("bwrap", marks=pytest.mark.bwrap),
    "local",
]

# Shared by the attacks: a JUnit report in which all four hidden tests pass, and the
# report path pytest was given (from /proc: the grader's launcher rewrites sys.argv).
FORGE = """
import os

CASES = "".join(
    '<testcase classname="tests.test_calc" name="test_%s" file="tests/test_calc.py"/>' % n
    for n in ("add", "sub", "mul", "div"))
XML = '<testsuites><testsuite name="pytest" tests="4">' + CASES + "</testsuite></testsuites>"


def junit_path():
    with open("/proc/self/cmdline", "rb") as fh:
        args = [a.decode() for a in fh.read().split(b"\\0")]
    for i, arg in enumerate(args):
        if arg.startswith(("--junitxml=", "--junit-xml=")):
            return arg.split("=", 1)[1]
        if arg in ("--junitxml", "--junit-xml") and i + 1 < len(args):
            return args[i + 1]
    return None


def write_report():
    path = junit_path()
    if path:
        with open(path, "w") as fh:
            fh.write(XML)
"""

ATTACKS = {
    # (a) At import: write a passing report where --junitxml points, and leave at once.
    "junit_then_os_exit": FORGE + "write_report()\nos._exit(0)\n",
    # (b) Through gc: find pytest's Config and register a plugin that turns every
    # report into a pass (conftest.py files are swept, so the plugin comes in this way).
    "gc_config_registers_plugin": FORGE
    + """
import gc
import pytest

class Flip:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        report.outcome = "passed"
        report.longrepr = None

for obj in gc.get_objects():
    if type(obj).__name__ == "Config" and hasattr(obj, "pluginmanager"):
        obj.pluginmanager.register(Flip(), "flip")
        break
""",
    # (b) Patch pytest's runner: every TestReport is created as a pass.
    "patch_test_report": FORGE
    + """
from _pytest.reports import TestReport

_original = TestReport.from_item_and_call.__func__

def _forged(cls, item, call):
    report = _original(cls, item, call)
    report.outcome = "passed"
    report.longrepr = None
    return report

TestReport.from_item_and_call = classmethod(_forged)
""",
    # (c) atexit: once pytest has written its report, overwrite it, and write forged
    # "all passed" lines onto every pipe the process holds (the grader's channel included).
    "atexit_overwrites_report_and_channel": FORGE
    + """
import atexit
import hashlib
import json

def forge():
    write_report()
    finish = json.dumps({"k": "finish", "cases": 4, "i": 5, "n": "", "c": 0})
    line = (json.dumps({"m": "0" * 64, "r": finish}) + "\\n").encode()
    for name in os.listdir("/proc/self/fd"):
        try:
            if int(name) > 2 and os.readlink("/proc/self/fd/" + name).startswith("pipe:"):
                os.write(int(name), line)
        except OSError:
            pass

atexit.register(forge)
""",
    # (d) Through gc: find whatever holds the grader's signer (an HMAC object, as the
    # launcher once held) and sign a forged all-pass verdict with it, then leave.
    "gc_finds_the_signer": FORGE
    + """
import gc, hmac, json
try:
    import _hashlib
    macs = (hmac.HMAC, _hashlib.HMAC)
except (ImportError, AttributeError):
    macs = (hmac.HMAC,)
write_report()
for holder in gc.get_objects():
    try:
        fields = getattr(holder, "__dict__", None)
        if not isinstance(fields, dict) or not any(isinstance(v, macs) for v in fields.values()):
            continue
    except Exception:
        continue
    emit = getattr(holder, "_emit", None)
    for name in ("add", "sub", "mul", "div"):
        emit("case", classname="tests.test_calc", name="test_" + name,
             file="tests/test_calc.py", outcome="passed", message="")
    emit("finish", cases=4, exit=0)
os._exit(0)
""",
    # (c) Leave in the middle of the run: the first failing test exits the process with
    # status 0 after writing the passing report.
    "os_exit_inside_a_test": FORGE
    + """
def sub(a, b):
    write_report()
    os._exit(0)
""",
}
TAMPERED = {
    "gc_config_registers_plugin",
    "patch_test_report",
    "atexit_overwrites_report_and_channel",
}
"""Attacks the grader catches in the act (signed ``tampered`` record or forged lines); the
others just end the run before the grader's finish record."""


def _config(backend: str) -> GradingConfig:
    # Docker's image has no plugins, so its autoload (the default) costs nothing; local and
    # bubblewrap run this host's Python, whose many plugins are slow to load (4 s a run)
    # and beside the point: they load none, as the cpu-demo preset does.
    return GradingConfig(backend=backend, pytest_plugins=None if backend == "docker" else [])


@pytest.fixture
def calc_task(tmp_path):
    return make_calc_task(tmp_path / "calc-task")


def _workspace(root: Path, attack: str) -> Path:
    return write_tree(root, {"calc.py": PARTIAL + ATTACKS[attack], "pyproject.toml": PYPROJECT})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_in_process_forgery_scores_zero(attack, backend, calc_task, tmp_path):
    ws = _workspace(tmp_path / "ws", attack)
    assert naive_score(calc_task, ws, tmp_path) == 1.0, "the attack must fool a naive runner"
    result = grade_workspace(calc_task, ws, _config(backend))
    assert result.status == "workspace_error", result.summary()
    assert result.score == 0.0 and result.passed == 0, result.summary()
    assert result.valid  # scored against the policy, never dropped as infra_error
    assert result.tampered == (attack in TAMPERED), result.reason
    if attack in TAMPERED:
        assert result.reason.startswith("tampering with the grader"), result.reason
    else:
        assert "no finish record" in result.reason, result.reason
        assert result.control is not None and result.control.status == "ok"
    if backend != "local":
        assert result.privilege_drop, f"the {backend} evaluator must drop privileges"


@pytest.mark.parametrize("backend", BACKENDS)
def test_honest_workspaces_keep_their_scores(backend, calc_task, tmp_path):
    """The signed verdict changes nothing for a workspace that does not attack it."""
    ws = write_tree(tmp_path / "ws", {"calc.py": PARTIAL, "pyproject.toml": PYPROJECT})
    result = grade_workspace(calc_task, ws, _config(backend))
    assert (result.status, result.score, result.passed, result.collected) == ("ok", 0.25, 1, 4)
    assert not result.tampered and result.reason == ""
    failed = sorted(c.name for c in result.counts.cases if c.outcome == "failed")
    assert failed == ["test_div", "test_mul", "test_sub"]
    assert "assert 0 == 2" in next(c for c in result.counts.cases if c.name == "test_sub").message
    gold = grade_workspace(calc_task, calc_task.gold_dir, _config(backend))
    assert (gold.status, gold.score) == ("ok", 1.0)
    if backend != "local":
        assert result.privilege_drop and gold.privilege_drop


@pytest.mark.bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="a bwrap evaluator holds capabilities only as root")
def test_a_bwrap_evaluator_that_cannot_drop_privileges_refuses_to_grade(calc_task, tmp_path):
    """The bwrap evaluator holds 7 capabilities so that it can switch to a fresh uid. When
    no fresh uid can run the interpreter (here: gyre's Python in a folder only root may
    enter), it used to run the workspace's code as root with those capabilities; it must
    run nothing and report an ``infra_error`` that says why. The grading runs in a child
    process whose Python is such a virtualenv (mode 0700)."""
    venv = tmp_path / "private-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    venv.chmod(0o700)
    ws = write_tree(tmp_path / "ws", {"calc.py": PARTIAL + ATTACKS["junit_then_os_exit"]})
    script = (
        "import json, sys\n"
        "from gyre_env.scoring import GradingConfig, grade_workspace\n"
        "from gyre_env.tasks import load_task\n"
        "r = grade_workspace(load_task(sys.argv[1]), sys.argv[2], GradingConfig(backend='bwrap'))\n"
        "print(json.dumps({**r.summary(), 'commands': len(r.commands)}))\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script, str(calc_task.source), str(ws)],
        env={**os.environ, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == "infra_error", result
    assert result["commands"] == 0, "no test command may run"
    assert "the bwrap evaluator refused to grade" in result["reason"], result["reason"]
    assert "import pytest" in result["reason"] and "as root" in result["reason"]


# Run at import by the tested process: look for the run's keys (their first 16 bytes, raw
# and in hex) anywhere in its own memory, and raise (a collection error: score 0) if one
# is there. The needles are built at run time and skipped where they lie; a planted copy
# of a third needle must be found, so the scan is shown to work.
SCAN = """
import ctypes, os

def _needle(masked):
    return bytes(b ^ 0xFF for b in masked)

def _scan(needles):
    own = {id(n) + bytes.__basicsize__ - 1 for n in needles}
    buf = bytearray(1 << 20)
    cbuf = (ctypes.c_char * len(buf)).from_buffer(buf)
    hits = {n: [] for n in needles}
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    with open("/proc/self/maps") as fh:
        maps = fh.read().splitlines()
    for line in maps:
        span, perms = line.split()[:2]
        if not perms.startswith("r"):
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        for at in range(start, end, len(buf)):
            n = min(len(buf), end - at)
            try:
                got = os.preadv(fd, [memoryview(buf)[:n]], at)
            except OSError:
                break
            for needle in needles:
                i = buf.find(needle, 0, got)
                while i >= 0:
                    if at + i not in own:
                        hits[needle].append(hex(at + i))
                    i = buf.find(needle, i + 1, got)
            ctypes.memset(cbuf, 0, n)
    os.close(fd)
    return hits

_raw, _hex, _probe = (_needle(m) for m in (MASKED_RAW, MASKED_HEX, MASKED_PROBE))
_planted = bytearray(_probe)
_hits = _scan([_raw, _hex, _probe])
if not _hits[_probe]:
    raise RuntimeError("SCAN BROKEN: the planted copy was not found")
if _hits[_raw] or _hits[_hex]:
    raise RuntimeError(f"KEY FOUND in the tested process: {_hits[_raw]} {_hits[_hex]}")
"""


def _masked(data: bytes) -> str:
    return repr(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_tested_process_holds_no_key(backend, calc_task, tmp_path, monkeypatch):
    """The keys that authenticate the verdict never reach the process that runs the
    workspace's code: not in a file, a variable, an argument, a pipe, nor its memory."""
    from gyre_env.scoring import final

    # the run's keys, fixed here (random-looking bytes) so the scan knows what to seek
    key = hashlib.sha256(b"gyre test key").digest()
    made = []

    def fixed(n: int):
        made.append(n)
        return final._Keys(nonce="n" * 32, keys=(key,) * n)

    monkeypatch.setattr(final._Keys, "new", staticmethod(fixed))
    probe = b"gyre-probe-" + bytes(range(200, 205))
    code = (
        f"MASKED_RAW = {_masked(key[:16])}\nMASKED_HEX = {_masked(key[:16].hex().encode())}\n"
        f"MASKED_PROBE = {_masked(probe)}\n" + SCAN
    )
    ws = write_tree(tmp_path / "ws", {"calc.py": PARTIAL + code, "pyproject.toml": PYPROJECT})
    result = grade_workspace(calc_task, ws, _config(backend))
    assert made, "the grader made no keys"
    assert (result.status, result.score, result.passed) == ("ok", 0.25, 1), result.summary()


def test_an_interpreter_without_pytest_is_named_as_the_reason_not_permissions(tmp_path):
    """A virtualenv with gyre-env's extras but no pytest (``pip install gyre-env[proxy]``)
    made every gold episode of ``gyre train`` an infra error that blamed folder
    permissions; the evaluator's refusal now says the interpreter cannot import pytest
    and how to install it."""
    from gyre_env.scoring._evaluator_run import _refusal

    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    why = _refusal(python, 0)
    assert "cannot import pytest" in why and f"{python} -m pip install pytest" in why, why
    assert "unreadable" in _refusal(sys.executable, 0)  # pytest imports: the uid is why
