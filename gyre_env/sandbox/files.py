"""What every backend shares: commands and file operations through the sandbox's own shell.

Paths are resolved *inside* the sandbox (``realpath -m``) so that ``..``, absolute paths
and symlinks planted by the agent cannot reach outside the workspace: any path whose
resolution leaves the workspace is refused with ``PathOutsideWorkspaceError``.
"""

from __future__ import annotations

import base64
import io
import tarfile
import threading
from pathlib import Path

from gyre_env.sandbox.base import (
    ExecResult,
    PathOutsideWorkspaceError,
    SandboxClosedError,
    SandboxConfig,
    SandboxError,
)
from gyre_env.sandbox.shell import PersistentShell, shell_quote
from gyre_env.tasks.archive import safe_extract

_OUTSIDE = 97
_MISSING = 98
_IS_DIR = 99
_FILE_LIMIT = 256 << 20  # bytes a single file transfer may carry


class ShellFileOps:
    """Mixin: needs ``self.shell`` (a PersistentShell) and ``self.workspace``."""

    shell: PersistentShell
    workspace: str

    def _resolved(self, path: str, then: str, check: str = "") -> str:
        """A bash snippet that resolves ``path`` into ``$__p`` and refuses outside paths."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise ValueError(f"invalid path {path!r}")
        target = path if path.startswith("/") else f"{self.workspace}/{path}"
        ws = shell_quote(self.workspace)
        return (
            f"__p=$(realpath -m -- {shell_quote(target)}) || exit {_OUTSIDE}; "
            f'case "$__p" in {ws}|{ws}/*) ;; *) printf %s "$__p" >&2; exit {_OUTSIDE};; esac; '
            f"{check}{then}"
        )

    def _file_cmd(self, path: str, script: str, what: str, timeout: float = 120.0) -> ExecResult:
        result = self.shell.run(script, timeout=timeout, output_limit=_FILE_LIMIT)
        if result.exit_code == _OUTSIDE:
            raise PathOutsideWorkspaceError(
                f"{what}: path {path!r} resolves to {result.stderr.strip()!r}, "
                f"outside the workspace {self.workspace}"
            )
        if result.exit_code == _MISSING:
            raise FileNotFoundError(f"{what}: no such file in the sandbox: {path!r}")
        if result.exit_code == _IS_DIR:
            raise IsADirectoryError(f"{what}: {path!r} is a directory")
        if result.exit_code != 0 or result.truncated:
            raise SandboxError(
                f"{what} {path!r} failed (exit {result.exit_code}): {result.stderr.strip()[:500]}"
            )
        return result

    def write_file(self, path: str, data: str | bytes) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        b64 = base64.b64encode(raw).decode()
        script = self._resolved(
            path,
            f'[ -d "$__p" ] && exit {_IS_DIR}; mkdir -p -- "$(dirname -- "$__p")" && '
            f'printf %s {b64} | base64 -d > "$__p"',
        )
        self._file_cmd(path, script, "write_file")

    def read_file(self, path: str) -> bytes:
        script = self._resolved(
            path,
            'base64 -w0 -- "$__p"',
            check=f'[ -d "$__p" ] && exit {_IS_DIR}; [ -f "$__p" ] || exit {_MISSING}; ',
        )
        return base64.b64decode(self._file_cmd(path, script, "read_file").stdout)

    def put_dir(self, local_dir: str, path: str = ".") -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for child in sorted(Path(local_dir).iterdir()):
                tar.add(child, arcname=child.name)
        b64 = base64.b64encode(buf.getvalue()).decode()
        script = self._resolved(
            path, f'mkdir -p -- "$__p" && printf %s {b64} | base64 -d | tar -xz -C "$__p"'
        )
        self._file_cmd(path, script, "put_dir", timeout=600)

    def get_dir(self, path: str, local_dir: str) -> None:
        script = self._resolved(
            path,
            'set -o pipefail; tar -cz -C "$__p" . | base64 -w0',
            check=f'[ -d "$__p" ] || exit {_MISSING}; ',
        )
        raw = base64.b64decode(self._file_cmd(path, script, "get_dir", timeout=600).stdout)
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            # The archive is agent-made: paths that would land outside local_dir are
            # refused; links that point outside (a venv's python) are skipped.
            safe_extract(tar, local_dir, skip_escaping_links=True)


class ShellSandbox(ShellFileOps):
    """Base of the backends: ``exec`` through the persistent shell, OOM reporting, the
    proxy route, and context-manager use. Subclasses start ``self.shell`` and define
    ``_release`` (what closing frees); those with a memory cgroup override ``_oom_kills``."""

    id: str
    config: SandboxConfig
    _closed: bool = False
    _close_lock = threading.Lock()  # closing is rare: one lock for all sandboxes is enough

    def exec(
        self,
        cmd: str,
        timeout: float = 60.0,
        cwd: str | None = None,
        env=None,
        keep_background: bool = False,
    ) -> ExecResult:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed")
        before = self._oom_kills()
        try:
            result = self.shell.run(
                cmd, timeout=timeout, cwd=cwd, env=env, keep_background=keep_background
            )
        except SandboxClosedError:
            raise
        except SandboxError as e:
            raise SandboxError(f"sandbox {self.id} died: {e}") from e
        if self._oom_kills() > before:
            result.oom_killed = True
            result.stderr += "[gyre] killed: the sandbox's memory limit was exceeded\n"
        return result

    def _oom_kills(self) -> int:
        """How many processes the kernel killed for memory so far (0: unknown)."""
        return 0

    def _start_forwarder(self) -> None:
        from gyre_env.sandbox import route

        cmd = route.start_command(self.config.proxy_socket, self.config.proxy_port)
        result = self.shell.run(cmd, keep_background=True)
        if result.exit_code != 0:
            raise SandboxError(f"proxy forwarder did not start: {result.stderr.strip()[:500]}")

    def alive(self) -> bool:
        return not self._closed and self.shell.alive

    def close(self) -> None:
        """Free everything the sandbox holds. Idempotent and thread-safe."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        shell = getattr(self, "shell", None)  # absent when the start failed before it
        if shell is not None:
            shell.close()
        self._release()

    def _release(self) -> None:
        """Backend resources beyond the shell (container, cgroup, workspace folder)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
