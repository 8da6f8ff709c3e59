"""Agent workload for the simulator: GRPO groups of episodes, each a list of turns.

An episode is ``setup -> (model call -> tool) x turns -> scoring``. Both sources give the
same :class:`Episode`: :class:`FittedWorkload` draws them from the distributions of a
:class:`~gyre_env.sim.config.WorkloadConfig` (lognormal bodies, Pareto tails), and
:class:`TraceWorkload` replays the episodes of a real run folder
(:func:`gyre_env.sim.trace.load_run`). Both are deterministic: group ``g`` is the
same for the same seed whenever it is asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from gyre_env.sim.config import Dist, WorkloadConfig


@dataclass(slots=True)
class Episode:
    """One agent episode. Per-turn sequences (lists or numpy arrays) have one entry per
    model call."""

    setup_s: float
    scoring_s: float
    prompt_new: list[int]
    """New prompt tokens of each call (the first holds the system prompt and the task)."""
    output: list[int]
    """Output tokens of each call."""
    tool_s: list[float]
    """Agent-side time after each call before the next one (tools and agent overhead)."""
    call_s: list[float] | None = None
    """Measured duration of each call, replayed instead of the cell model (traces)."""
    trained: bool = True
    """False for a group with no learning signal (all rewards equal): not trained on."""

    @property
    def tokens(self) -> int:
        """The episode's final context: what a training step computes for it."""
        return int(np.sum(self.prompt_new) + np.sum(self.output))


def draw(dist: Dist, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` draws of ``dist``."""
    if dist.sigma > 0:
        out = dist.median * np.exp(dist.sigma * rng.standard_normal(n))
    else:
        out = np.full(n, float(dist.median))
    if dist.tail_fraction > 0:
        tail = rng.random(n) < dist.tail_fraction
        # Pareto(alpha) with scale tail_min: tail_min * U^(-1/alpha)
        u = 1.0 - rng.random(int(tail.sum()))
        out[tail] = dist.tail_min * u ** (-1.0 / dist.tail_alpha)
    return np.clip(out, dist.min, dist.max)


def dist_mean(dist: Dist, rng: np.random.Generator | None = None, n: int = 20000) -> float:
    """Monte-Carlo mean of ``dist`` (clipping makes a closed form awkward)."""
    return float(draw(dist, rng or np.random.default_rng(0), n).mean())


def _scaled(dist: Dist, values: np.ndarray, factor: float) -> np.ndarray:
    """``values`` drawn from ``dist`` times a group's task ``factor``, kept in the range
    ``dist`` is clipped to (the factor moves a group within the sizes the distribution
    spans, it does not make new ones)."""
    return values if factor == 1.0 else np.clip(values * factor, dist.min, dist.max)


class FittedWorkload:
    """Groups drawn from a :class:`WorkloadConfig`'s distributions."""

    CACHED_GROUPS = 20000
    """Groups kept once drawn (runs of several policies on one workload share them)."""

    def __init__(self, cfg: WorkloadConfig, seed: int = 0):
        self.cfg, self.seed = cfg, seed
        self.group_size = cfg.group_size
        self._cache: dict[int, list[Episode]] = {}

    def group(self, g: int) -> list[Episode]:
        if g in self._cache:
            return self._cache[g]
        out = self._draw_group(np.random.default_rng([self.seed, g]), self.cfg.phase_of(g))
        if len(self._cache) < self.CACHED_GROUPS:
            self._cache[g] = out
        return out

    def _draw_group(self, rng: np.random.Generator, phase=None) -> list[Episode]:
        """One group's episodes, every distribution drawn once for the whole group; a
        ``phase`` scales its turns, tool times and outputs, and so does the group's own
        task factor (``group_turns_sigma`` / ``group_tool_sigma``: a group's episodes are
        one task, alike in size)."""
        cfg, size = self.cfg, self.cfg.group_size
        turns_k, tool_k, out_k = (
            (phase.turns_scale, phase.tool_scale, phase.output_scale) if phase else (1, 1, 1)
        )
        trained = bool(rng.random() >= cfg.zero_variance_fraction)
        task_turns = task_tool = 1.0
        if cfg.group_turns_sigma or cfg.group_tool_sigma:  # the group's task: one size for all
            z = float(rng.standard_normal())
            task_turns = math.exp(cfg.group_turns_sigma * z)
            task_tool = math.exp(cfg.group_tool_sigma * z)
        turns = _scaled(cfg.turns, draw(cfg.turns, rng, size), task_turns)
        n = np.maximum(1, np.round(turns * turns_k)).astype(np.int64)
        bounds = np.concatenate(([0], np.cumsum(n)))
        prompt = draw(cfg.turn_prompt_tokens, rng, int(bounds[-1])).round().astype(np.int64)
        prompt[bounds[:-1]] = np.round(draw(cfg.first_prompt_tokens, rng, size)).astype(np.int64)
        output = draw(cfg.output_tokens, rng, len(prompt)) * out_k
        output = np.maximum(output.round(), 1).astype(np.int64)
        tool = _scaled(cfg.tool_s, draw(cfg.tool_s, rng, len(prompt)), task_tool) * tool_k
        setup, scoring = draw(cfg.setup_s, rng, size), draw(cfg.scoring_s, rng, size)
        # each episode's turns up to the context limit: its context after each turn is
        # the running sum from its first turn; non-negative tokens make it non-decreasing,
        # so the turns that fit are those whose context is within the limit
        turn_tokens = prompt + output
        if turn_tokens.min() >= 0:
            total = np.cumsum(turn_tokens)
            context = total - np.repeat(total[bounds[:-1]] - turn_tokens[bounds[:-1]], n)
            fits = np.add.reduceat(
                (context <= cfg.max_context_tokens).astype(np.int64), bounds[:-1]
            )
        else:
            fits = [
                np.searchsorted(np.cumsum(turn_tokens[a:b]), cfg.max_context_tokens, "right")
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
        starts, setup, scoring = bounds[:-1].tolist(), setup.tolist(), scoring.tolist()
        out = []
        for k, (a, m) in enumerate(zip(starts, np.maximum(1, fits).tolist(), strict=True)):
            out.append(
                Episode(
                    setup_s=setup[k],
                    scoring_s=scoring[k],
                    prompt_new=prompt[a : a + m],
                    output=output[a : a + m],
                    tool_s=tool[a : a + m],
                    trained=trained,
                )
            )
        return out


class TraceWorkload:
    """The groups of a real run, replayed in their order (and again from the start when a
    simulation needs more than the run had). ``replay_calls=False`` drops the measured call
    times so that the cell model prices every call from its tokens."""

    def __init__(self, groups: list[list[Episode]], *, replay_calls: bool = True):
        if not groups:
            raise ValueError("a trace workload needs at least one group")
        self.groups = (
            groups if replay_calls else [[replace(e, call_s=None) for e in grp] for grp in groups]
        )
        self.group_size = max(len(g) for g in groups)

    def group(self, g: int) -> list[Episode]:
        return self.groups[g % len(self.groups)]


def make_workload(cfg: WorkloadConfig, seed: int = 0):
    """The workload a config names."""
    if cfg.source == "fitted":
        return FittedWorkload(cfg, seed)
    from gyre_env.sim.trace import load_run

    return TraceWorkload(load_run(cfg.trace).groups)
