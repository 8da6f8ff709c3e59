"""Opt-in PyTorch profiler traces and CUDA memory snapshots around each role switch.

``SwitchProfiler(folder).wrap(cell, to, coro)`` runs one switch's coroutine under
``torch.profiler`` (CPU activity, every thread, with memory events; CUDA activity too when
CUDA is present) and writes ``folder/switch-<n>-cell<c>-to_<role>.pt.trace.json`` (a
Chrome/Perfetto trace; each phase is a ``switch.<phase>`` range, see ``cell._Phases``).
Where CUDA is present it also records the CUDA allocator's history
(``torch.cuda.memory._record_memory_history``) and dumps
``...memory.pickle`` (open it at https://pytorch.org/memory_viz); on a CPU there is no
such snapshot, and the switch's ``profile`` says so.

One torch profiler runs at a time in a process: switches that overlap share one session,
and every one of them gets the session's trace under its own name (the same file's
content). The record's ``profile`` names its files as soon as the switch ends; a shared
trace is written when the last switch of its session ends.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from gyre_env._optional import require

log = logging.getLogger(__name__)

NO_CUDA = "no CUDA here: CPU profiler trace only, no CUDA memory snapshot"


class SwitchProfiler:
    """See the module docstring; ``wrap`` is the one entry point."""

    def __init__(self, folder: str | Path):
        self.torch = require("torch", "switch profiling")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cuda = bool(self.torch.cuda.is_available())
        self._lock = threading.Lock()
        self._prof = None
        self._active: set[str] = set()
        self._names: list[str] = []  # every switch of the running session
        self._count = 0
        if not self.cuda:
            log.info("switch profiling: %s", NO_CUDA)

    async def wrap(self, cell: int, to, coro):
        """Await ``coro`` (a cell's switch) profiled; its record gets ``profile``."""
        name, files = self._begin(cell, to)
        try:
            record = await coro
        finally:
            self._end(name)
        record.profile = files
        return record

    def _begin(self, cell: int, to) -> tuple[str, dict]:
        with self._lock:
            self._count += 1
            name = f"switch-{self._count:04d}-cell{cell}-to_{to.name.lower()}"
            if self._prof is None:
                self._start()
            self._active.add(name)
            self._names.append(name)
        files = {"trace": str(self.folder / f"{name}.pt.trace.json")}
        if self.cuda:
            files["memory_snapshot"] = str(self.folder / f"{name}.memory.pickle")
        else:
            files["memory_snapshot"] = None
            files["note"] = NO_CUDA
        return name, files

    def _start(self) -> None:
        torch = self.torch
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        try:  # phases run on the event loop and in worker threads: record them all
            from torch._C._profiler import _ExperimentalConfig

            extra = {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
        except (ImportError, TypeError):  # an older torch: the starting thread only
            extra = {}
        self._prof = torch.profiler.profile(activities=acts, profile_memory=True, **extra)
        self._prof.start()

    def _end(self, name: str) -> None:
        with self._lock:
            self._active.discard(name)
            if self._active:
                return  # another switch of this session still runs
            prof, names = self._prof, self._names
            self._prof, self._names = None, []
            prof.stop()
            first = self.folder / f"{names[0]}.pt.trace.json"
            prof.export_chrome_trace(str(first))
            for other in names[1:]:
                (self.folder / f"{other}.pt.trace.json").write_bytes(first.read_bytes())
            if self.cuda:
                torch = self.torch
                for n in names:
                    torch.cuda.memory._dump_snapshot(str(self.folder / f"{n}.memory.pickle"))
                torch.cuda.memory._record_memory_history(enabled=None)
        log.info("switch profile: %s in %s", ", ".join(names), self.folder)
