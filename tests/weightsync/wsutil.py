"""Helpers of the weight-sync tests: free ports, peer processes, versions of the tiny model."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path

PEER = Path(__file__).with_name("peer.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    """tests/weightsync/peer.py in a real process (one thread: the cores are shared)."""

    def __init__(self, *args: str):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip())

    def expect(self, text: str, timeout_s: float = 60.0) -> None:
        """Wait for a stdout line starting with ``text``; fail with the output so far."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if line.startswith(text):
                return
        raise AssertionError(f"peer never printed {text!r}; output:\n" + "\n".join(self.seen))

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def perturbed(tiny_path, seed: int, scale: float = 0.05) -> dict:
    """The tiny model's parameters plus seeded noise: a deterministic 'new version'."""
    import torch
    from safetensors.torch import load_file

    state = {}
    for f in sorted(Path(tiny_path).glob("*.safetensors")):
        state.update(load_file(str(f)))
    g = torch.Generator().manual_seed(seed)
    return {
        name: (t.float() + scale * torch.randn(t.shape, generator=g)).to(t.dtype)
        for name, t in sorted(state.items())
    }


def run_async(fn: Callable) -> Callable:
    """Run an async test function to completion (no pytest asyncio plugin here)."""
    import asyncio

    @wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper
