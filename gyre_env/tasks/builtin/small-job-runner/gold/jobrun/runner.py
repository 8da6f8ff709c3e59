"""Run shell commands in parallel on a WorkerPool."""

import os
import signal
import subprocess
import threading
from dataclasses import dataclass

from jobrun.pool import WorkerPool


@dataclass
class CommandResult:
    command: str
    status: str
    returncode: object
    stdout: str
    stderr: str


def _run_one(command, timeout):
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        return CommandResult(command, "timeout", None, "", "")
    status = "ok" if proc.returncode == 0 else "failed"
    return CommandResult(command, status, proc.returncode, out, err)


def run_commands(commands, workers=4, timeout=None, fail_fast=False):
    stop = threading.Event()

    def task(command):
        if fail_fast and stop.is_set():
            return CommandResult(command, "skipped", None, "", "")
        result = _run_one(command, timeout)
        if result.status in ("failed", "timeout"):
            stop.set()
        return result

    with WorkerPool(workers) as pool:
        return pool.map(task, list(commands))
