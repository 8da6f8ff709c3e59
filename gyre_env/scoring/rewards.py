"""Reward modes: how potentials and the final score become per-step rewards.

- ``potential`` (default): step t gets Φ(s_t) − Φ(s_{t−1}) with Φ(s_0) = 0; the terminal
  step gets final − Φ(s_{T−1}). The rewards telescope: the episode return equals the
  final score exactly (shaping by a potential leaves the optimal policy unchanged).
- ``interim``: each non-terminal step gets the current partial score Φ(s_t) (a level, not
  a difference); the terminal step gets the final score. Returns are not final scores.
- ``sparse``: 0 on every step, the final score on the terminal one.

"Exactly" holds in float64: potentials and scores are rounded to multiples of
``GRID`` = 2⁻⁵⁰ (an error below 1e-15), so every partial sum of rewards is exact, in any
order of summation. Without it, ``sum(rewards)`` can differ from a score like 1/30 in
the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass

REWARD_MODES = ("potential", "interim", "sparse")
GRID = 2.0**-50


def quantize(x: float) -> float:
    """Round ``x`` to a multiple of ``GRID`` (exact in float64 for |x| < 8)."""
    return round(x / GRID) * GRID


@dataclass
class RewardTracker:
    """Turns a sequence of potentials and one final score into rewards for one episode."""

    mode: str = "potential"
    phi: float = 0.0
    """The potential of the current state (0 before the first step)."""
    paid: float = 0.0
    """Sum of the rewards handed out so far (exact in ``potential`` mode)."""

    def __post_init__(self) -> None:
        if self.mode not in REWARD_MODES:
            raise ValueError(f"unknown reward mode {self.mode!r}; choose one of {REWARD_MODES}")

    def step(self, phi: float | None) -> float:
        """Reward of a non-terminal step that reached potential ``phi`` (None: unchanged)."""
        if phi is not None:
            phi = quantize(phi)
        else:
            phi = self.phi
        if self.mode == "potential":
            reward = phi - self.phi
        elif self.mode == "interim":
            reward = phi
        else:
            reward = 0.0
        self.phi = phi
        self.paid += reward
        return reward

    def final(self, score: float) -> float:
        """Reward of the terminal step, given the final score."""
        score = quantize(score)
        reward = score - self.paid if self.mode == "potential" else score
        self.paid += reward
        return reward
