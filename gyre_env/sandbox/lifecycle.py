"""Leak-proofing: every sandbox is closed when its process ends, however it ends.

- Normal exit and ``KeyboardInterrupt``: an ``atexit`` hook closes live sandboxes.
- ``SIGTERM``: a handler closes them, then defers to the previous handler (or dies).
- ``SIGKILL`` cannot be caught: containers carry labels naming the owner process and a
  TTL, and ``reap()`` (run at start-up and by ``gyre sandbox gc``) removes those whose
  owner is gone or whose TTL has passed.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
import time
import weakref

log = logging.getLogger(__name__)

LABEL_OWNER_PID = "gyre.owner_pid"
LABEL_OWNER_HOST = "gyre.owner_host"
LABEL_OWNER_START = "gyre.owner_start"
LABEL_CREATED = "gyre.created"
LABEL_TTL = "gyre.ttl_s"

_live: weakref.WeakSet = weakref.WeakSet()
_installed = False
_lock = threading.Lock()


def process_start_time(pid: int) -> str:
    """The kernel's start time of ``pid`` (clock ticks since boot), to tell reused pids apart."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_labels(ttl_s: float) -> dict[str, str]:
    pid = os.getpid()
    return {
        LABEL_OWNER_PID: str(pid),
        LABEL_OWNER_HOST: socket.gethostname(),
        LABEL_OWNER_START: process_start_time(pid),
        LABEL_CREATED: f"{time.time():.3f}",
        LABEL_TTL: f"{ttl_s:.0f}",
    }


def owner_gone(labels: dict[str, str]) -> bool:
    """True when the labelled owner process no longer runs on this host."""
    if labels.get(LABEL_OWNER_HOST) != socket.gethostname():
        return False  # another host's sandbox: only its TTL can expire it
    try:
        pid = int(labels.get(LABEL_OWNER_PID, ""))
    except ValueError:
        return True
    start = process_start_time(pid)
    return not start or start != labels.get(LABEL_OWNER_START, start)


def expired(labels: dict[str, str], now: float | None = None) -> bool:
    try:
        created = float(labels[LABEL_CREATED])
        ttl = float(labels[LABEL_TTL])
    except (KeyError, ValueError):
        return False
    return (now or time.time()) > created + ttl


def track(sandbox) -> None:
    """Close ``sandbox`` when this process exits or is terminated."""
    global _installed
    with _lock:
        _live.add(sandbox)
        if _installed:
            return
        _installed = True
    atexit.register(close_all)
    if threading.current_thread() is threading.main_thread():
        _chain_sigterm()


def close_all() -> None:
    for sandbox in list(_live):
        try:
            sandbox.close()
        except Exception as e:  # closing is best effort at exit
            log.warning("could not close sandbox %s: %s", getattr(sandbox, "id", "?"), e)


def _chain_sigterm() -> None:
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        close_all()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread of the main interpreter
        pass
