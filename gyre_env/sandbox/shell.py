"""A persistent bash shell that runs one command at a time and survives what they do.

Every backend starts a process that is a bash reading commands from its stdin (``bash``
locally, ``docker exec -i CONTAINER bash`` or ``bwrap ... bash``). Each command is sent
as one statement that runs it as a background job in its own process group, so:

- the shell is never blocked: a timeout is enforced by sending ``kill -KILL -PGID`` to
  the same shell, which kills the command and everything it started (bar ``setsid``);
- ``exit``, ``exec`` and ``cd`` in the command only affect its own subshell; stdin is
  ``/dev/null``, so a command cannot read (or close) the control stream;
- a command that kills the shell itself (``kill -9 $$``) is detected by EOF; the shell
  is started again and the result says ``shell_restarted``.

Output is delimited by per-command random markers written to stdout and stderr after
the command finishes. Of each stream the first and last ``output_limit // 2`` bytes are
kept and the middle is counted (in characters) and dropped, so 100 MB of output costs the
host a bounded amount of memory. This is a memory cap, not the cut a model sees: the
result says how much was dropped and adds no marker of its own; an env that shows output
to a model cuts it to its own, smaller limit and reports the whole count (see
``gyre_env.envs.nl2repo.tools.clip``).
"""

from __future__ import annotations

import codecs
import os
import secrets
import selectors
import subprocess
import threading
import time

from gyre_env.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT,
    ExecResult,
    SandboxClosedError,
    SandboxError,
)

_TIMEOUT_EXIT = 124
_READ_CHUNK = 1 << 16


def _markers(token: str, rc: str | int) -> str:
    """Bash that ends a command's output: a stdout marker with the exit code, a stderr one."""
    return f"printf '\\036GYRE{token}:%d\\n' {rc}; printf '\\036GYRE{token}\\n' >&2"


def _marker_bytes(token: str) -> tuple[bytes, bytes]:
    return f"\x1eGYRE{token}:".encode(), f"\x1eGYRE{token}\n".encode()


def shell_quote(text: str) -> str:
    """Quote for bash with single quotes (no process is spawned to unquote)."""
    return "'" + text.replace("'", "'\\''") + "'"


def _check_env(env: dict[str, str]) -> None:
    for key in env:
        if not key.isidentifier():
            raise ValueError(f"invalid environment variable name {key!r}")


class _Stream:
    """Collects one stream: its first and last ``limit // 2`` bytes, and its size.

    The bytes in between are counted and dropped, so a command's output costs the host
    at most ``limit`` bytes per stream. All bytes go through one incremental UTF-8 decoder
    (the text's ``errors="replace"`` decoding), so the characters dropped are counted
    exactly: ``omitted_chars`` is what the caller's truncation marker reports.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()  # the last limit // 2 bytes, once the head is full
        self.pending = b""  # last bytes seen, which may be the start of a marker
        self.dropped = 0
        self.chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._text: str | None = None
        self.omitted_chars = 0

    def feed(self, data: bytes, marker: bytes) -> int | None:
        """Add ``data``; return the index in ``data`` just past ``marker``, if found there."""
        window = self.pending + data
        at = window.find(marker)
        if at >= 0:
            self._keep(window[:at])
            end = at + len(marker) - len(self.pending)
            self.pending = b""
            return end
        hold = len(marker) - 1  # a marker may start in these bytes: keep them back
        self._keep(window[: max(len(window) - hold, 0)])
        self.pending = window[max(len(window) - hold, 0) :]
        return None

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        self.chars += len(self._decoder.decode(data))
        room = self.limit - self.limit // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            excess = len(self.tail) - self.limit // 2
            if excess > 0:
                del self.tail[:excess]
                self.dropped += excess

    def text(self) -> str:
        """The stream's text: the head and the tail joined when the middle was dropped."""
        if self._text is None:
            self._keep(self.pending)
            self.pending = b""
            self.chars += len(self._decoder.decode(b"", final=True))
            if not self.dropped:
                self._text = (self.head + self.tail).decode("utf-8", errors="replace")
            else:
                # Cut at character starts, so the two parts decode as they do in the whole.
                head = codecs.getincrementaldecoder("utf-8")("replace").decode(self.head)
                skip = 0
                while skip < min(3, len(self.tail)) and 0x80 <= self.tail[skip] < 0xC0:
                    skip += 1
                self._text = head + self.tail[skip:].decode("utf-8", errors="replace")
            self.omitted_chars = self.chars - len(self._text)
        return self._text


class _NotRun(Exception):
    """The shell ended before acknowledging a command: the command never started."""


class PersistentShell:
    """One long-lived bash process behind ``argv``; ``run`` is thread-safe (serialised)."""

    def __init__(
        self,
        argv: list[str],
        *,
        workdir: str,
        env: dict[str, str] | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        start_timeout: float = 60.0,
        popen_kwargs: dict | None = None,
        signal_is_fatal: bool = False,
    ):
        self.argv = argv
        self.workdir = workdir
        self.env = dict(env or {})
        self.output_limit = output_limit
        self.start_timeout = start_timeout
        self._popen_kwargs = popen_kwargs or {}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._closed = False
        self._dead: str | None = None  # why the sandbox can no longer run commands
        self.signal_is_fatal = signal_is_fatal
        self._starting = False
        self.restarts = 0
        self._start()

    # -- lifecycle ---------------------------------------------------------------------

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            **self._popen_kwargs,
        )
        for stream in (self._proc.stdout, self._proc.stderr):
            os.set_blocking(stream.fileno(), False)
        # Job control gives each background job its own process group.
        self._starting = True
        try:
            result = self._run_locked("set -m; true", timeout=self.start_timeout, raw=True)
        finally:
            self._starting = False
        if result.exit_code != 0:
            raise SandboxError(f"sandbox shell did not start: {result.stderr.strip()[:500]}")

    def close(self) -> None:
        """Stop the shell; a command running in another thread ends with SandboxClosedError."""
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()  # unblocks a running command (its reader sees EOF) before the lock
        with self._lock:
            self._stop_process()

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    @property
    def alive(self) -> bool:
        return (
            not self._closed
            and not self._dead
            and self._proc is not None
            and self._proc.poll() is None
        )

    # -- commands ----------------------------------------------------------------------

    def run(
        self,
        cmd: str,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """Run ``cmd`` with bash; ``output_limit`` overrides the per-stream byte cap."""
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        env = {**self.env, **(env or {})}
        _check_env(env)
        exports = "".join(f"export {k}={shell_quote(v)}; " for k, v in env.items())
        where = shell_quote(cwd or self.workdir)
        body = f"{exports}cd -- {where} && eval {shell_quote(cmd)}"
        with self._lock:
            if self._closed:
                raise SandboxClosedError("sandbox is closed")
            if self._dead:
                raise SandboxError(self._dead)
            restarted = self._proc is None or self._proc.poll() is not None
            if restarted:  # the previous command ended the shell (e.g. `kill -9 $$`)
                self._restart()
            try:
                result = self._run_locked(body, timeout=timeout, limit=output_limit)
            except _NotRun:  # the shell died before it read the command (it never ran)
                self._restart()
                restarted = True
                result = self._run_locked(body, timeout=timeout, limit=output_limit)
            if restarted:
                result.shell_restarted = True
                result.stderr += (
                    "[gyre] the previous command ended the sandbox's shell; a new one was started\n"
                )
            return result

    def _restart(self) -> None:
        if self._closed:
            raise SandboxClosedError("the sandbox was closed while a command ran")
        self._stop_process()
        self.restarts += 1
        self._start()

    def _run_locked(
        self, body: str, timeout: float, raw: bool = False, limit: int | None = None
    ) -> ExecResult:
        token = secrets.token_hex(8)
        if raw:
            stmt = f"{body}\n{_markers(token, '$?')}\n"
        else:
            stmt = (
                f"printf '\\036GYRE{token}+\\n'; "
                f"( ( {body} ) </dev/null; __gyre_rc=$?; {_markers(token, '$__gyre_rc')} ) "
                f"& disown\n"
            )
        start = time.monotonic()
        try:
            self._proc.stdin.write(stmt.encode())
        except (BrokenPipeError, OSError, AttributeError):
            if raw:
                return self._shell_died(start, _Stream(1), _Stream(1))
            raise _NotRun from None
        return self._collect(token, start, timeout, limit or self.output_limit, ack=not raw)

    def _collect(
        self, token: str, start: float, timeout: float, limit: int, ack: bool = False
    ) -> ExecResult:
        out, err = _Stream(limit), _Stream(limit)
        ack_marker = f"\x1eGYRE{token}+\n".encode() if ack else None
        before_ack = b""
        out_marker, err_marker = _marker_bytes(token)
        after = None  # bytes after the stdout marker, until the exit code's newline
        err_done = False
        timed_out = False
        sel = selectors.DefaultSelector()
        sel.register(self._proc.stdout, selectors.EVENT_READ, "out")
        sel.register(self._proc.stderr, selectors.EVENT_READ, "err")
        try:
            while after is None or b"\n" not in after or not err_done:
                remaining = start + timeout - time.monotonic()
                if remaining <= 0:
                    if timed_out:  # no answer even after the kill: start a fresh shell
                        self._restart()
                        return self._result(-9, out, err, start, timed_out=True, restarted=True)
                    timed_out, timeout = True, timeout + 10.0
                    # The job is the shell's last background job and leads its own process
                    # group; kill the group, then wait for fresh markers from the shell.
                    token = secrets.token_hex(8)
                    out_marker, err_marker = _marker_bytes(token)
                    after, err_done = None, False
                    kill = f"kill -KILL -$! 2>/dev/null; {_markers(token, _TIMEOUT_EXIT)}\n"
                    try:
                        self._proc.stdin.write(kill.encode())
                    except OSError:
                        return self._shell_died(start, out, err, timed_out)
                    continue
                for key, _ in sel.select(timeout=min(remaining, 1.0)):
                    try:
                        data = key.fileobj.read(_READ_CHUNK)
                    except (BlockingIOError, InterruptedError):
                        continue
                    if not data:
                        if key.data == "err":  # read stdout to its end before deciding
                            sel.unregister(key.fileobj)
                            continue
                        if ack_marker is not None and not timed_out:
                            raise _NotRun
                        return self._shell_died(start, out, err, timed_out)
                    if key.data == "out" and ack_marker is not None:
                        # Bytes before the acknowledgement come from earlier commands'
                        # background jobs: kept (bounded) as before, minus a partial marker.
                        window = before_ack + data
                        at = window.find(ack_marker)
                        if at < 0:
                            cut = max(len(window) - len(ack_marker) + 1, 0)
                            out.feed(window[:cut], out_marker)
                            before_ack = window[cut:]
                            continue
                        out.feed(window[:at], out_marker)
                        data = window[at + len(ack_marker) :]
                        ack_marker = None
                    if key.data == "err":
                        err_done = err_done or err.feed(data, err_marker) is not None
                    elif after is not None:
                        after += data
                    else:
                        at = out.feed(data, out_marker)
                        if at is not None:
                            after = data[at:]
        finally:
            sel.close()
        try:
            exit_code = int(after.split(b"\n", 1)[0])
        except ValueError:
            exit_code = -1
        return self._result(exit_code, out, err, start, timed_out=timed_out)

    def _result(self, code, out, err, start, timed_out=False, restarted=False) -> ExecResult:
        stdout, stderr = out.text(), err.text()
        if timed_out:
            stderr += "\n[gyre] command timed out and was killed\n"
        return ExecResult(
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            duration_s=time.monotonic() - start,
            timed_out=timed_out,
            truncated=bool(out.dropped or err.dropped),
            stdout_omitted=out.omitted_chars,
            stderr_omitted=err.omitted_chars,
            shell_restarted=restarted,
            oom_killed=False,
        )

    def _shell_died(self, start, out, err, timed_out=False) -> ExecResult:
        """The shell exited mid-command (the command killed it, or the sandbox died)."""
        if self._closed:
            raise SandboxClosedError("the sandbox was closed while a command ran")
        try:
            code = self._proc.wait(timeout=2) if self._proc else None
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0 and self.signal_is_fatal and not self._starting:
            # The sandbox's own process (bwrap, `docker exec`) got a signal: something outside
            # killed the sandbox. A command ending its shell shows as exit 128+N instead.
            self._stop_process()
            self._dead = f"the sandbox was killed from outside (signal {-code})"
            raise SandboxError(self._dead)
        if self._starting:
            err_text = err.text().strip()[:500]
            self._stop_process()
            raise SandboxError(f"the sandbox's shell could not start (exit {code}): {err_text}")
        self._stop_process()
        try:
            self._restart()
        except (SandboxError, OSError) as e:
            raise SandboxError(
                f"the sandbox's shell died (exit {code}) and could not be restarted: {e}"
            ) from e
        result = self._result(
            128 + 9 if code is None or code < 0 else code, out, err, start, timed_out
        )
        result.shell_restarted = True
        result.stderr += "\n[gyre] the command ended the sandbox's shell; a new shell was started\n"
        return result
