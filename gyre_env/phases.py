"""Where an episode's wall time goes (``PHASES``) and the live count of episodes per phase.

``PhaseCounts`` is the runner's waterlevel (``Runner.waterlevel``): how many of its episodes
are in each phase right now, plus how many run and wait to start. The agents' ``EpisodeClock``
moves an episode's entry between phases; the runner owns the counts. Both import this
module, which imports neither.
"""

from __future__ import annotations

import threading
import time
from typing import Any

PHASES = ("setup", "model", "tool", "scoring", "agent")
"""Where an episode's wall time goes: ``setup`` (sandbox start, reset), ``model`` (waiting
on the policy), ``tool`` (executing tool calls), ``scoring`` (interim and final grading),
``agent`` (the agent's own work between those: graph bookkeeping, parsing)."""


class PhaseCounts:
    """Live counts of a runner's episodes per phase, readable by a scheduler from any thread
    (the runner's ``waterlevel``). Each episode's ``EpisodeClock`` moves its entry from
    phase to phase; the runner sets how many are running and queued.

    ``snapshot()`` returns a consistent copy: how many episodes wait on the model, run
    tools, are scored, are being set up, and how many are queued to start.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(PHASES, 0)
        self._queued = 0
        self._running = 0

    def enter(self, phase: str) -> None:
        with self._lock:
            self._counts[phase] += 1

    def leave(self, phase: str) -> None:
        with self._lock:
            self._counts[phase] -= 1

    def move(self, old: str | None, new: str | None) -> None:
        with self._lock:
            if old is not None:
                self._counts[old] -= 1
            if new is not None:
                self._counts[new] += 1

    def set_queued(self, n: int) -> None:
        with self._lock:
            self._queued = n

    def add_running(self, delta: int) -> None:
        with self._lock:
            self._running += delta

    def snapshot(self) -> dict[str, Any]:
        """``{"model", "tool", "scoring", "setup", "agent", "running", "queued", "time"}``."""
        with self._lock:
            snap: dict[str, Any] = dict(self._counts)
            snap["running"] = self._running
            snap["queued"] = self._queued
        snap["time"] = time.time()
        return snap
