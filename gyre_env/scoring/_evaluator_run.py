"""Runs INSIDE the evaluator sandbox, as root, with the image's own Python (stdlib only).

    python3 -I <grader>/run.py <grader>/plan.json

The host put two folders in the evaluator's workspace: ``repo/`` (a copy of the agent's
workspace) and ``grader/`` (this script, the pytest launcher, the hidden tests, the plan).
This script, before any agent-written code runs:

1. deletes the task's ``remove`` paths, every ``conftest.py``, ``__pycache__`` and ``.pyc``
   from the copy, then copies the hidden tests over it;
2. picks an unprivileged uid (random, unused) and checks it can run the interpreter; the
   copy becomes that uid's, except the hidden test files (root's, read-only) and the
   folders that hold them (root's, sticky, group-writable): the agent's code can add
   files next to the hidden tests but cannot change, move or delete them;
3. writes PATH shims: ``pytest``, ``py.test`` and ``python* -m pytest`` run the grader's
   launcher with ``python -I`` (no cwd, no user site, no PYTHON* variables), ``pip`` runs
   the real pip of this interpreter;
4. runs each test command through ``bash -c`` as that uid in a clean environment
   (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, a private ``PYTHONUSERBASE`` for ``pip install``,
   no network index), each report path deleted just before its command, every process of
   the uid killed after it, so nothing the install step started can write a report later;
5. gives each reporting test command (one with a report path) the verdict channel: a
   pipe on which the pytest launcher's relay streams pytest's events (the JUnit file the
   command names is never written: the launcher drops the option). This script reads it
   while the command runs, keeps what arrived in a root-owned
   ``reports/verdict-<i>.jsonl`` and MACs those bytes with the command's key (from
   ``keys.json``, which the host wrote and this script deletes before anything else
   runs; no key ever reaches a process that runs workspace code), so the host knows the
   bytes are the ones this process received;
6. prints a JSON summary on stdout.

When the uid cannot be used (not root, or the interpreter is not readable by others, as
with a Python under /root on a bare host) the commands run as the current user and the
summary says ``"privilege_drop": false``; unless the plan says ``require_drop`` (an
evaluator that holds capabilities only for the drop: bubblewrap's), which then runs no
command and prints ``{"refused": reason}`` instead.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

TAIL = 6000  # bytes of each command's output kept
MAX_VERDICT_BYTES = 64 << 20  # more than this on the verdict pipe is not a verdict
VERDICT_DRAIN_S = 5.0  # how long the pipe is read after its command ended


def main(plan_path: str) -> int:
    with open(plan_path) as fh:
        plan = json.load(fh)
    grader = os.path.dirname(os.path.abspath(plan_path))
    grants = _take_keys(os.path.join(grader, "keys.json"))
    repo = plan["repo"]
    # Not resolved: a virtualenv's python3 is a link to its base interpreter, which alone
    # has no pytest (bubblewrap runs gyre's own venv, read-only, first on PATH).
    python = os.path.abspath(sys.executable)
    out = os.path.join(grader, "out")
    home, userbase, tmp = (os.path.join(grader, d) for d in ("home", "userbase", "tmp"))
    for d in (out, home, userbase, tmp):
        os.makedirs(d, exist_ok=True)
    hidden = os.path.join(grader, "hidden")
    for rel in plan["remove"]:
        _remove(os.path.join(repo, rel))
    _sweep(repo, keep=set())
    _overlay(hidden, repo)
    hidden_files = set(_files(hidden))
    uid = _pick_uid() if plan.get("privilege_drop", True) else None
    if uid is not None and not _runs_pytest(python, uid, grader):
        uid = None
    if uid is None and plan.get("require_drop"):
        # This evaluator holds capabilities (bubblewrap's, for the drop): the workspace's
        # code must never run with them. No test runs; the host reports an infra_error.
        print(json.dumps({"refused": _refusal(python, os.geteuid())}))
        return 3
    if uid is not None:
        _own(repo, uid, hidden_files)
        for d in (out, home, userbase, tmp):
            os.chown(d, uid, uid)
    _write_shims(grader, python)
    ini = os.path.join(repo, "pytest.ini") if "pytest.ini" in hidden_files else None
    env = _command_env(grader, home, userbase, tmp, ini or os.path.join(grader, "pytest.ini"))
    if plan.get("pytest_plugins") is not None:
        env["GYRE_GRADER_PLUGINS"] = json.dumps(plan["pytest_plugins"])
    deadline = time.monotonic() + float(plan["timeout_s"])
    results = []
    for i, step in enumerate(plan["commands"]):
        report = step.get("report")
        if report:
            _remove(report)
        _sweep(repo, keep=hidden_files)  # the install step may have planted conftest.py
        left = deadline - time.monotonic()
        grant = None
        if report:
            conftests = [os.path.join(repo, f) for f in hidden_files if _is_conftest(f)]
            grant = {**grants[i], "conftests": conftests}
        channel = _Channel(grant["conftests"]) if grant else None
        result = _run(step["command"], repo, env, uid, max(left, 0.5), channel)
        if uid is not None:
            _kill_uid(uid, python)
        result["report"] = result["verdict_mac"] = None
        if channel is not None:
            data = channel.finish()
            final = os.path.join(grader, "reports", f"verdict-{i}.jsonl")
            os.makedirs(os.path.dirname(final), exist_ok=True)
            with open(final, "wb") as fh:
                fh.write(data)
            result["report"] = os.path.relpath(final, plan["workspace"])
            result["verdict_mac"] = _stream_mac(grant, data)
        results.append(result)
    print(
        json.dumps(
            {"privilege_drop": uid is not None, "uid": uid, "python": python, "commands": results}
        )
    )
    return 0


def _refusal(python: str, euid: int) -> str:
    if not _runs_pytest(python):  # not a permission matter: the grader has no pytest
        return (
            f"{python} cannot import pytest, which runs the hidden tests: install it into "
            f"that interpreter ({python} -m pip install pytest; gyre-env's train extra has it)"
        )
    if euid != 0:
        return (
            f"the evaluator runs as uid {euid}, not root: it cannot switch to an "
            "unprivileged uid, and refuses to run the tests with its capabilities"
        )
    return (
        f"no unprivileged uid could run {python} -I -c 'import pytest' (is the "
        "interpreter, or a folder above it, unreadable by other users?): the evaluator "
        "refuses to run the tests as root with its capabilities"
    )


def _stream_mac(grant: dict, data: bytes) -> str:
    """What ``gyre_env.scoring.verdict.stream_mac`` checks: the run's nonce, the command's
    index and the bytes received, under the command's key."""
    head = f"{grant['nonce']}:{grant['index']}:".encode()
    return hmac.new(bytes.fromhex(grant["key"]), head + data, hashlib.sha256).hexdigest()


def _take_keys(path: str) -> list[dict]:
    """The host's per-command keys; the file is gone before any workspace code runs."""
    with open(path) as fh:
        data = json.load(fh)
    os.unlink(path)
    return [{"key": key, "nonce": data["nonce"], "index": i} for i, key in enumerate(data["keys"])]


def _is_conftest(rel: str) -> bool:
    return os.path.basename(rel) == "conftest.py"


class _Channel:
    """The pipe of one command's verdict: the launcher's relay writes pytest's events, this
    process reads them while the command runs. Nothing secret goes the other way."""

    def __init__(self, conftests: list[str]):
        self.conftests = conftests
        self.out_r, self.out_w = os.pipe()
        self.data = bytearray()
        self.overflow = False
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._pump, daemon=True)

    def env(self) -> dict:
        return {
            "GYRE_GRADER_VERDICT_FD": str(self.out_w),
            "GYRE_GRADER_CONFTESTS": json.dumps(self.conftests),
        }

    def started(self) -> None:
        """The command holds its end now; this process keeps only the records' reader."""
        os.close(self.out_w)
        self._reader.start()

    def _pump(self) -> None:
        drain_until = None
        while True:
            if self._stop.is_set() and drain_until is None:
                drain_until = time.monotonic() + VERDICT_DRAIN_S
            if drain_until is not None and time.monotonic() > drain_until:
                return
            ready, _, _ = select.select([self.out_r], [], [], 0.2)
            if not ready:
                if drain_until is not None:
                    return  # the command is over and the pipe is quiet
                continue
            chunk = os.read(self.out_r, 65536)
            if not chunk:
                return
            if len(self.data) + len(chunk) > MAX_VERDICT_BYTES:
                self.overflow = True
                return
            self.data.extend(chunk)

    def finish(self) -> bytes:
        """What arrived; a process left holding the pipe open is not waited for."""
        self._stop.set()
        self._reader.join()
        os.close(self.out_r)
        if self.overflow:
            return b"overflow: more than %d bytes on the verdict pipe\n" % MAX_VERDICT_BYTES
        return bytes(self.data)


def _remove(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _files(root: str) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def _sweep(repo: str, keep: set[str]) -> None:
    """Delete conftest.py files (bar the hidden ones), bytecode caches and .pyc files."""
    for dirpath, dirs, files in os.walk(repo):
        for d in list(dirs):
            if d == "__pycache__":
                _remove(os.path.join(dirpath, d))
                dirs.remove(d)
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), repo)
            if (name == "conftest.py" and rel not in keep) or name.endswith((".pyc", ".pyo")):
                _remove(os.path.join(dirpath, name))


def _overlay(src: str, dst: str) -> None:
    """Copy ``src`` over ``dst``; whatever stands at a target path (a link, a folder) goes."""
    for rel in _files(src):
        target = os.path.join(dst, rel)
        parent = os.path.dirname(target)
        # A planted link or file where a folder must be is removed, never followed.
        probe = dst
        for part in os.path.relpath(parent, dst).split(os.sep):
            if part in ("", "."):
                continue
            probe = os.path.join(probe, part)
            if os.path.islink(probe) or (os.path.exists(probe) and not os.path.isdir(probe)):
                _remove(probe)
        os.makedirs(parent, exist_ok=True)
        if os.path.lexists(target):
            _remove(target)
        shutil.copyfile(os.path.join(src, rel), target)


def _pick_uid() -> int | None:
    if os.geteuid() != 0:
        return None
    used = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                used.add(os.stat("/proc/" + entry).st_uid)
            except OSError:
                pass
    while True:
        uid = 200000 + secrets.randbelow(700000)
        if uid not in used:
            return uid


def _dropper(uid: int):
    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        os.umask(0o022)

    return drop


_CAN_IMPORT_PYTEST = (
    "import importlib.util as u, os, sys\n"
    "specs = [u.find_spec(m) for m in ('pytest', '_pytest')]\n"
    "sys.exit(not all(s and s.origin and os.access(s.origin, os.R_OK) for s in specs))"
)
"""Whether this interpreter finds pytest and may read it: what ``import pytest`` needs of
the uid (the interpreter, its ``sys.path`` and pytest's files readable), without
importing it: 35 ms against 125 ms on the CI machine, paid on every grade."""


def _runs_pytest(python: str, uid: int | None = None, cwd: str | None = None) -> bool:
    """Whether ``python`` can import pytest, as ``uid`` (None: as this process)."""
    try:
        proc = subprocess.run(
            [python, "-I", "-c", _CAN_IMPORT_PYTEST],
            preexec_fn=None if uid is None else _dropper(uid),
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _own(repo: str, uid: int, hidden_files: set[str]) -> None:
    """The copy becomes the uid's; hidden files and their folders stay root's."""
    guarded = {os.path.dirname(os.path.join(repo, rel)) for rel in hidden_files}
    for d in list(guarded):
        while d != repo and d.startswith(repo):
            d = os.path.dirname(d)
            guarded.add(d)
    guarded.add(repo)
    for dirpath, dirs, files in os.walk(repo):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            os.lchown(path, uid, uid)
    os.chown(repo, uid, uid)
    for rel in hidden_files:
        path = os.path.join(repo, rel)
        os.chown(path, 0, 0)
        os.chmod(path, 0o644)
    for d in guarded:
        os.chown(d, 0, uid)
        os.chmod(d, 0o1775)
    parent = os.path.dirname(repo)
    os.chmod(parent, os.stat(parent).st_mode | 0o755)


_PYTHON_SHIM = """#!/bin/bash
# python* -m pytest ... runs the grader's launcher; anything else runs the real interpreter.
args=("$@"); i=0
while [ $i -lt ${#args[@]} ]; do
  case "${args[$i]}" in
    -m) [ "${args[$((i+1))]}" = pytest ] && exec %(py)s -I %(launch)s "${args[@]:$((i+2))}"; break;;
    -mpytest) exec %(py)s -I %(launch)s "${args[@]:$((i+1))}";;
    -c|-) break;;
    -*) i=$((i+1));;
    *) break;;
  esac
done
exec %(py)s "$@"
"""


def _write_shims(grader: str, python: str) -> None:
    bindir = os.path.join(grader, "bin")
    os.makedirs(bindir, exist_ok=True)
    launch = os.path.join(grader, "launch.py")
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    shims = {
        "pytest": f'#!/bin/sh\nexec {python} -I {launch} "$@"\n',
        "py.test": f'#!/bin/sh\nexec {python} -I {launch} "$@"\n',
        "pip": f'#!/bin/sh\nexec {python} -m pip "$@"\n',
        "pip3": f'#!/bin/sh\nexec {python} -m pip "$@"\n',
    }
    for name in ("python", "python3", version):
        shims[name] = _PYTHON_SHIM % {"py": python, "launch": launch}
    for name, text in shims.items():
        path = os.path.join(bindir, name)
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o755)


def _command_env(grader: str, home: str, userbase: str, tmp: str, ini: str) -> dict:
    system_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return {
        # Console scripts the workspace installs come last: they cannot shadow a tool.
        "PATH": os.path.join(grader, "bin") + ":" + system_path + ":" + userbase + "/bin",
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUSERBASE": userbase,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "GYRE_GRADER_INI": ini,
        "PIP_USER": "1",
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip's inverted flag: "0" turns isolation off
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
        "PIP_NO_INPUT": "1",
        "PIP_NO_CACHE_DIR": "1",
    }


def _run(command: str, cwd: str, env: dict, uid: int | None, timeout: float, channel=None) -> dict:
    start = time.monotonic()
    fds = (channel.out_w,) if channel is not None else ()
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env={**env, **channel.env()} if channel is not None else env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=fds,
        preexec_fn=_dropper(uid) if uid is not None else None,
    )
    if channel is not None:
        channel.started()
    head, tail = bytearray(), bytearray()

    def pump() -> None:
        for chunk in iter(lambda: proc.stdout.read(65536), b""):
            if len(head) < TAIL // 3:
                head.extend(chunk[: TAIL // 3 - len(head)])
            tail.extend(chunk)
            del tail[: max(0, len(tail) - TAIL)]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        code = proc.wait()
    reader.join(timeout=5)
    text = tail.decode("utf-8", "replace")
    if len(head) + len(tail) > TAIL:
        text = head.decode("utf-8", "replace") + "\n[... output cut ...]\n" + text
    return {
        "command": command,
        "exit_code": code,
        "timed_out": timed_out,
        "duration_s": round(time.monotonic() - start, 3),
        "output": text,
    }


def _kill_uid(uid: int, python: str) -> None:
    """SIGKILL every process of ``uid`` (kill(-1) from that uid reaches exactly those, and
    on Linux never the caller). Three rounds in one process (``-S``: no site, 10 ms to
    start): a process forked while one round ran is caught by the next."""
    subprocess.run(
        [
            python,
            "-I",
            "-S",
            "-c",
            "import os, signal\nfor _ in range(3):\n"
            "    try: os.kill(-1, signal.SIGKILL)\n"
            "    except ProcessLookupError: pass",
        ],
        preexec_fn=_dropper(uid),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
