"""A warm pool: N started sandboxes per config so an env reset does not pay a start.

A sandbox taken from the pool belongs to one episode only; when the episode ends it is
closed, never handed out again. A background thread refills the pool after each take.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
from collections.abc import Callable

from gyre_env.sandbox.base import Sandbox, SandboxConfig

log = logging.getLogger(__name__)


class SandboxPool:
    """Keeps ``size`` started sandboxes made by ``factory``; ``acquire`` takes one."""

    def __init__(self, factory: Callable[[], Sandbox], size: int = 2):
        if size < 0:
            raise ValueError(f"pool size must be >= 0, got {size}")
        self.factory = factory
        self.size = size
        self._idle: queue.Queue[Sandbox] = queue.Queue()
        self._wanted = threading.Semaphore(0)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.cold_starts = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._refill, name="gyre-sandbox-pool", daemon=True)
        for _ in range(size):
            self._wanted.release()
        self._thread.start()

    def _refill(self) -> None:
        while True:
            self._wanted.acquire()
            if self._closed.is_set():
                return
            try:
                sandbox = self.factory()
            except Exception as e:  # keep refilling; acquire() falls back to a cold start
                self.failures += 1
                log.warning("sandbox pool could not start a sandbox: %s", e)
                if self.failures > 3 * max(self.size, 1):
                    return
                self._wanted.release()
                self._closed.wait(1.0)
                continue
            with self._lock:
                if self._closed.is_set():
                    sandbox.close()
                    return
                self._idle.put(sandbox)

    def acquire(self) -> Sandbox:
        """A started sandbox for one episode; cold-started if the pool is empty."""
        if self._closed.is_set():
            raise RuntimeError("sandbox pool is closed")
        while True:
            try:
                sandbox = self._idle.get_nowait()
            except queue.Empty:
                self.cold_starts += 1
                return self.factory()
            self._wanted.release()  # replace what left the idle queue (handed out or dead)
            if sandbox.alive():
                return sandbox
            sandbox.close()

    def idle(self) -> int:
        return self._idle.qsize()

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until the pool holds ``size`` idle sandboxes (for benchmarks and tests)."""
        import time

        deadline = time.monotonic() + timeout
        while self._idle.qsize() < self.size and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._idle.qsize() >= self.size

    def close(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._wanted.release()
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                break

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_shared: dict[tuple, SandboxPool] = {}
_shared_lock = threading.Lock()


def shared_pool(config: SandboxConfig, backend: str, size: int) -> SandboxPool:
    """The process-wide pool for this (backend, config), created on first use.

    Envs that start sandboxes with the same config share one pool, so N envs stepping in
    threads draw from the same warm sandboxes; pools are closed when the process exits.
    """
    import dataclasses

    from gyre_env.sandbox import choose_backend, make_sandbox

    backend = choose_backend(backend)
    key = (backend, json.dumps(dataclasses.asdict(config), sort_keys=True))
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None or pool.size < size:
            if pool is not None:
                pool.close()
            if not _shared:
                atexit.register(close_shared_pools)
            pool = _shared[key] = SandboxPool(lambda: make_sandbox(config, backend), size)
        return pool


def shared_pools() -> list[SandboxPool]:
    """The pools ``shared_pool`` has made in this process (for metrics and tests)."""
    with _shared_lock:
        return list(_shared.values())


def close_shared_pools() -> None:
    with _shared_lock:
        pools = list(_shared.values())
        _shared.clear()
    for pool in pools:
        pool.close()
