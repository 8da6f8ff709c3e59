"""What the local backend (no container) bounds: nothing a command leaves behind survives
it, ``setsid`` and double forks included; a cgroup's pids limit where cgroups are
writable; ``RLIMIT_NPROC`` for the user otherwise.

NEVER a fork bomb here: these processes run on the host. Every spawner below is bounded
(a handful of sleepers, a loop of at most 12).
"""

from __future__ import annotations

import os
import resource
import time

import pytest

from gyre_env.sandbox import SandboxConfig
from gyre_env.sandbox.local import LocalSandbox
from gyre_env.sandbox.shell import shell_quote

pytestmark = pytest.mark.timeout(120)

SPAWN = (
    "import subprocess\n"
    "ps = [subprocess.Popen(['sleep', '300'], start_new_session=True) for _ in range(5)]\n"
    "print(*[p.pid for p in ps])\n"
)
# A double fork out of a new session: the grandchild's parent exits at once.
DOUBLE_FORK = "(setsid bash -c 'sleep 301 & echo $!' &) ; sleep 0.2"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture
def local():
    sandbox = LocalSandbox(SandboxConfig(pids=64))
    yield sandbox
    sandbox.close()


def test_setsid_and_double_forked_processes_die_with_their_command(local):
    result = local.exec(f"python3 -c {shell_quote(SPAWN)}; {DOUBLE_FORK}", timeout=30)
    assert result.exit_code == 0, result.stderr
    pids = [int(w) for w in result.stdout.split()]
    assert len(pids) == 6, result.stdout
    time.sleep(0.2)
    left = [p for p in pids if _alive(p)]
    assert not left, f"left running after the command: {left}"
    start = time.monotonic()
    assert local.exec("echo ok", timeout=10).stdout == "ok\n"
    assert time.monotonic() - start < 5


def test_a_kept_background_process_survives_until_the_sandbox_closes(local):
    kept = local.exec("sleep 302 & echo $!", timeout=10, keep_background=True)
    pid = int(kept.stdout)
    gone = local.exec(f"python3 -c {shell_quote(SPAWN)}", timeout=30)
    assert _alive(pid), "keep_background keeps what the command left"
    assert not any(_alive(int(p)) for p in gone.stdout.split())
    local.close()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):  # no cgroup to kill it with: the test's own cleanup
        os.kill(pid, 9)
        if local.cgroup is not None:
            pytest.fail("the sandbox's cgroup should have killed its kept process on close")


def test_the_users_processes_are_capped_by_rlimit_nproc(local):
    soft = local.exec("ulimit -u", timeout=10).stdout.strip()
    assert soft.isdigit(), f"RLIMIT_NPROC is not set in the sandbox: {soft!r}"
    mine = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    assert mine == resource.RLIM_INFINITY or int(soft) <= mine
    tasks = sum(
        len(os.listdir(f"/proc/{p}/task")) for p in os.listdir("/proc") if p.isdigit() and _owned(p)
    )
    # the processes running at its start plus the config's 64, give or take the churn
    assert int(soft) <= tasks + 64 + 200, (soft, tasks)


def _owned(pid: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def test_a_cgroup_bounds_the_processes_where_cgroups_are_writable():
    sandbox = LocalSandbox(SandboxConfig(pids=12))
    try:
        if sandbox.cgroup is None:
            pytest.skip("/sys/fs/cgroup is not writable here: only RLIMIT_NPROC applies")
        # At most 20 sleepers (bounded): the pids limit of 12 refuses some of them.
        spawn = (
            "import subprocess\nok = err = 0\nfor _ in range(20):\n    try:\n"
            "        subprocess.Popen(['sleep', '30']); ok += 1\n"
            "    except OSError:\n        err += 1\nprint(ok, err)\n"
        )
        result = sandbox.exec(f"python3 -c {shell_quote(spawn)}", timeout=30)
        ok, err = (int(w) for w in result.stdout.split())
        assert err > 0 and ok < 12, (ok, err, result.stderr)
        assert sandbox.exec("echo ok", timeout=10).stdout == "ok\n"  # all reaped
    finally:
        sandbox.close()
