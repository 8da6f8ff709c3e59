"""Weight versions across cells: the newest published weights, and a heartbeat that keeps
every cell within the staleness bound of the core.

:class:`WeightBoard` holds what the core published last (version + HF-named tensors);
cells pull from it when they resume serving. :class:`Heartbeat` records each cell's
version; its interval adapts (short while versions move, doubling up to ``max_interval_s``
while they do not), and a cell lagging the core by more than ``staleness_bound`` versions
is reported as ``STALE_WEIGHTS_DETECTED`` and must be synced before it serves again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

STALE_WEIGHTS_DETECTED = "STALE_WEIGHTS_DETECTED"
"""The event users grep for: a cell lags the core by more than the staleness bound."""


class WeightBoard:
    """The newest published weights (thread-safe); versions strictly increase."""

    def __init__(self, version: int = 0, tensors: Mapping | None = None):
        self._lock = threading.Lock()
        self._version = version
        self._tensors = dict(tensors or {})

    def publish(self, version: int, tensors: Mapping) -> None:
        """Make ``tensors`` (copied) the newest weights under ``version``. Once weights are
        on the board, a version is accepted only whole: the same tensor names, shapes and
        dtypes (``IncompleteVersionError`` naming what is missing; the board keeps the
        old version), since every cell that syncs from it would load a mix."""
        from gyre_env.weightsync.base import check_whole, layout_of

        with self._lock:
            if version <= self._version and self._tensors:
                raise ValueError(f"version {version} is not newer than {self._version}")
            if self._tensors:
                check_whole(
                    layout_of(tensors), layout_of(self._tensors), version=version,
                    peer="the weight board",
                )  # fmt: skip
        copied = {name: t.detach().clone() for name, t in tensors.items()}
        with self._lock:
            if version <= self._version and self._tensors:  # another publish meanwhile
                raise ValueError(f"version {version} is not newer than {self._version}")
            self._version, self._tensors = version, copied

    def latest(self) -> tuple[int, dict]:
        """(version, tensors); tensors is empty before the first publish."""
        with self._lock:
            return self._version, self._tensors

    @property
    def version(self) -> int:
        with self._lock:
            return self._version


@dataclass(kw_only=True)
class HeartbeatConfig:
    """How often versions are checked and how much lag is tolerated."""

    min_interval_s: float = 0.5
    """Interval right after a version changed."""
    max_interval_s: float = 8.0
    """Interval reached (doubling) while no version changes."""
    staleness_bound: int = 4
    """Most versions a serving cell may lag the core."""


@dataclass
class Heartbeat:
    """Each cell's weight version against the core's, with an adaptive interval."""

    config: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    versions: dict[int, int] = field(default_factory=dict)
    """Cell id -> weight version it holds."""
    core_version: int = 0
    interval_s: float = 0.0
    stale_events: int = 0
    _last_seen: tuple = ()

    def __post_init__(self) -> None:
        self.interval_s = self.config.min_interval_s

    def beat(self, core_version: int, versions: Mapping[int, int]) -> list[int]:
        """Record one round of versions (of the cells that must be current: serving ones,
        or every rank of a group); returns the cells beyond the staleness bound
        (each logged as ``STALE_WEIGHTS_DETECTED``) and adapts the interval."""
        self.core_version = core_version
        self.versions = dict(versions)  # cells not reported (not serving) are not tracked
        seen = (core_version, tuple(sorted(self.versions.items())))
        if seen != self._last_seen:
            self.interval_s = self.config.min_interval_s
        else:
            self.interval_s = min(self.interval_s * 2, self.config.max_interval_s)
        self._last_seen = seen
        stale = [
            c for c, v in sorted(self.versions.items()) if self.lag(c) > self.config.staleness_bound
        ]
        for cell in stale:
            self.stale_events += 1
            log.warning(
                "%s cell=%d version=%d core=%d bound=%d: syncing before it serves again",
                STALE_WEIGHTS_DETECTED,
                cell,
                self.versions[cell],
                core_version,
                self.config.staleness_bound,
            )
        return stale

    def lag(self, cell: int) -> int:
        return self.core_version - self.versions.get(cell, 0)
