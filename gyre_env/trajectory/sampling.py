"""Bounded training samples: token trees cut into units that fit a token budget.

The rule
--------
1. The unit of work is a root-to-leaf path of a tree: the full context of one model call
   (or of several, when later calls extend it). The proxy starts a new branch whenever a
   prompt does not extend an earlier context - after a summary/compaction the main
   conversation restarts from the system prompt plus the summary - so an episode whose
   history is longer than the window is *already* split at its compaction boundaries
   into paths that each fit the serving window.
2. Paths are taken in depth-first order and added to the current unit while the union
   of their nodes fits ``token_budget``; a shared prefix counts once per unit. When the
   next path does not fit, the unit is closed and a new one starts with that path's full
   prefix (prefixes are repeated across units, never within one).
3. Every sampled token carries its loss in exactly one unit: the first that includes it.
   A later unit that needs the same prefix as context has it with a zero loss mask, so
   the sum over units equals the flat loss.
4. A single path longer than the budget (a training window smaller than the serving
   window) cannot be split without changing what its tokens attend to. With
   ``overflow="truncate"`` it is cut at the last node boundary that fits and the rest is
   counted in ``SampleStats.truncated_tokens``; with ``overflow="error"`` it raises.
5. Episodes whose outcome is in ``exclude_outcomes`` (default ``infra_error``,
   ``cancelled``, ``killed``: never graded, reward unknown) stay in the store but get no
   loss and are left out of units, except as context shared with others. Timed-out
   episodes (graded at the limit) are trained on like any other: their completed calls
   are stored.
6. At most ``max_paths_per_episode`` (J_max) root-to-leaf paths of one episode are taken
   (its main branch first, then its longest other branches), so an episode that spawned
   many sub-agents or compactions cannot flood a batch.

Weights and advantages: each sampled token's loss coefficient is the sum over the calls
that sampled it of ``role_weights[role] * advantage(episode)``; advantages are GRPO
style, ``reward - mean(group rewards)``, optionally divided by the group's std.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from gyre_env.trajectory.tree import ROLES, TokenTree


def _default_role_weights() -> dict[str, float]:
    return {"main": 1.0, "sub-agent": 0.5, "summary": 0.25}


@dataclass(kw_only=True)
class SampleConfig:
    """How trees become bounded, weighted training units."""

    token_budget: int = 32768
    """Most tokens one unit may hold (the training context window)."""
    role_weights: dict[str, float] = field(default_factory=_default_role_weights)
    """Loss weight of tokens sampled by each branch role (main > sub-agent > summary)."""
    normalize_std: bool = False
    """Divide advantages by the group's reward std (GRPO); off = Dr. GRPO style."""
    std_eps: float = 1e-6
    """Added to the std before dividing."""
    reward: Literal["score", "pass"] = "score"
    """What an episode's reward is in its group: ``score``, the graded score as stored
    (partial credit: the share of hidden tests passed, or the env's shaped return);
    ``pass``, 1 when the score reaches ``pass_threshold`` and 0 otherwise, the objective
    of a pass-rate metric. Partial credit rewards an attempt that is well-formed but
    wrong (on nano, any function of the right return type passes 1 test of 4) whenever
    its group holds worse ones, which reinforces the wrong answer when no attempt was
    right; with ``pass`` such a group has no signal."""
    pass_threshold: float = 1.0
    """Score at or above which an episode counts as passed (``reward = "pass"``)."""
    negative_scale: float = 1.0
    """Factor on below-mean advantages. 1 is GRPO; 0 trains only on the group's better
    attempts (rejection-sampling RL, RAFT / Reinforce-Rej: the failures' gradient, which
    pushes down whatever a failed attempt shares with every other context, is what
    destabilises a small model trained from scratch); in between weighs them less."""
    negative_tokens: Literal["all", "branch"] = "all"
    """Which sampled tokens of a below-mean attempt its negative advantage trains. ``all``:
    every one (GRPO). ``branch``: only the first token of each span where the group's
    attempts part (a tree node whose parent has several children): the choice at which
    the attempt went another way than its siblings. The tokens it shares with its group
    carry the group's mean advantage either way (0 where every attempt shares them); what
    ``branch`` spares are the tokens that follow its choice in a span of its own - the
    tool-call format and code after a wrong operation, which a push on every token
    teaches the policy to stop writing. Above-mean attempts train on every token."""
    failed_group_advantage: float = 0.0
    """Advantage of the attempts of a group where no attempt earned any reward (all
    rewards 0), whose GRPO advantages are all 0, chosen by ``failed_group_scope``. Set it
    below 0 to push down what such a group wrote: when every attempt at a task repeats
    one wrong answer, nothing else moves the policy off it (NGRPO's virtual best attempt
    does the same: in a group of G failures one virtual success gives each -1/(G+1)).
    Applied after ``negative_scale``, which does not scale it."""
    failed_group_scope: Literal["scored", "all"] = "scored"
    """Which attempts of a failed group ``failed_group_advantage`` pushes down: ``scored``,
    those whose graded score is above 0 (well-formed but wrong: with ``reward = "pass"``
    an answer that passed some hidden tests but not all; with ``reward = "score"`` a
    failed group has none, so nothing moves); ``all``, every attempt.

    Neither helps the CPU demo's tiny model (validation split, one seed, from one SFT
    checkpoint): ``all`` at -0.1, -0.2 and -0.5, and ``scored`` at -0.2 and -0.5, broke the
    tool-call format within 3-4 RL iterations (from then on nearly every attempt ended
    without a tool call), while the same run without it kept passing. A minibatch that
    only pushes down gets a full-size Adam step, and the attempts share the format with
    every other; ``scored`` started it from two pushed attempts. Left at 0 in the
    presets; meant for models whose format is not at stake."""
    exclude_outcomes: tuple[str, ...] = ("infra_error", "cancelled", "killed")
    """Episode outcomes kept in the store but never trained on (an infrastructure failure;
    an episode the runner cancelled, or closed past its time limit: never graded)."""
    overflow: Literal["truncate", "error"] = "truncate"
    """What to do with a single path longer than ``token_budget``."""
    max_paths_per_episode: int = 5
    """J_max: most root-to-leaf paths (trajectories) one episode contributes."""

    def __post_init__(self) -> None:
        if self.token_budget <= 0:
            raise ValueError(f"token_budget must be positive, got {self.token_budget}")
        unknown = set(self.role_weights) - set(ROLES)
        if unknown:
            raise ValueError(f"role_weights has unknown roles {sorted(unknown)}; known: {ROLES}")
        missing = set(ROLES) - set(self.role_weights)
        if missing:
            raise ValueError(f"role_weights is missing roles {sorted(missing)}")
        if not 0.0 <= self.negative_scale <= 1.0:
            raise ValueError(f"negative_scale must be in [0, 1], got {self.negative_scale}")
        if self.negative_tokens not in ("all", "branch"):
            raise ValueError(
                f"negative_tokens must be 'all' or 'branch', got {self.negative_tokens!r}"
            )
        if self.failed_group_scope not in ("scored", "all"):
            raise ValueError(
                f"failed_group_scope must be 'scored' or 'all', got {self.failed_group_scope!r}"
            )
        if not -1.0 <= self.failed_group_advantage <= 0.0:
            raise ValueError(
                f"failed_group_advantage must be in [-1, 0], got {self.failed_group_advantage}"
            )
        if self.max_paths_per_episode < 1:
            raise ValueError(
                f"max_paths_per_episode must be >= 1, got {self.max_paths_per_episode}"
            )
        if self.reward not in ("score", "pass"):
            raise ValueError(f"reward must be 'score' or 'pass', got {self.reward!r}")
        if self.overflow not in ("truncate", "error"):
            raise ValueError(f"overflow must be 'truncate' or 'error', got {self.overflow!r}")


@dataclass(kw_only=True)
class UnitPart:
    """The nodes of one tree that a unit holds."""

    tree: TokenTree
    nodes: list[int]
    """Node ids in depth-first preorder, closed under ancestors."""
    loss_nodes: set[int]
    """Nodes whose sampled tokens carry their loss in this unit."""
    advantages: dict[str, float]
    """Session -> advantage, for the episodes that are trained on."""


@dataclass(kw_only=True)
class TrainingUnit:
    """What one packed forward pass sees: parts of one or more trees."""

    parts: list[UnitPart]
    role_weights: dict[str, float]
    num_tokens: int
    negative_tokens: str = "all"
    """``SampleConfig.negative_tokens``: which tokens a below-mean node trains."""


@dataclass(kw_only=True)
class SampleStats:
    units: int = 0
    tokens: int = 0
    """Tokens over all units (shared prefixes repeated across units count again)."""
    truncated_tokens: int = 0
    excluded_episodes: int = 0
    dropped_paths: int = 0
    """Paths left out because their episodes already gave ``max_paths_per_episode``."""


def episode_reward(score: float, cfg: SampleConfig) -> float:
    """The reward an episode with this stored score has under ``cfg.reward``."""
    if cfg.reward == "pass":
        return float(score >= cfg.pass_threshold)
    return float(score)


def group_advantages(tree: TokenTree, cfg: SampleConfig) -> dict[str, float]:
    """GRPO advantages of the tree's trainable episodes (excluded outcomes left out)."""
    sessions = [s for s, e in tree.episodes.items() if e.outcome not in cfg.exclude_outcomes]
    if not sessions:
        return {}
    scores = np.array([tree.episodes[s].reward for s in sessions])  # as stored
    rewards = np.array([episode_reward(x, cfg) for x in scores])
    adv = rewards - rewards.mean()
    if cfg.normalize_std:
        adv = adv / (rewards.std() + cfg.std_eps)
    if cfg.negative_scale != 1.0:
        adv = np.where(adv < 0, adv * cfg.negative_scale, adv)
    if cfg.failed_group_advantage and not rewards.any():
        pushed = scores > 0 if cfg.failed_group_scope == "scored" else np.full(len(scores), True)
        adv = np.where(pushed, cfg.failed_group_advantage, 0.0)
    return {s: float(a) for s, a in zip(sessions, adv, strict=True)}


class _UnitBuilder:
    def __init__(self, cfg: SampleConfig):
        self.cfg = cfg
        self.parts: list[UnitPart] = []
        self.tokens = 0
        self.units: list[TrainingUnit] = []

    def part_for(self, tree: TokenTree, adv: dict[str, float]) -> UnitPart:
        if not self.parts or self.parts[-1].tree is not tree:
            self.parts.append(UnitPart(tree=tree, nodes=[], loss_nodes=set(), advantages=adv))
        return self.parts[-1]

    def flush(self) -> None:
        if self.parts:
            self.units.append(
                TrainingUnit(
                    parts=self.parts,
                    role_weights=dict(self.cfg.role_weights),
                    num_tokens=self.tokens,
                    negative_tokens=self.cfg.negative_tokens,
                )
            )
        self.parts, self.tokens = [], 0


def bounded_samples(
    trees: list[TokenTree],
    cfg: SampleConfig | None = None,
    advantages: Sequence[dict[str, float]] | None = None,
) -> tuple[list[TrainingUnit], SampleStats]:
    """Cut ``trees`` into units of at most ``cfg.token_budget`` tokens (see module doc).
    ``advantages``: each tree's ``group_advantages``, when the caller has them already."""
    cfg = cfg or SampleConfig()
    builder, stats = _UnitBuilder(cfg), SampleStats()
    for i, tree in enumerate(trees):
        adv = advantages[i] if advantages is not None else group_advantages(tree, cfg)
        stats.excluded_episodes += len(tree.episodes) - len(adv)
        active = set(adv)
        keep = {n.id for n in tree.nodes[1:] if n.sessions & active}
        depth = tree.depth_tokens()
        assigned: set[int] = set()  # nodes whose loss some unit already carries
        leaves = _leaves(tree, keep)
        chosen = _cap_paths(tree, leaves, active, cfg.max_paths_per_episode)
        stats.dropped_paths += len(leaves) - len(chosen)
        for leaf in chosen:
            path = _fit_path(tree, tree.path(leaf), depth, cfg, stats)
            if not path:
                continue
            part = builder.part_for(tree, adv)
            present = set(part.nodes)
            new = [n for n in path if n not in present]
            cost = int(sum(len(tree.nodes[n]) for n in new))
            if builder.tokens + cost > cfg.token_budget:
                builder.flush()
                part = builder.part_for(tree, adv)
                new, cost = path, int(depth[path[-1]])
            part.nodes.extend(new)
            part.loss_nodes.update(n for n in new if n not in assigned and tree.nodes[n].sampled)
            assigned.update(new)
            builder.tokens += cost
    builder.flush()
    stats.units = len(builder.units)
    stats.tokens = sum(u.num_tokens for u in builder.units)
    return builder.units, stats


def packed_units(
    trees: list[TokenTree],
    cfg: SampleConfig,
    advantages: Sequence[dict[str, float]] | None = None,
) -> list:
    """``trees`` cut into bounded units and packed for the trainer (``PackedTree`` list).
    A unit left with no loss token is dropped: ``negative_tokens="branch"`` trains no
    token of an unbranched below-mean span, so a unit of such spans has nothing to train,
    and its loss would carry no gradient for ``backward()``."""
    from gyre_env.trajectory.packing import pack  # packing imports this module

    units, _ = bounded_samples(trees, cfg, advantages)
    return [p for p in map(pack, units) if p.num_loss_tokens]


def rl_minibatches(
    trees: list[TokenTree],
    cfg: SampleConfig,
    *,
    steps: int,
    epochs: int,
    skip_zero_variance: bool,
    rng: np.random.Generator,
) -> tuple[list[list], int]:
    """One iteration's optimizer steps: per epoch the groups (trees) are shuffled and
    split into ``steps`` minibatches, each cut into packed units. Each group's
    advantages are computed once, here. Groups without signal (all advantages 0) are left
    out first when ``skip_zero_variance``. Returns the minibatches and how many groups
    were left out; deterministic for ``rng``'s seed (a resumed run rebuilds the same
    list)."""
    advantages = [group_advantages(t, cfg) for t in trees]
    kept = list(range(len(trees)))
    if skip_zero_variance:
        kept = [i for i in kept if any(advantages[i].values())]
    if not kept:
        return [], len(trees)
    out = []
    k = min(steps, len(kept))
    for _ in range(epochs):
        for chunk in np.array_split(rng.permutation(len(kept)), k):
            picked = [kept[i] for i in chunk]
            units = packed_units([trees[i] for i in picked], cfg, [advantages[i] for i in picked])
            if units:
                out.append(units)
    return out, len(trees) - len(kept)


def _leaves(tree: TokenTree, keep: set[int]) -> list[int]:
    """Leaves of the tree restricted to ``keep``, depth-first."""
    out = []
    for i in tree.dfs():
        if i in keep and not any(c in keep for c in tree.nodes[i].children.values()):
            out.append(i)
    return out


def _cap_paths(tree: TokenTree, leaves: list[int], active: set[str], cap: int) -> list[int]:
    """The leaves (in their order) that some episode keeps among its ``cap`` best: main
    branch first, then longer paths."""
    depth = tree.depth_tokens()
    by_session: dict[str, list[int]] = {}
    for leaf in leaves:
        for session in tree.nodes[leaf].sessions & active:
            by_session.setdefault(session, []).append(leaf)
    kept: set[int] = set()
    for own in by_session.values():
        own.sort(key=lambda n: (tree.nodes[n].role != "main", -int(depth[n])))
        kept.update(own[:cap])
    return [leaf for leaf in leaves if leaf in kept]


def _fit_path(
    tree: TokenTree, path: list[int], depth: np.ndarray, cfg: SampleConfig, stats: SampleStats
) -> list[int]:
    if depth[path[-1]] <= cfg.token_budget:
        return path
    if cfg.overflow == "error":
        raise ValueError(
            f"group {tree.group!r}: a path of {int(depth[path[-1]])} tokens exceeds "
            f"token_budget={cfg.token_budget} (set overflow='truncate' to cut it)"
        )
    kept = [n for n in path if depth[n] <= cfg.token_budget]
    stats.truncated_tokens += int(depth[path[-1]] - (depth[kept[-1]] if kept else 0))
    return kept
