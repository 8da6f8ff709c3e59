"""Attacks on the resource limits and on the host: each test attacks one property.

Docker and bubblewrap are both attacked; the local backend (which isolates nothing) is
included only where the property is about the shell, not about isolation.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time

import pytest

from gyre_env.sandbox import SandboxError

pytestmark = pytest.mark.timeout(120)


def _host_process_count() -> int:
    return sum(name.isdigit() for name in os.listdir("/proc"))


def _inside_process_count(sandbox) -> int:
    result = sandbox.exec("ls -d /proc/[0-9]* | wc -l", timeout=30)
    assert result.exit_code == 0, result.output
    return int(result.stdout.strip())


def test_fork_bomb_hits_the_pids_limit_and_the_host_is_fine(make, isolated_backend):
    sandbox = make(isolated_backend, pids=64)
    if isolated_backend == "bwrap":
        assert sandbox.cgroup is not None, "bubblewrap sandbox has no pids cgroup: no pids limit"
    baseline = _host_process_count()
    peak = [baseline]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _host_process_count())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # The bomb backgrounds itself; `sleep` keeps the command running until the timeout
        # kills its whole process group.
        result = sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 60", timeout=4)
    finally:
        stop.set()
        sampler.join()
    assert result.timed_out and result.exit_code == 124, result
    assert "Resource temporarily unavailable" in result.stderr, result.stderr[-2000:]
    # The bomb never had more than its 64 pids on the host (plus noise from other work).
    assert peak[0] - baseline < 64 + 200, (baseline, peak[0])
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    assert sandbox.exec("echo alive", timeout=30).stdout == "alive\n"
    deadline = time.monotonic() + 15
    while (count := _inside_process_count(sandbox)) > 8 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert count <= 8, f"{count} processes left in the sandbox after the bomb was killed"


def test_memory_bomb_is_oom_killed_and_reported(make, isolated_backend):
    sandbox = make(isolated_backend, memory_mb=128)
    hog = "a = []\nwhile True: a.append(b'x' * (8 << 20))"
    result = sandbox.exec(f"python3 -c {shlex.quote(hog)}", timeout=60)
    assert result.exit_code == 137, result
    assert result.oom_killed, result
    assert "memory limit" in result.stderr
    after = sandbox.exec("echo alive")
    assert after.stdout == "alive\n" and not after.oom_killed


def test_infinite_loop_times_out_and_the_sandbox_is_reusable(make, any_backend):
    sandbox = make(any_backend)
    result = sandbox.exec("trap '' TERM INT; while :; do :; done", timeout=1.5)
    assert result.timed_out and result.exit_code == 124 and not result.ok
    assert 1.5 <= result.duration_s < 8, result.duration_s
    assert "timed out" in result.stderr
    after = sandbox.exec("echo alive")
    assert after.stdout == "alive\n" and not after.timed_out and after.ok


_BIG_OUTPUT_PROBE = r"""
import json, sys
from gyre_env.sandbox import SandboxConfig, make_sandbox

def hwm_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

backend, image = sys.argv[1], sys.argv[2]
with make_sandbox(SandboxConfig(image=image), backend=backend) as sandbox:
    sandbox.exec("echo warm")
    before = hwm_kb()
    result = sandbox.exec("head -c 100000000 /dev/zero | tr '\\0' x; echo done >&2", timeout=120)
    after = hwm_kb()
print(json.dumps({"before_kb": before, "after_kb": after, "truncated": result.truncated,
                  "stdout_len": len(result.stdout), "stdout_x": result.stdout.count("x"),
                  "stdout_omitted": result.stdout_omitted,
                  "stderr_omitted": result.stderr_omitted,
                  "stderr": result.stderr, "exit_code": result.exit_code}))
"""


def test_100mb_of_output_is_truncated_and_host_memory_stays_bounded(request, any_backend):
    image = request.getfixturevalue("docker_image") if any_backend == "docker" else "-"
    proc = subprocess.run(
        [sys.executable, "-c", _BIG_OUTPUT_PROBE, any_backend, image],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["exit_code"] == 0, report
    assert report["truncated"]
    # The default cap keeps the first and last 512 KiB; the middle is counted, not marked
    # (the env that shows output to a model cuts it once, with its own marker).
    assert report["stdout_len"] == report["stdout_x"] == 1 << 20
    assert report["stdout_omitted"] == 100_000_000 - (1 << 20)
    assert report["stderr"] == "done\n" and report["stderr_omitted"] == 0
    growth_mb = (report["after_kb"] - report["before_kb"]) / 1024
    assert growth_mb < 40, f"host process peak memory grew {growth_mb:.0f} MB for 100 MB output"


def test_non_utf8_output_is_decoded_with_replacement(make, any_backend):
    sandbox = make(any_backend)
    result = sandbox.exec(r"printf 'a\xff\xfeb \xc3\x28 ok\n'; printf 'e\x80r\n' >&2")
    assert result.exit_code == 0
    assert result.stdout == "a\ufffd\ufffdb \ufffd( ok\n"
    assert result.stderr == "e\ufffdr\n"


_CONNECT_PROBE = r"""
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        print(target, "CONNECTED")
    except OSError as e:
        print(target, "refused:", type(e).__name__, e)
"""


def _host_addresses() -> list[str]:
    import socket

    try:
        found = socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        found = []
    return sorted({"127.0.0.1", "172.17.0.1", *found})


def test_network_to_host_ports_and_outside_is_refused(make, isolated_backend):
    import socket

    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the host can
        listener.accept()[0].close()
        sandbox = make(isolated_backend)
        targets = [f"{a}:{port}" for a in _host_addresses()] + ["1.1.1.1:80", "8.8.8.8:53"]
        result = sandbox.exec(f"python3 -c {shlex.quote(_CONNECT_PROBE)} {' '.join(targets)}")
        assert result.exit_code == 0, result.output
        lines = result.stdout.strip().splitlines()
        assert len(lines) == len(targets), result.output
        assert not [line for line in lines if "CONNECTED" in line], result.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing from the sandbox ever reached the host listener
    finally:
        listener.close()


def _kill_from_outside(sandbox) -> None:
    if sandbox.backend == "docker":
        from gyre_env.sandbox.docker import docker_client

        docker_client().containers.get(sandbox.container.id).kill()
    else:
        os.kill(sandbox.shell._proc.pid, 9)  # the bwrap process (exec'd by the cgroup prefix)


@pytest.mark.timeout(60)
def test_sandbox_killed_from_outside_mid_command_raises_a_clear_error(make, isolated_backend):
    sandbox = make(isolated_backend)
    outcome = {}

    def run() -> None:
        try:
            outcome["result"] = sandbox.exec("sleep 30; echo finished", timeout=45)
        except SandboxError as e:
            outcome["error"] = e

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.5)
    start = time.monotonic()
    _kill_from_outside(sandbox)
    worker.join(timeout=20)
    assert not worker.is_alive(), "exec hung after the sandbox was killed"
    assert time.monotonic() - start < 20
    assert "error" in outcome, f"no SandboxError; got {outcome.get('result')}"
    assert sandbox.id in str(outcome["error"]) or "sandbox" in str(outcome["error"])
    assert not sandbox.alive()
    with pytest.raises(SandboxError):
        sandbox.exec("echo again", timeout=10)
