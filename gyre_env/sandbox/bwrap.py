"""BwrapSandbox: bubblewrap namespaces, no daemon.

Covers: new pid, network (loopback only), IPC, UTS and user namespaces with all
capabilities dropped; the host's system folders (``/usr``, ``/etc``) and the Python
running gyre (a virtualenv and its base; ``python3`` is the venv's) read-only, with
``/etc/shadow`` hidden and every folder of task data under them (an installed
``gyre_env`` with the built-in tasks' hidden tests and gold, a source checkout, Gyre's
cache of generated tasks; ``hostusr.task_data_folders``) covered by an empty tmpfs; no
host process (own ``/proc``) and no host environment variable (bwrap, the sandbox's pid 1,
runs with an empty environment); a private ``/workspace`` (a host temp folder),
``/tmp`` and ``/home``; memory and pids limits from a cgroup per sandbox (cgroup v1 or
v2), or from ``prlimit`` (address space only) where cgroups are not writable. The
sandbox dies with its owner process (``--die-with-parent``). After each command, every
process it left behind in the sandbox's pid namespace is killed (``setsid`` and fork
bombs included; see ``gyre_env.sandbox.shell``). Does not cover: reading world-readable
host files under ``/etc`` and ``/usr`` (task folders of your own placed there included:
keep them elsewhere), kernel exploits.

An *evaluator* sandbox (``evaluator=True``, used by the final grader) started by root
gets no user namespace (its uid map would hold uid 0 alone, so nothing in it could
``setuid``) and keeps the few capabilities the grader needs to run the tests as a fresh
unprivileged uid, as in Docker: CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, SETUID,
SETGID and KILL. The other namespaces and the read-only binds are the same; the tested
code runs as that uid with no capabilities. Without root it is an ordinary sandbox and
the grader reports ``privilege_drop=False``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from gyre_env.sandbox import hostusr, lifecycle, route
from gyre_env.sandbox.base import (
    WORKSPACE,
    SandboxConfig,
    SandboxError,
)
from gyre_env.sandbox.cgroup import CGROUP_ROOT, try_cgroup
from gyre_env.sandbox.files import ShellSandbox
from gyre_env.sandbox.shell import PersistentShell

log = logging.getLogger(__name__)

EVALUATOR_UNSHARE = ("--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")
"""An evaluator's namespaces: all but the user namespace (and the network one, added
unless the config asks for a network)."""
EVALUATOR_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_KILL",
)
WORKSPACE_PREFIX = "gyre-bwrap-"


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def require_bwrap() -> None:
    """Raise ``SandboxError`` naming the install (and the Docker alternative) without it."""
    if not bwrap_available():
        raise SandboxError(
            "sandbox backend 'bwrap' needs bubblewrap on PATH "
            "(apt install bubblewrap; dnf install bubblewrap), or choose 'docker'"
        )


class BwrapSandbox(ShellSandbox):
    """A bubblewrap sandbox around a persistent bash."""

    backend = "bwrap"

    def __init__(self, config: SandboxConfig | None = None, *, evaluator: bool = False):
        require_bwrap()
        self.config = config or SandboxConfig()
        # Started for the final grader by root: may switch to a fresh uid (see above).
        self.evaluator = evaluator and os.geteuid() == 0
        self.id = f"gyre-bwrap-{uuid.uuid4().hex[:12]}"
        self.workspace = WORKSPACE
        self._closed = False
        self.host_dir = tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{os.getpid()}-")
        os.makedirs(os.path.join(self.host_dir, "workspace"))
        self.cgroup = try_cgroup(
            self.id, self.config, "bubblewrap limits fall back to prlimit (address space)"
        )
        lifecycle.track(self)
        try:
            self.shell = PersistentShell(
                self._argv(),
                workdir=WORKSPACE,
                env=self.config.env,
                output_limit=self.config.output_limit,
                start_timeout=self.config.start_timeout_s,
                signal_is_fatal=True,
                reap="namespace",
            )
            if self.config.proxy_socket:
                self._start_forwarder()
        except BaseException:
            self.close()
            raise

    def _argv(self) -> list[str]:
        cfg = self.config
        # The Python running gyre, a virtualenv's included: its python3 (first on PATH) is
        # the one with gyre's pytest. A venv's base alone lacks it (Debian's python3 does).
        prefixes = list(dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)))
        path = ":".join([*(f"{p}/bin" for p in prefixes), "/usr/local/bin", "/usr/bin", "/bin"])
        # bwrap itself starts with an empty environment: it stays alive as the sandbox's
        # pid 1, whose /proc/1/environ the sandbox can read (the host's tokens and keys).
        argv = ["env", "-i", shutil.which("bwrap") or "bwrap"]
        argv += ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if cfg.network:
            argv.append("--share-net")
        if self.evaluator:
            at = argv.index("--unshare-all")  # after the `env -i bwrap` prefix
            argv[at : at + 1] = [*EVALUATOR_UNSHARE, *([] if cfg.network else ["--unshare-net"])]
            for cap in EVALUATOR_CAPS:
                argv += ["--cap-add", cap]
        argv += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        binds = ["/usr", "/etc"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else None
            if target:
                argv += ["--symlink", target, f"/{link}"]
            elif os.path.isdir(f"/{link}"):
                argv += ["--ro-bind", f"/{link}", f"/{link}"]
                binds.append(f"/{link}")
        for secret in ("/etc/shadow", "/etc/gshadow"):
            if os.path.exists(secret):
                argv += ["--ro-bind", "/dev/null", secret]
        argv += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--dir",
            "/home/sandbox",
            "--bind",
            os.path.join(self.host_dir, "workspace"),
            WORKSPACE,
            "--chdir",
            WORKSPACE,
            "--clearenv",
            "--setenv",
            "PATH",
            path,
            "--setenv",
            "HOME",
            "/home/sandbox",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "PYTHONUSERBASE",
            "/home/sandbox/.local",
        ]
        for prefix in prefixes:  # after the /tmp tmpfs, which would hide a venv under /tmp
            if prefix != "/usr" and not prefix.startswith("/usr/"):
                if self.evaluator:  # bwrap makes a mount's parents 0700: the uid needs in
                    for parent in reversed(Path(prefix).parents[:-1]):
                        argv += ["--perms", "0755", "--dir", str(parent)]
                argv += ["--ro-bind", prefix, prefix]
                binds.append(prefix)
        try:  # last of the binds: an empty read-only tmpfs over every folder of task data
            hidden = hostusr.masks((b, b) for b in binds)
        except ValueError as e:
            raise SandboxError(str(e)) from e
        for folder in hidden:
            argv += ["--tmpfs", folder, "--remount-ro", folder]
        if cfg.proxy_socket:
            host_dir, inside = route.socket_mount(cfg.proxy_socket)
            argv += ["--ro-bind", host_dir, inside]  # not replaceable
        argv += ["bash", "--noprofile", "--norc"]
        if self.cgroup is not None:
            return self.cgroup.enter_prefix() + argv
        return ["prlimit", f"--as={cfg.memory_mb << 20}", "--"] + argv

    def _oom_kills(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup is not None else 0

    def _release(self) -> None:
        if self.cgroup is not None:
            self.cgroup.destroy()
        shutil.rmtree(self.host_dir, ignore_errors=True)


def reap(dry_run: bool = False) -> list[str]:
    """Remove workspaces and cgroups left by bubblewrap sandboxes whose owner died (and
    empty cgroups of local sandboxes)."""
    removed = []
    tmp = Path(tempfile.gettempdir())
    for d in tmp.glob(f"{WORKSPACE_PREFIX}*"):
        try:
            pid = int(d.name[len(WORKSPACE_PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if lifecycle.process_start_time(pid):
            continue
        removed.append(str(d))
        if not dry_run:
            shutil.rmtree(d, ignore_errors=True)
    for parent in (CGROUP_ROOT / "gyre", CGROUP_ROOT / "pids/gyre", CGROUP_ROOT / "memory/gyre"):
        for d in parent.glob("gyre-*") if parent.is_dir() else ():  # bwrap's and local's
            try:
                if not (d / "cgroup.procs").read_text().strip() and not dry_run:
                    d.rmdir()
                    removed.append(str(d))
            except OSError:
                continue
    return removed
