"""LocalSandbox: a bash subprocess in a temporary folder. For development only.

It isolates NOTHING: the agent's commands run as your user, see your files, your network
and your processes. It exists so that Gyre runs where neither Docker nor bubblewrap is
available; every start logs a loud warning.

What a backend without containers can still bound, it does:

- After each command every process it left behind is killed: the shell is a child
  subreaper (``PR_SET_CHILD_SUBREAPER``), so a ``setsid`` or double-forked process is
  re-parented to it instead of to init and stays its descendant; the shell's reaper
  (``reap="tree"`` in ``gyre_env.sandbox.shell``) stops, then kills, every descendant.
- Where ``/sys/fs/cgroup`` is writable (root, or a delegated subtree) the shell runs in a
  cgroup of its own with the config's ``pids`` and ``memory_mb`` limits (as bubblewrap).
- ``RLIMIT_NPROC`` lets the user start at most ``pids`` processes beyond those it runs
  when the sandbox starts. The kernel counts every process of the user, the sandbox's and
  others alike, and does not enforce it for root (nor for ``CAP_SYS_RESOURCE``): there only
  the cgroup bounds a fork bomb.

Not covered: a process that leaves the tree on purpose (a daemon started through another
service, ``systemd-run``, ``at``), or one orphaned when the shell itself dies (it is
re-parented above it); anything else a process of your user can do. Never run code you
would not run yourself on this backend; use Docker or bubblewrap.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import uuid

from gyre_env.sandbox.base import SandboxConfig
from gyre_env.sandbox.cgroup import try_cgroup
from gyre_env.sandbox.files import ShellSandbox
from gyre_env.sandbox.shell import PersistentShell

log = logging.getLogger(__name__)

WARNING = (
    "LocalSandbox isolates NOTHING: agent commands run on this host as this user, with "
    "its files and network. Use Docker or bubblewrap for anything but development."
)

# Run as `python -I -c LIMITED PIDS bash ...`: become a child subreaper, cap the user's
# processes at those running now plus PIDS, then exec the shell (both survive exec).
LIMITED = r"""
import ctypes, os, resource, signal, sys
try:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
except (OSError, AttributeError) as e:
    print(f"gyre: no child subreaper ({e}): orphans may outlive commands", file=sys.stderr)
uid, tasks = os.getuid(), 0
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid:
            tasks += len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        pass
limit = tasks + int(sys.argv[1])
hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
resource.setrlimit(resource.RLIMIT_NPROC, (limit, hard))
for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; exec would keep that
    signal.signal(sig, signal.SIG_DFL)
os.execvp(sys.argv[2], sys.argv[2:])
"""


class LocalSandbox(ShellSandbox):
    """Runs commands in a temporary folder on the host."""

    backend = "local"

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        log.warning(WARNING)
        self.id = f"gyre-local-{uuid.uuid4().hex[:12]}"
        self.workspace = tempfile.mkdtemp(prefix="gyre-ws-")
        self._closed = False
        self.cgroup = try_cgroup(
            self.id, self.config, "the local sandbox is bounded by RLIMIT_NPROC only (not for root)"
        )
        argv = [sys.executable, "-I", "-c", LIMITED, str(self.config.pids)]
        argv += ["bash", "--noprofile", "--norc"]
        if self.cgroup is not None:
            argv = self.cgroup.enter_prefix() + argv
        try:
            self.shell = PersistentShell(
                argv,
                workdir=self.workspace,
                env={"HOME": self.workspace, **self.config.env},
                output_limit=self.config.output_limit,
                popen_kwargs={"start_new_session": True, "cwd": self.workspace},
                reap="tree",
            )
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        if self.cgroup is not None:
            self.cgroup.destroy()
        shutil.rmtree(self.workspace, ignore_errors=True)
