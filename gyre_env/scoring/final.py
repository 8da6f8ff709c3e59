"""The final score: hidden tests run against a copy of the workspace in a fresh sandbox.

``grade_workspace(task, folder)`` starts an evaluator sandbox from the task's image, puts
the workspace copy and the grader (``_evaluator_run.py``, ``_pytest_launcher.py``, the
hidden tests) in it, runs the task's test commands through bash (see
``_evaluator_run`` for what is locked down and why) and reads each pytest command's
verdict: score = passed / declared, capped at 1, counting only cases from the hidden test
files.

The verdict is decided outside the tested process, not read from a file the tested code
could write: the grader's pytest launcher relays pytest's events over a pipe to the
evaluator's root process, which MACs the bytes it received with a per-command key the
host made (the key never enters a process that runs workspace code), and the host
derives the cases from those events itself (``verdict`` says what that does and does not
guarantee). A stream that is not entirely the relay's, or in which the relay saw its
runner patched, is *tampered*: ``status="workspace_error"``, ``tampered=True``, score 0,
with no control run (nothing but the workspace's code interferes with that pipe). Not ``infra_error``: that would drop the episode from training and so
reward the attempt by hiding its failure. A stream that just stops (``os._exit``, a
crash) has no ``finish`` record and is *suspect*, like a missing report.

Who is to blame when grading fails: a run that leaves a report missing or unreadable,
times out, or kills the evaluator is *suspect*. The same grader then runs on the task's
gold solution (or an empty workspace when there is none) in another fresh evaluator. If
that control run works, the failure came from the workspace: ``status="workspace_error"``,
scored like any other result (a policy must not escape a low score by crashing the
grader). If the control fails too, or no evaluator could be started (missing image, no
daemon), ``status="infra_error"`` and the score is not valid.

``GradingConfig.memoize`` reuses the result of a byte-identical workspace of the same task
(keyed by a digest of every file's path, mode and bytes): a sharp policy's G attempts at
one task often write the same files, and for deterministic hidden tests regrading them can
only repeat the result. Identical workspaces graded at the same time share one evaluator
run; only valid results are kept (an ``infra_error`` is always retried).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import shutil
import tarfile
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from gyre_env.scoring.junit import TestCase, TestCounts, select_cases
from gyre_env.scoring.rewards import quantize
from gyre_env.scoring.verdict import (
    VerdictError,
    VerdictTampered,
    check_stream,
    junit_names,
    read_verdict,
)
from gyre_env.tasks import Task

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
NEUTRAL_INI = "[pytest]\n"


@dataclass(kw_only=True)
class GradingConfig:
    """How the final score is computed."""

    backend: str = "auto"
    """Sandbox backend of the evaluator (``auto``, ``docker``, ``bwrap``, ``local``)."""
    sandbox: dict = field(default_factory=dict)
    """``SandboxConfig`` fields for the evaluator (``image`` comes from the task)."""
    privilege_drop: bool = True
    """Run the test commands as a fresh unprivileged uid where the evaluator allows it."""
    control_run: bool = True
    """On a suspect run, grade the gold (or empty) workspace to decide who is to blame."""
    timeout_s: float | None = None
    """Limit for all test commands together; default: the task's ``grading_timeout_s``."""
    pytest_plugins: list[str] | None = None
    """Plugin modules pytest loads in the evaluator; None: every ``pytest11`` entry point
    of the image's own Python (never the workspace's). ``[]`` loads none (fastest)."""
    memoize: bool = False
    """Reuse the result of an earlier grading of a byte-identical workspace of the same
    task in this process (see the module docstring). Only for tasks whose hidden tests
    are deterministic (the ``nano`` tier's are); off by default."""


@dataclass(kw_only=True)
class CommandRun:
    """One test command as the evaluator ran it."""

    command: str
    exit_code: int
    timed_out: bool
    duration_s: float
    output: str
    report: str | None
    """Workspace-relative path in the evaluator of the command's verdict stream (a
    root-owned copy of the events the grader's relay sent), or None for a command without
    one."""
    verdict_mac: str | None = None
    """The evaluator's MAC of those bytes (``verdict.check_stream``)."""


@dataclass(kw_only=True)
class GradingResult:
    """The outcome of grading one workspace."""

    status: str
    """``ok``, ``workspace_error`` (scored; the workspace broke the run) or ``infra_error``."""
    score: float
    """passed / declared, capped at 1 (0.0 for ``infra_error``, which is not a valid score)."""
    declared: int
    counts: TestCounts = field(default_factory=TestCounts)
    reason: str = ""
    commands: list[CommandRun] = field(default_factory=list)
    privilege_drop: bool = False
    duration_s: float = 0.0
    control: GradingResult | None = None
    reused: bool = False
    """The result of an earlier run on a byte-identical workspace (``memoize``)."""
    tampered: bool = False
    """The workspace's code interfered with the grader's verdict (``status`` is then
    ``workspace_error`` and the score 0; ``reason`` says what was seen)."""

    @property
    def passed(self) -> int:
        return self.counts.passed

    @property
    def collected(self) -> int:
        return self.counts.collected

    @property
    def count_mismatch(self) -> bool:
        """Collected hidden cases differ from the declared count (reported, not fatal)."""
        return self.status != "infra_error" and self.collected != self.declared

    @property
    def valid(self) -> bool:
        return self.status != "infra_error"

    def summary(self) -> dict:
        """A JSON-able digest (no timings: equal inputs give equal digests)."""
        return {
            "status": self.status,
            "score": self.score,
            "declared": self.declared,
            "collected": self.collected,
            "passed": self.counts.passed,
            "failed": self.counts.failed,
            "errors": self.counts.errors,
            "skipped": self.counts.skipped,
            "count_mismatch": self.count_mismatch,
            "tampered": self.tampered,
            "reason": self.reason,
        }


def grade_workspace(
    task: Task, workspace: str | Path | None, config: GradingConfig | None = None
) -> GradingResult:
    """Grade a host folder (None: an empty workspace), with blame assignment."""
    config = config or GradingConfig()
    if config.memoize:
        return _MEMO.grade(task, workspace, config)
    return _grade_blamed(task, workspace, config)


def _grade_blamed(task: Task, workspace: str | Path | None, config: GradingConfig) -> GradingResult:
    result = _grade_once(task, workspace, config)
    if result.status != "suspect":
        return result
    if not config.control_run:
        result.status = "workspace_error"
        result.reason += " (no control run: counted against the workspace)"
        return result
    control = _control(task, config)
    result.control = control
    if control.status == "ok":
        result.status = "workspace_error"
        result.reason += f"; the grader works on the {_control_name(task)} workspace"
    else:
        result.status = "infra_error"
        result.score = 0.0
        result.reason += (
            f"; the grader also fails on the {_control_name(task)} workspace: {control.reason}"
        )
    return result


def grade_sandbox(task: Task, sandbox, config: GradingConfig | None = None) -> GradingResult:
    """Grade the workspace of a live agent sandbox (it is copied out, never graded in place)."""
    from gyre_env.sandbox import SandboxError

    config = config or GradingConfig()
    with tempfile.TemporaryDirectory(prefix="gyre-grade-copy-") as tmp:
        try:
            _copy_out(sandbox, tmp)
        except (SandboxError, OSError, ValueError, tarfile.TarError) as e:
            # A workspace the agent wedged or broke (a live sandbox) is the agent's failure.
            alive = _alive(sandbox)
            status = "workspace_error" if alive else "infra_error"
            why = "could not be copied out" if alive else "died before it could be copied out"
            return GradingResult(
                status=status,
                score=0.0,
                declared=task.test_count,
                reason=f"the agent's workspace {why}: {e}",
            )
        return grade_workspace(task, tmp, config)


def workspace_digest(workspace: str | Path | None) -> str:
    """A digest of a folder's tree: every entry's relative path, kind, mode and bytes
    (links by their target), in a fixed order. ``None`` (an empty workspace) has its own."""
    h = hashlib.blake2b(digest_size=20)
    if workspace is None:
        return "empty"
    root = Path(workspace)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = Path(dirpath).relative_to(root).as_posix()
        h.update(b"D\0" + rel.encode() + b"\0")
        for name in sorted(filenames):
            path = Path(dirpath, name)
            st = path.lstat()
            h.update(f"F\0{rel}/{name}\0{st.st_mode:o}\0".encode())
            if path.is_symlink():
                h.update(os.readlink(path).encode())
            else:
                h.update(str(st.st_size).encode() + b"\0")
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
    return h.hexdigest()


class _Memo:
    """Results by (task, grading config, workspace digest); one run per key at a time."""

    def __init__(self, capacity: int = 50_000):
        self.capacity = capacity
        self._done: OrderedDict[tuple, GradingResult] = OrderedDict()
        self._running: dict[tuple, threading.Event] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def grade(self, task: Task, workspace, config: GradingConfig) -> GradingResult:
        settings = dataclasses.asdict(dataclasses.replace(config, memoize=False))
        key = (
            task.id,
            str(task.source),
            json.dumps(settings, sort_keys=True, default=str),
            workspace_digest(workspace),
        )
        while True:
            with self._lock:
                if key in self._done:
                    self._done.move_to_end(key)
                    self.hits += 1
                    return dataclasses.replace(self._done[key], duration_s=0.0, reused=True)
                running = self._running.get(key)
                if running is None:
                    self._running[key] = threading.Event()
                    self.misses += 1
                    break
            running.wait()  # the same files are being graded: wait for that result
        try:
            result = _grade_blamed(task, workspace, config)
            if result.valid:
                with self._lock:
                    self._done[key] = result
                    while len(self._done) > self.capacity:
                        self._done.popitem(last=False)
            return result
        finally:
            with self._lock:
                self._running.pop(key).set()

    def clear(self) -> None:
        with self._lock:
            self._done.clear()
            self.hits = self.misses = 0


_MEMO = _Memo()


def _copy_out(sandbox, dest: str) -> None:
    import tarfile

    try:
        sandbox.get_dir(".", dest)
    except tarfile.TarError:
        # Links that point outside the workspace are refused by the copy; drop every link
        # and copy again (the workspace is the agent's: its links are its problem).
        shutil.rmtree(dest, ignore_errors=True)
        sandbox.exec("find . -type l -delete", timeout=120)
        sandbox.get_dir(".", dest)


def _alive(sandbox) -> bool:
    try:
        return bool(sandbox.alive())
    except Exception:
        return False


def _control_name(task: Task) -> str:
    return "gold" if task.gold_dir is not None else "empty"


_CONTROL_CACHE: dict[tuple, GradingResult] = {}


def _control(task: Task, config: GradingConfig) -> GradingResult:
    key = (task.id, task.source, config.backend, json.dumps(config.sandbox, sort_keys=True))
    if key not in _CONTROL_CACHE:
        # The control gets the task's own time limit, not a caller's shorter override.
        result = _grade_once(task, task.gold_dir, dataclasses.replace(config, timeout_s=None))
        if result.status == "ok" and task.gold_dir is not None and result.counts.passed == 0:
            result.status, result.reason = "suspect", "the gold solution passes no test"
        _CONTROL_CACHE[key] = result
    return _CONTROL_CACHE[key]


def _grade_once(task: Task, workspace: str | Path | None, config: GradingConfig) -> GradingResult:
    from gyre_env.sandbox import SandboxConfig, SandboxError

    start = time.monotonic()
    declared = task.test_count
    try:
        sandbox = _evaluator(
            SandboxConfig.from_dict({**config.sandbox, "image": task.image}), config.backend
        )
    except Exception as e:  # no daemon, missing image, bad config: nothing the agent did
        return GradingResult(
            status="infra_error",
            score=0.0,
            declared=declared,
            reason=f"could not start an evaluator sandbox: {type(e).__name__}: {e}",
            duration_s=time.monotonic() - start,
        )
    try:
        result = _run_in(sandbox, task, workspace, config)
    except (SandboxError, OSError, ValueError, KeyError) as e:
        # A dead evaluator is outside the agent's reach (it runs unprivileged there and cannot
        # kill the container): infra_error. A live one that failed is judged by a control run.
        dead = isinstance(e, SandboxError) and not _alive(sandbox)
        result = GradingResult(
            status="infra_error" if dead else "suspect",
            score=0.0,
            declared=declared,
            reason=f"the evaluator {'died' if dead else 'failed'}: {type(e).__name__}: {e}",
        )
    finally:
        sandbox.close()
    result.duration_s = time.monotonic() - start
    return result


def _evaluator(sandbox_config, backend: str):
    """A fresh evaluator sandbox, one that can drop privileges (bubblewrap's and Docker's
    evaluators keep the capabilities for it that an agent's sandbox does not get)."""
    from gyre_env.sandbox import choose_backend, make_sandbox

    name = choose_backend(backend)
    if name == "bwrap":
        from gyre_env.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(sandbox_config, evaluator=True)
    if name == "docker":  # keeps the capabilities its grader drops privileges with
        from gyre_env.sandbox.docker import DockerSandbox

        return DockerSandbox(sandbox_config, evaluator=True)
    return make_sandbox(sandbox_config, backend)


def _run_in(sandbox, task: Task, workspace, config: GradingConfig) -> GradingResult:
    ws = sandbox.workspace
    timeout = float(config.timeout_s or task.grading_timeout_s)
    with tempfile.TemporaryDirectory(prefix="gyre-grade-stage-") as tmp:
        stage = Path(tmp)
        repo, grader = stage / "repo", stage / "grader"
        if workspace is not None:
            shutil.copytree(workspace, repo, symlinks=True)
        else:
            repo.mkdir()
        grader.mkdir()
        shutil.copytree(task.hidden_tests_dir, grader / "hidden")
        shutil.copyfile(_HERE / "_evaluator_run.py", grader / "run.py")
        shutil.copyfile(_HERE / "_pytest_launcher.py", grader / "launch.py")
        (grader / "pytest.ini").write_text(NEUTRAL_INI)
        commands = task.grading_commands(f"{ws}/grader/out")
        keys = _Keys.new(len(commands))
        keys.write(grader / "keys.json")
        plan = {
            "workspace": ws,
            "repo": f"{ws}/repo",
            "remove": list(task.remove_before_grading),
            "timeout_s": timeout,
            "privilege_drop": config.privilege_drop,
            # bubblewrap's evaluator holds capabilities only for the drop: without the
            # drop it runs nothing (Docker's runs as the container's root, as before)
            "require_drop": sandbox.backend == "bwrap"
            and bool(getattr(sandbox, "evaluator", False)),
            "pytest_plugins": config.pytest_plugins,
            "commands": [{"command": c.command, "report": c.junit_path} for c in commands],
        }
        (grader / "plan.json").write_text(json.dumps(plan))
        sandbox.put_dir(str(stage), ".")
    proc = sandbox.exec(
        f"python3 -I {ws}/grader/run.py {ws}/grader/plan.json", timeout=timeout + 120, cwd=ws
    )
    try:
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return GradingResult(
            status="suspect",
            score=0.0,
            declared=task.test_count,
            reason=f"the grader crashed (exit {proc.exit_code}): {proc.output[-2000:]}",
        )
    if "refused" in summary:  # before any of the workspace's code ran: not its doing
        return GradingResult(
            status="infra_error",
            score=0.0,
            declared=task.test_count,
            reason=f"the {sandbox.backend} evaluator refused to grade: {summary['refused']}",
        )
    return _score(sandbox, task, summary, keys, f"{ws}/repo")


@dataclass(frozen=True)
class _Keys:
    """One grading run's nonce and a key per test command (never sent back out)."""

    nonce: str
    keys: tuple[bytes, ...]

    @classmethod
    def new(cls, n: int) -> _Keys:
        return cls(secrets.token_hex(16), tuple(secrets.token_bytes(32) for _ in range(n)))

    def write(self, path: Path) -> None:
        """The evaluator's copy: root's, mode 0600, deleted by it before any test runs."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"nonce": self.nonce, "keys": [k.hex() for k in self.keys]}, fh)


def _score(sandbox, task: Task, summary: dict, keys: _Keys, repo: str) -> GradingResult:
    runs = [CommandRun(**c) for c in summary["commands"]]
    cases: list[TestCase] = []
    problems, tampering = [], []
    for i, (spec, run) in enumerate(zip(task.grading_commands("."), runs, strict=True)):
        if run.timed_out:
            problems.append(f"`{run.command}` timed out")
        if spec.junit_path is None:
            continue
        if run.report is None:
            problems.append(f"`{run.command}` wrote no report (exit {run.exit_code})")
            continue
        data = sandbox.read_file(run.report)
        try:
            check_stream(data, key=keys.keys[i], nonce=keys.nonce, index=i, mac=run.verdict_mac)
            cases += read_verdict(data, rootdir=repo)
        except VerdictTampered as e:
            tampering.append(f"`{run.command}`: {e}")
        except VerdictError as e:
            problems.append(f"`{run.command}` gave no complete verdict (exit {run.exit_code}): {e}")
    drop = bool(summary.get("privilege_drop"))
    if tampering:
        return GradingResult(
            status="workspace_error",
            score=0.0,
            declared=task.test_count,
            reason="tampering with the grader: " + "; ".join(tampering + problems),
            commands=runs,
            privilege_drop=drop,
            tampered=True,
        )
    if task.fail_to_pass:
        counts, score = named_tests_score(cases, task.fail_to_pass, task.pass_to_pass)
    else:
        counts = TestCounts.of(select_cases(cases, task.hidden_test_paths))
        score = min(1.0, counts.passed / task.test_count)
    score = quantize(score)
    return GradingResult(
        status="suspect" if problems else "ok",
        score=score,
        declared=task.test_count,
        counts=counts,
        reason="; ".join(problems),
        commands=runs,
        privilege_drop=drop,
    )


def named_tests_score(
    cases: list[TestCase], fail_to_pass: list[str], pass_to_pass: list[str]
) -> tuple[TestCounts, float]:
    """A SWE-style score: the named tests' cases (a node id that did not run is a failure)
    and ``passed(FAIL_TO_PASS) / (len(FAIL_TO_PASS) + failed(PASS_TO_PASS))``: the share of
    the tests the change must fix that pass, each PASS_TO_PASS regression one more failure.
    The unchanged repository scores 0 and the reference change 1."""
    by_key = {c.key: c for c in cases}

    def case_of(nodeid: str) -> TestCase:
        classname, name = junit_names(nodeid)
        found = by_key.get((classname, name))
        if found is not None:
            return found
        path = nodeid.split("::", 1)[0]
        return TestCase(
            classname=classname, name=name, file=path, outcome="error", message="did not run"
        )

    fixed = [case_of(n) for n in fail_to_pass]
    kept = [case_of(n) for n in pass_to_pass]
    counts = TestCounts.of(fixed + kept)
    regressions = sum(c.outcome != "passed" for c in kept)
    passed = sum(c.outcome == "passed" for c in fixed)
    return counts, passed / (len(fail_to_pass) + regressions)
