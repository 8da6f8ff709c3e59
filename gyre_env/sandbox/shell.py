"""A persistent bash shell that runs one command at a time and survives what they do.

Every backend starts a process that is a bash reading commands from its stdin (``bash``
locally, ``docker exec -i CONTAINER bash`` or ``bwrap ... bash``). Each command is sent
as one statement that runs it as a background job in its own process group, so:

- the shell is never blocked: a timeout is enforced by sending ``kill -KILL -PGID`` to
  the same shell, which kills the command's process group;
- ``exit``, ``exec`` and ``cd`` in the command only affect its own subshell; stdin is
  ``/dev/null``, so a command cannot read (or close) the control stream;
- a command that kills the shell itself (``kill -9 $$``) is detected by EOF; the shell
  is started again and the result says ``shell_restarted``.

After every command, ended or timed out, the shell kills what the command left behind
(``reap``): with ``reap="group"`` the command's process group, so a ``setsid`` or
double-forked process survives; with ``reap="tree"`` (the local backend, which shares the
host's processes; its shell is a child subreaper, so orphans stay its descendants) every
descendant of the shell, ``setsid`` and double forks included; with ``reap="namespace"``
or ``"container"`` (bubblewrap and Docker, whose shell has a pid namespace of its own)
every process in the namespace but the shell and the processes that were there before the
first command: ``setsid``, double forks, ``SIGTERM``-proof daemons and fork bombs
included. The sweep uses only bash builtins (no fork: it works with the
pids limit exhausted) and first stops every process (``SIGSTOP``, round after round
until no new one appears, so a fork bomb cannot outrun it), then kills them. A command
that must leave a process running (the proxy forwarder, a CLI agent) says so with
``keep_background=True``: the processes it leaves and their descendants are kept until
the sandbox closes. Commands run with ``oom_score_adj`` 1000, so that at the memory
limit the kernel kills the command's processes before the shell.

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
_SWEEP_TIMEOUT = 30.0  # seconds the shell may take to kill what a command left behind
REAP_MODES = ("group", "tree", "namespace", "container")

# Bash (builtins only: no fork) that kills what a command left behind. ``$1``: keep
# the command's leftovers (and their descendants) instead. Group mode: the process group
# of the last job. The state of /proc is read with ``read`` and checked by pattern before
# any arithmetic, so a process name cannot inject code into the shell.
_REAP_GROUP = r"""
__gyre_after() { [[ $1 == keep ]] || kill -KILL -- -$! 2>/dev/null; return 0; }
"""
_REAP_SWEEP = r"""
declare -A __gyre_keep=() __gyre_roots=()
__gyre_stat() {
  local s=
  { read -r -d '' s < "/proc/$1/stat"; } 2>/dev/null
  s=${s##*) }; __gyre_st=${s%% *}; s=${s#* }; __gyre_pp=${s%% *}
  [[ $__gyre_st && $__gyre_pp =~ ^[0-9]+$ ]]
}
__gyre_kept() {
  local p=$1 d
  for ((d = 0; d < 64; d++)); do
    [[ ${__gyre_roots[$p]} ]] && return 0
    __gyre_stat "$p" && ((__gyre_pp > 1)) || return 1
    p=$__gyre_pp
  done
  return 1
}
__gyre_sweep() {
  local p r fresh
  local -A hit=()
  for ((r = 0; r < 200; r++)); do
    fresh=0
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [[ $p == "$$" || ${hit[$p]} ]] && continue
      __gyre_mine "$p" || continue
      __gyre_stat "$p" && [[ $__gyre_st != Z ]] || continue
      if [[ $__gyre_pp == "$$" ]]; then kill -KILL "$p"; else kill -STOP "$p"; fi 2>/dev/null
      hit[$p]=1 fresh=1
    done
    ((fresh)) || break
  done
  for p in "${!hit[@]}"; do kill -KILL "$p" 2>/dev/null; done
  # Wait (up to 5 s) until they are gone: a killed hog frees its memory as it exits.
  for ((r = 0; r < 250 && ${#hit[@]}; r++)); do
    for p in "${!hit[@]}"; do
      __gyre_stat "$p" && [[ $__gyre_st != Z ]] || unset "hit[$p]"
    done
    ((${#hit[@]})) && read -t 0.02 -u "$__gyre_idle" 2>/dev/null
  done
  return 0
}
__gyre_adopt() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p == "$$" ]] && continue
    __gyre_left "$p" || continue
    __gyre_roots[$p]=1
    printf '%s ' "$p"
  done
}
__gyre_after() { [[ $1 == keep ]] && __gyre_adopt; __gyre_sweep; }
"""
# In a pid namespace (bubblewrap, Docker): every process but those there before the first
# command and what keep_background kept; left behind = not a child of the shell.
_REAP_NAMESPACE = (
    _REAP_SWEEP
    + r"""
__gyre_mine() {
  [[ ! ${__gyre_keep[$1]} ]] || return 1
  ! { ((${#__gyre_roots[@]})) && __gyre_kept "$1"; }
}
__gyre_left() {
  [[ ! ${__gyre_keep[$1]} ]] && __gyre_stat "$1" && [[ $__gyre_st != Z && $__gyre_pp != "$$" ]]
}
"""
)
# On the host (the local backend): the shell's descendants only, the shell being a child
# subreaper (orphans of its commands, ``setsid`` or double-forked, are re-parented to it,
# not to init), bar what keep_background kept; everything else on the host is not looked at.
_REAP_TREE = (
    _REAP_SWEEP
    + r"""
__gyre_below() {
  local p=$1 d
  for ((d = 0; d < 64; d++)); do
    [[ ${__gyre_roots[$p]} ]] && return 1
    __gyre_stat "$p" || return 1
    [[ $__gyre_pp == "$$" ]] && return 0
    ((__gyre_pp > 1)) || return 1
    p=$__gyre_pp
  done
  return 1
}
__gyre_mine() { __gyre_below "$1"; }
__gyre_left() { __gyre_below "$1" && __gyre_stat "$1" && [[ $__gyre_st != Z ]]; }
"""
)


def _markers(token: str, rc: str | int) -> str:
    """Bash that ends a command's output: a stdout marker with the exit code, a stderr one."""
    return f"printf '\\036GYRE{token}:%d\\n' {rc}; printf '\\036GYRE{token}\\n' >&2"


def _marker_bytes(token: str) -> tuple[bytes, bytes]:
    return f"\x1eGYRE{token}:".encode(), f"\x1eGYRE{token}\n".encode()


def _pids(text: str) -> list[str]:
    """The pids the reaper printed (digits only: they go back into bash as array keys)."""
    return [word for word in text.split() if word.isdigit() and word.isascii()]


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
        reap: str = "group",
    ):
        """``reap``: how the processes a command leaves behind are found (see the module
        docstring): ``group``; ``tree`` (the shell's descendants: ``argv`` must make the
        shell a child subreaper, as the local backend does); ``namespace`` (each start of
        ``argv`` makes a new pid namespace: bubblewrap); ``container`` (one namespace that
        outlives the shell: ``docker exec``)."""
        if reap not in REAP_MODES:
            raise ValueError(f"reap must be one of {REAP_MODES}, got {reap!r}")
        self.reap = reap
        self._keep: list[str] | None = None  # pids there before the first command
        self._roots: set[str] = set()  # pids kept by keep_background (container mode)
        self._owner: int | None = None  # thread that holds _lock while a command runs
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
        self._starting = True
        try:
            result = self._run_locked(self._startup(), timeout=self.start_timeout, raw=True)
        finally:
            self._starting = False
        if result.exit_code != 0:
            raise SandboxError(f"sandbox shell did not start: {result.stderr.strip()[:500]}")
        if self.reap in ("namespace", "container") and (
            self._keep is None or self.reap == "namespace"
        ):
            self._keep = _pids(result.stdout)
            self._roots = set()

    def _startup(self) -> str:
        """The first statement of a shell: job control (each background job gets its own
        process group) and the reaper; in a pid namespace, the processes to keep."""
        # A pipe that never has data: ``read -t`` on it is the sweep's sleep (no fork).
        idle = "exec {__gyre_idle}<> <(:)"
        if self.reap == "group":
            return f"set -m; {_REAP_GROUP}\ntrue"
        if self.reap == "tree":  # a new shell: what the old one kept is no descendant of it
            return f"set -m; {_REAP_TREE}\n{idle}\ntrue"
        if self._keep is None or self.reap == "namespace":
            # A fresh namespace: what runs before any command (init, the container's main
            # process) is kept; the shell prints it for the host to remember.
            keep = (
                'for p in /proc/[0-9]*; do p=${p#/proc/}; [[ $p == "$$" ]] || '
                '__gyre_keep[$p]=1; done; printf "%s " "${!__gyre_keep[@]}"'
            )
        else:  # a new shell in the same container: keep what the first one kept
            kept = " ".join(f"[{p}]=1" for p in self._keep)
            roots = " ".join(f"[{p}]=1" for p in sorted(self._roots))
            keep = f"__gyre_keep=({kept}); __gyre_roots=({roots}); __gyre_sweep"
        return f"set -m; {_REAP_NAMESPACE}\n{keep}\n{idle}\ntrue"

    def close(self) -> None:
        """Stop the shell; a command running in another thread ends with SandboxClosedError.

        Never waits on a command: called from a signal handler (``lifecycle``) that
        interrupted this very thread in ``run``, it must not wait for the lock that thread
        holds. Killing the shell's process makes the running command end at once; the run
        that holds the lock then frees what is left."""
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()  # unblocks a running command (its reader sees EOF) before the lock
        if self._owner == threading.get_ident() or not self._lock.acquire(timeout=10):
            return
        try:
            self._stop_process()
        finally:
            self._lock.release()

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
        keep_background: bool = False,
    ) -> ExecResult:
        """Run ``cmd`` with bash; ``output_limit`` overrides the per-stream byte cap.

        When it ends (or is killed at ``timeout``) every process it left behind is killed
        (see the module docstring), unless ``keep_background``: then what it leaves
        running, and their descendants, are kept until the sandbox closes."""
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        env = {**self.env, **(env or {})}
        _check_env(env)
        exports = "".join(f"export {k}={shell_quote(v)}; " for k, v in env.items())
        where = shell_quote(cwd or self.workdir)
        # The command's processes are the kernel's first choice at the memory limit.
        body = (
            "{ echo 1000 > /proc/self/oom_score_adj; } 2>/dev/null; "
            f"{exports}cd -- {where} && eval {shell_quote(cmd)}"
        )
        with self._lock:
            self._owner = threading.get_ident()
            try:
                return self._run_reaped(body, timeout, output_limit, keep_background)
            finally:
                self._owner = None
                if self._closed:  # closed while the command ran: free what close left
                    self._stop_process()

    def _run_reaped(self, body: str, timeout: float, limit: int | None, keep: bool) -> ExecResult:
        if self._closed:
            raise SandboxClosedError("sandbox is closed")
        if self._dead:
            raise SandboxError(self._dead)
        restarted = self._proc is None or self._proc.poll() is not None
        if restarted:  # the previous command ended the shell (e.g. `kill -9 $$`)
            self._restart()
        try:
            result = self._run_locked(body, timeout=timeout, limit=limit)
        except _NotRun:  # the shell died before it read the command (it never ran)
            self._restart()
            restarted = True
            result = self._run_locked(body, timeout=timeout, limit=limit)
        if restarted:
            result.shell_restarted = True
            result.stderr += (
                "[gyre] the previous command ended the sandbox's shell; a new one was started\n"
            )
        self._reap(result, keep)
        return result

    def _reap(self, result: ExecResult, keep: bool) -> None:
        """Kill what the command left behind (or adopt it, ``keep``), through the shell."""
        after = self._run_locked(
            f"__gyre_after {'keep' if keep else 'kill'}", timeout=_SWEEP_TIMEOUT, raw=True
        )
        if after.shell_restarted:  # the sweep could not finish: a fresh shell swept instead
            result.shell_restarted = True
            result.stderr += (
                "[gyre] the sandbox's shell was restarted to clean up after the command\n"
            )
        elif keep and self.reap == "container":
            self._roots.update(_pids(after.stdout))

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
                    kill = (
                        f"kill -KILL -$! 2>/dev/null; __gyre_after kill 2>/dev/null; "
                        f"{_markers(token, _TIMEOUT_EXIT)}\n"
                    )
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
