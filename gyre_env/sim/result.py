"""What one simulated policy run gives: :class:`SimResult`, and the cell states its time
is accounted to (:data:`STATES`)."""

from __future__ import annotations

from dataclasses import dataclass, field

STATES = (
    "rollout/serving",
    "rollout/idle:agents_in_tools",
    "rollout/idle:no_episodes",
    "training/step",
    "training/sync",
    "training/idle:no_batch",
    "switching",
)
"""Where a cell's time goes. ``agents_in_tools``: episodes run but none waits on this cell;
``no_episodes``: the policy holds rollouts back (a barrier or the staleness bound)."""

TIMELINE_COUNTS = ("trained_tokens", "steps", "dropped_samples")
"""What a timeline bucket counts besides every state's cell seconds: the tokens trained and
steps ended in it, and the samples whose every output token was past the staleness bound in
the steps started in it (``SimResult.dropped_stale``)."""


@dataclass
class SimResult:
    """What one policy run gave. Times in seconds of simulated time."""

    policy: str
    duration_s: float
    cells: int
    steps: int
    trained_samples: int
    trained_tokens: int
    state_seconds: dict[str, float]
    staleness: dict[int, int]
    dropped_stale: int
    """Samples trained with every output token past the staleness bound (weighing nothing
    in the loss: nothing of them is learned)."""
    filtered_groups: int
    switches: int
    migrations: int
    rdma_transfer_failed: int
    step_end_times: list[float]
    slot_utilisation: float
    """Time-weighted share of rollout slots in use while cells are in ROLLOUT."""
    events: int
    wall_s: float
    gantt: list[tuple[int, float, float, str]] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    dropped_tokens: int = 0
    """Tokens lost to the staleness bound: each trained group's tokens in the share of its
    output tokens sampled more than the bound behind the trainer (the loss weighs them 0);
    ``trained_tokens`` counts the rest."""
    rounds: int = 0
    """Rounds the run took (see :mod:`gyre_env.sim.rounds`)."""
    timeline_s: float = 0.0
    """Width of a ``timeline`` bucket in simulated seconds (0: no timeline kept)."""
    timeline: list[dict[str, float]] = field(default_factory=list)
    """Per bucket of ``timeline_s``, in order: each of ``STATES``' cell seconds and the
    ``TIMELINE_COUNTS``."""

    @property
    def samples_per_hour(self) -> float:
        return self.trained_samples * 3600.0 / self.duration_s if self.duration_s else 0.0

    @property
    def finished_tokens_per_hour(self) -> float:
        """Tokens per hour of the groups that reached a step, trained or lost to the
        staleness bound."""
        done = self.trained_tokens + self.dropped_tokens
        return done * 3600.0 / self.duration_s if self.duration_s else 0.0

    @property
    def tokens_per_hour(self) -> float:
        return self.trained_tokens * 3600.0 / self.duration_s if self.duration_s else 0.0

    def fractions(self) -> dict[str, float]:
        total = self.cells * self.duration_s
        return {k: v / total for k, v in self.state_seconds.items()} if total else {}

    def busy_fraction(self) -> dict[str, float]:
        f = self.fractions()
        return {
            "rollout": f.get("rollout/serving", 0.0),
            "training": f.get("training/step", 0.0) + f.get("training/sync", 0.0),
        }

    def idle_fraction(self) -> float:
        return sum(v for k, v in self.fractions().items() if "idle" in k or k == "switching")

    def timeline_fractions(self) -> list[dict[str, float]]:
        """Each timeline bucket's states as shares of the cell time in it (the counts
        kept as they are); the last bucket counts only up to the run's end."""
        out = []
        for b, row in enumerate(self.timeline):
            span = min(self.timeline_s, self.duration_s - b * self.timeline_s)
            total = self.cells * span
            out.append({k: (v / total if k in STATES and total > 0 else v) for k, v in row.items()})
        return out

    def idle_free_tokens_per_hour(self) -> float:
        """Trained tokens per hour had no cell idled or switched, at the cell time per
        trained token this run spent (throughput over its busy fraction)."""
        b = self.busy_fraction()
        busy = b["rollout"] + b["training"]
        return self.tokens_per_hour / busy if busy > 0 else 0.0

    def time_to_steps(self, n: int) -> float | None:
        return self.step_end_times[n - 1] if len(self.step_end_times) >= n else None
