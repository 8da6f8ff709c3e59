"""A training run's tasks: the training pool, the evaluated split, and the pool's share
of gold (SFT) and RL tasks.

The evaluated split is disjoint from the pool: ``heldout`` (nano's held-out split, or
the first ``heldout_count`` tasks of a seeded permutation of another suite) or
``validation``, for choosing settings without looking at the held-out tasks (nano's
``fit``/``validation`` splits; another suite: the ``heldout_count`` tasks after the
held-out ones, which then neither train nor evaluate).
"""

from __future__ import annotations

import numpy as np

from gyre_env.config import ConfigError
from gyre_env.tasks.task import Task

EVAL_SPLITS = ("heldout", "validation")


def load_splits(
    suite: str,
    *,
    train_count: int,
    heldout_count: int,
    seed: int,
    suite_kwargs: dict,
    eval_suite_kwargs: dict,
    eval_split: str,
) -> tuple[list[Task], list[Task]]:
    """(training pool, evaluated tasks) of ``suite``; a bad option is a ``ConfigError``
    naming the ``tasks.*`` key."""
    if eval_split not in EVAL_SPLITS:
        raise ConfigError(
            f"tasks.eval_split: must be 'heldout' or 'validation', got {eval_split!r}"
        )
    tuning = eval_split == "validation"
    if suite == "nano":
        from gyre_env.tasks.nano import fit_size, nano_tasks

        fit, evaluate = ("fit", "validation") if tuning else ("train", "heldout")
        try:
            count = train_count
            if tuning:  # fit is train less validation: a count sized for train caps at it
                count = min(count, fit_size(seed, **suite_kwargs))
            train = nano_tasks(fit, count, seed=seed, **suite_kwargs)
            kw = {**suite_kwargs, **eval_suite_kwargs}
            heldout = nano_tasks(evaluate, heldout_count, seed=seed, **kw)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"tasks: {e}") from e
    else:
        from gyre_env.tasks import load_suite

        if eval_suite_kwargs:
            raise ConfigError(
                f"tasks.eval_suite_kwargs: only the nano suite loads its evaluated tasks "
                f"apart; suite {suite!r} cuts them from one task list"
            )
        try:
            tasks = load_suite(suite, **suite_kwargs)
        except (KeyError, TypeError, ValueError, FileNotFoundError) as e:
            raise ConfigError(f"tasks: suite {suite!r}: {e}") from e
        order = np.random.default_rng(seed).permutation(len(tasks))
        if tuning:  # the held-out tasks leave; the next heldout_count validate
            order = order[heldout_count:]
        heldout = [tasks[i] for i in order[:heldout_count]]
        train = [tasks[i] for i in order[heldout_count:]][:train_count]
    if not train:
        raise ConfigError(f"tasks: suite {suite!r} gives no training tasks")
    if not heldout:
        raise ConfigError(f"tasks: suite {suite!r} gives no {eval_split} tasks")
    return train, heldout


def split_gold(
    pool: list[Task], *, gold_count: int, seed: int, rl_includes_gold: bool
) -> tuple[list[Task], list[Task]]:
    """(gold tasks, RL tasks) of the training ``pool``: ``gold_count`` tasks with a gold
    solution, drawn for ``seed``; RL samples the whole pool, or without
    ``rl_includes_gold`` the rest of it (the whole pool if the gold took every task)."""
    order = np.random.default_rng([seed, 1]).permutation(len(pool))
    gold = [pool[i] for i in order if pool[i].gold_dir][:gold_count]
    if rl_includes_gold:
        return gold, list(pool)
    taken = {t.id for t in gold}
    return gold, [t for t in pool if t.id not in taken] or list(pool)


def draw_rl_tasks(
    pool: list[Task], n: int, rng: np.random.Generator, *, no_gold_share: float | None
) -> list[Task]:
    """An RL iteration's ``n`` tasks from ``pool``: uniform, or with ``no_gold_share`` a
    share of them (rounded) from the pool's tasks that have no gold solution (what only
    RL's own attempts can learn) and the rest from the tasks that have one. A side that
    has no tasks gives its share to the other."""
    if no_gold_share is None:
        return _draw(pool, n, rng)
    without = [t for t in pool if not t.gold_dir]
    with_gold = [t for t in pool if t.gold_dir]
    k = round(n * no_gold_share_used(pool, no_gold_share))
    return _draw(without, k, rng) + _draw(with_gold, n - k, rng)


def no_gold_share_used(pool: list[Task], no_gold_share: float) -> float:
    """The share ``draw_rl_tasks`` draws from ``pool``'s tasks without gold: the one asked
    for, unless a side has no task (then 1.0 with no gold anywhere, 0.0 with gold in all)."""
    without = sum(not t.gold_dir for t in pool)
    return 1.0 if without == len(pool) else 0.0 if not without else no_gold_share


def _draw(tasks: list[Task], n: int, rng: np.random.Generator) -> list[Task]:
    """``n`` of ``tasks`` drawn by ``rng`` (with replacement only when there are fewer)."""
    if not n:
        return []
    return [tasks[i] for i in rng.choice(len(tasks), n, replace=n > len(tasks))]
