"""The Sandbox protocol: where agent-written code runs.

What a sandbox covers, by backend (see each backend's module docstring for details):

- ``DockerSandbox``: own filesystem, pid, network (off by default) and IPC namespaces;
  memory, CPU and pids limits from the kernel's cgroups; a writable ``/workspace``.
- ``BwrapSandbox``: bubblewrap namespaces (pid, net, ipc, uts), a read-only view of the
  host's system folders, a private ``/workspace`` and ``/tmp``; memory and pids limits
  through cgroups (prlimit where cgroups are not writable).
- ``LocalSandbox``: a subprocess in a temporary folder. It isolates nothing; it bounds
  processes with a cgroup where one is writable and ``RLIMIT_NPROC`` (not for root).

After every command (ended or timed out) the processes it left behind are killed: on
Docker and bubblewrap every process in the sandbox's pid namespace but the shell and
what ran before the first command (``setsid``, double forks, ``SIGTERM``-proof daemons
and fork bombs included); on the local backend every descendant of its shell, which is a
child subreaper (``setsid`` and double forks included). A command run
with ``keep_background=True`` keeps what it leaves (the proxy forwarder, a CLI agent).

What no backend covers: kernel exploits, side channels, and a fork bomb started by a
``keep_background`` command's processes (they are stopped only when the sandbox closes).

Every backend runs commands through one persistent shell (``gyre_env.sandbox.shell``)
and implements file operations on top of it, so a step costs milliseconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

WORKSPACE = "/workspace"
DEFAULT_OUTPUT_LIMIT = 1 << 20
"""Bytes of stdout (and of stderr) a sandbox holds per command: the first and last half.
A cap on the host's memory, not the cut a model sees; an env cuts tool output to its own
limit (``NL2RepoConfig.max_output_chars``), which always fits in the kept head and tail."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the command in it): dead container, lost shell."""


class ImageNotFoundError(SandboxError):
    """The sandbox's image does not exist on this machine (it has to be built first)."""

    def __init__(self, image: str, message: str):
        super().__init__(message)
        self.image = image


class SandboxEndedByCommand(SandboxError):
    """A command ended the sandbox itself (its container stopped while the command ran):
    the agent's doing, scored as ``agent_error``, never ``infra_error``."""


class SandboxClosedError(SandboxError):
    """An operation was attempted on a sandbox that was closed or killed."""


class PathOutsideWorkspaceError(ValueError):
    """A file API was given a path that resolves outside the workspace."""


@dataclass(kw_only=True)
class SandboxConfig:
    """How to start a sandbox. Unknown keys are rejected (see ``from_dict``)."""

    image: str = "gyre-base:latest"
    """Docker image to start (Docker backend only)."""
    memory_mb: int = 2048
    """Memory limit; a process that exceeds it is killed by the kernel."""
    cpus: float = 1.0
    """CPU quota in cores (Docker backend)."""
    pids: int = 256
    """Maximum number of processes and threads in the sandbox."""
    network: bool = False
    """Allow general network access. Off by default: only the proxy route is reachable."""
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    """Bytes of stdout and of stderr held per command (the first and last half); the middle
    is dropped and counted in ``ExecResult.stdout_omitted`` / ``stderr_omitted``. A memory
    cap: the NL2Repo env raises it to fit its ``max_output_chars``."""
    ttl_s: float = 6 * 3600
    """Time to live: the reaper removes a sandbox older than this even if its owner lives."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for every command."""
    proxy_socket: str | None = None
    """Host Unix socket of the model proxy; reachable inside at ``proxy_port`` on 127.0.0.1."""
    proxy_port: int = 8765
    """Port inside the sandbox where the proxy route listens."""
    start_timeout_s: float = 60.0
    """How long to wait for the sandbox's shell to answer after start."""

    @classmethod
    def from_dict(cls, data: dict) -> SandboxConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown sandbox config keys {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass
class ExecResult:
    """Outcome of one command."""

    exit_code: int
    """The command's exit status; 128+N when killed by signal N; 124 on timeout."""
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False
    """True when stdout or stderr exceeded the sandbox's ``output_limit``: its middle was
    dropped, and the text is its head and tail joined (with no marker)."""
    stdout_omitted: int = 0
    """Characters dropped from the middle of stdout (0 unless ``truncated``)."""
    stderr_omitted: int = 0
    """Characters dropped from the middle of stderr (0 unless ``truncated``)."""
    shell_restarted: bool = False
    """True when the command killed the persistent shell and it was started again."""
    oom_killed: bool = False
    """True when the kernel killed the command for exceeding the memory limit."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout then stderr, as an agent would see them in a terminal."""
        if self.stderr and self.stdout:
            return self.stdout + ("" if self.stdout.endswith("\n") else "\n") + self.stderr
        return self.stdout or self.stderr


@runtime_checkable
class Sandbox(Protocol):
    """One isolated place to run an episode's commands. Implementations are thread-safe:
    calls are serialised per sandbox; many sandboxes may run at once."""

    id: str
    workspace: str

    def exec(
        self,
        cmd: str,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        keep_background: bool = False,
    ) -> ExecResult:
        """Run ``cmd`` with bash in ``cwd`` (default: the workspace). What it leaves
        running when it ends is killed, unless ``keep_background``."""
        ...

    def write_file(self, path: str, data: str | bytes) -> None:
        """Write a file inside the workspace, creating parent folders."""
        ...

    def read_file(self, path: str) -> bytes:
        """Read a file inside the workspace."""
        ...

    def put_dir(self, local_dir: str, path: str = ".") -> None:
        """Copy a host folder's contents into the workspace at ``path``."""
        ...

    def get_dir(self, path: str, local_dir: str) -> None:
        """Copy a workspace folder's contents to a host folder."""
        ...

    def alive(self) -> bool:
        """Whether the sandbox can still run commands."""
        ...

    def close(self) -> None:
        """Free everything the sandbox holds. Idempotent."""
        ...
