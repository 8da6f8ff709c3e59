"""Pieces of the training loop: which tasks SFT and RL use, and how one iteration's
groups become optimizer steps (K minibatches per epoch, groups without signal left out,
the same list again for a resumed run)."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_env.proxy.records import CallRecord
from gyre_env.tasks import nano_tasks
from gyre_env.tasks.splits import draw_rl_tasks, split_gold
from gyre_env.train.config import ConfigError, TrainConfig, apply_overrides
from gyre_env.train.setup import task_pool
from gyre_env.trajectory import sampling
from gyre_env.trajectory.tree import EpisodeInfo, build_trees


def rl_minibatches(trees, cfg: TrainConfig, rng):
    """``trajectory.sampling.rl_minibatches`` with ``cfg``'s settings, as the loop calls it."""
    return sampling.rl_minibatches(
        trees,
        cfg.sample_config(),
        steps=cfg.schedule.optimizer_steps,
        epochs=cfg.schedule.epochs,
        skip_zero_variance=cfg.algorithm.skip_zero_variance,
        rng=rng,
    )


def load_tasks(cfg: TrainConfig):
    pool = task_pool(cfg)
    return pool.train, pool.heldout


def split_pool(cfg: TrainConfig, train):
    """(gold, RL) tasks as ``task_pool`` splits them."""
    return split_gold(
        train,
        gold_count=cfg.sft.trajectories if cfg.sft.steps else 0,
        seed=cfg.seed,
        rl_includes_gold=cfg.tasks.rl_includes_sft_tasks,
    )


def _group(rng, name, rewards):
    prompt = rng.integers(1, 60, 30).tolist()
    records, episodes = [], []
    for k, r in enumerate(rewards):
        s = f"{name}.{k}"
        out = rng.integers(1, 60, 5).tolist()
        records.append(
            CallRecord(
                session=s,
                call_index=0,
                branch="main",
                parent=None,
                role="main",
                prompt_ids=prompt,
                output_ids=out,
                output_logprobs=[-1.0] * 5,
                weight_version=0,
            )  # fmt: skip
        )
        episodes.append(EpisodeInfo(session=s, group=name, outcome="success", reward=r))
    return build_trees(records, episodes)[0]


def _trees():
    rng = np.random.default_rng(0)
    signal = [_group(rng, f"g{i}", [0.0, 1.0, 0.25]) for i in range(5)]
    flat = [_group(rng, "all0", [0.0] * 3), _group(rng, "all1", [1.0] * 3)]
    return signal + flat


def _cfg(*sets):
    return apply_overrides(TrainConfig(), list(sets))


def _groups(minibatches, trees):
    """Each minibatch's group names (a group is told by its prompt, unique per group)."""
    by_prompt = {tuple(t.nodes[1].tokens[:30]): t.group for t in trees}
    names = []
    for mb in minibatches:
        found = set()
        for u in mb:
            for t in np.unique(u.tree_index):
                found.add(by_prompt[tuple(u.input_ids[u.tree_index == t][:30])])
        names.append(sorted(found))
    return names


def test_groups_split_into_k_minibatches_per_epoch_without_zero_variance_groups():
    cfg = _cfg("schedule.optimizer_steps=2", "schedule.epochs=3")
    trees = _trees()
    mbs, skipped = rl_minibatches(trees, cfg, np.random.default_rng(1))
    assert skipped == 2 and len(mbs) == 6
    groups = _groups(mbs, trees)
    for epoch in range(3):  # each epoch covers every signal group exactly once
        seen = sorted(g for mb in groups[2 * epoch : 2 * epoch + 2] for g in mb)
        assert seen == [f"g{i}" for i in range(5)]
    assert groups[:2] != groups[2:4]  # reshuffled per epoch
    again, _ = rl_minibatches(_trees(), cfg, np.random.default_rng(1))
    assert _groups(again, trees) == groups  # a resumed run rebuilds the same steps


def test_zero_variance_groups_are_kept_when_asked_and_k_is_capped_by_groups():
    cfg = _cfg("schedule.optimizer_steps=50", "algorithm.skip_zero_variance=false")
    trees = _trees()
    mbs, skipped = rl_minibatches(trees, cfg, np.random.default_rng(0))
    assert skipped == 0 and len(mbs) == 7
    assert sorted(g for mb in _groups(mbs, trees) for g in mb) == sorted(t.group for t in trees)


def test_an_iteration_with_no_signal_has_no_steps():
    rng = np.random.default_rng(0)
    trees = [_group(rng, "a", [0.0, 0.0]), _group(rng, "b", [0.5, 0.5])]
    assert rl_minibatches(trees, _cfg(), rng) == ([], 2)


def test_sft_gold_tasks_are_seeded_and_rl_can_leave_them_out():
    cfg = _cfg("tasks.train_count=40", "tasks.heldout_count=4", "sft.trajectories=16",
               "tasks.suite_kwargs={names='fixed', only='upper,sum'}",
               "tasks.rl_includes_sft_tasks=false")  # fmt: skip
    train, heldout = load_tasks(cfg)
    gold, rl = split_pool(cfg, train)
    assert len(gold) == 16 and len(rl) == 24 and all(t.gold_dir for t in gold)
    assert not {t.id for t in gold} & {t.id for t in rl}
    assert not {t.id for t in train} & {t.id for t in heldout}
    assert [t.id for t in split_pool(cfg, train)[0]] == [t.id for t in gold]
    other = split_pool(apply_overrides(cfg, ["seed=1"]), train)[0]
    assert [t.id for t in other] != [t.id for t in gold]
    # SFT taking the whole pool (or SFT off) leaves RL the whole pool
    assert len(split_pool(apply_overrides(cfg, ["sft.trajectories=40"]), train)[1]) == 40
    assert split_pool(apply_overrides(cfg, ["sft.steps=0"]), train) == ([], train)
    # by default RL samples the whole pool (gold is never in the RL loop either way)
    both = apply_overrides(cfg, ["tasks.rl_includes_sft_tasks=true"])
    assert split_pool(both, train) == (gold, train)


def test_pass_reward_gives_partial_credit_groups_no_signal():
    """``algorithm.sample.reward = "pass"``: a group whose best attempt only passed some
    tests (0.25 against 0.0: well-formed but wrong) has nothing to reinforce."""
    rng = np.random.default_rng(0)
    trees = [_group(rng, "partial", [0.0, 0.25, 0.0]), _group(rng, "solved", [0.0, 1.0, 0.25])]
    mbs, skipped = rl_minibatches(trees, _cfg(), rng)
    assert skipped == 0  # by score both groups have signal
    cfg = _cfg("algorithm.sample={reward='pass', negative_scale=0.0}")
    mbs, skipped = rl_minibatches(trees, cfg, np.random.default_rng(0))
    assert skipped == 1 and _groups(mbs, trees) == [["solved"]]


def test_failed_group_advantage_trains_the_groups_where_every_attempt_failed():
    """With ``failed_group_advantage`` a group none of whose attempts passed is no longer
    left out: each attempt is pushed down by that advantage, and nothing else changes."""
    rng = np.random.default_rng(0)
    trees = [_group(rng, "partial", [0.0, 0.25, 0.0]), _group(rng, "solved", [0.0, 1.0, 0.25])]
    cfg = _cfg(
        "algorithm.sample={reward='pass', negative_scale=0.0, failed_group_advantage=-0.2,"
        " failed_group_scope='all'}"
    )
    mbs, skipped = rl_minibatches(trees, cfg, np.random.default_rng(0))
    assert skipped == 0 and sorted(sum(_groups(mbs, trees), [])) == ["partial", "solved"]
    by_prompt = {tuple(t.nodes[1].tokens[:30]): t.group for t in trees}
    adv = {"partial": set(), "solved": set()}  # each group's loss tokens' advantages
    for u in (u for mb in mbs for u in mb):
        for t in np.unique(u.tree_index):
            here = u.tree_index == t
            name = by_prompt[tuple(u.input_ids[here][:30])]
            adv[name].update(round(float(a), 6) for a in u.advantages[here & u.loss_mask])
    assert adv["partial"] == {-0.2}  # every loss token of the failed group
    assert min(adv["solved"]) >= 0 and max(adv["solved"]) > 0  # rejection sampling as before


def test_validation_split_is_cut_from_the_training_pool_and_leaves_heldout_out():
    sets = ["tasks.train_count=20", "tasks.heldout_count=6",
            "tasks.suite_kwargs={names='fixed', only='upper,reverse'}"]  # fmt: skip
    train, heldout = load_tasks(_cfg(*sets))
    fit, validation = load_tasks(_cfg(*sets, "tasks.eval_split='validation'"))
    ids = {t.id for t in fit}, {t.id for t in validation}, {t.id for t in heldout}
    assert not ids[0] & ids[1] and not (ids[0] | ids[1]) & ids[2]
    whole = nano_tasks("train", None, names="fixed", only="upper,reverse")
    assert ids[0] | ids[1] <= {t.id for t in whole}  # both are parts of the train split
    with pytest.raises(ConfigError, match="tasks.eval_split.*'test'"):
        load_tasks(_cfg(*sets, "tasks.eval_split='test'"))


def test_a_training_count_sized_for_the_train_split_caps_at_the_fit_split():
    """The preset trains on the whole train split; tuned on validation it trains on all of
    fit (a smaller split), instead of refusing the count."""
    sets = ["tasks.suite_kwargs={names='fixed', only='upper,reverse'}", "tasks.heldout_count=4"]
    whole = nano_tasks("train", None, names="fixed", only="upper,reverse")
    fit, validation = load_tasks(
        _cfg(*sets, f"tasks.train_count={len(whole)}", "tasks.eval_split='validation'")
    )
    assert len(validation) == 4
    assert len(fit) == len(whole) - len(
        nano_tasks("validation", None, names="fixed", only="upper,reverse")
    )


def test_evaluated_tasks_can_cover_fewer_operations_than_training():
    """``tasks.eval_suite_kwargs`` measures a subset of the trained operations: the same
    held-out (or validation) tasks as a run that trains on that subset alone, still
    disjoint from a training pool that covers more operations; another suite refuses it."""
    narrow = "tasks.suite_kwargs={names='fixed', only='upper'}"
    wide = "tasks.suite_kwargs={names='fixed', only='upper,reverse,lower'}"
    for split in ("heldout", "validation"):
        sets = ["tasks.train_count=12", "tasks.heldout_count=3", f"tasks.eval_split={split!r}"]
        _, alone = load_tasks(_cfg(narrow, *sets))
        train, measured = load_tasks(_cfg(wide, "tasks.eval_suite_kwargs={only='upper'}", *sets))
        assert [t.id for t in measured] == [t.id for t in alone]
        assert {t.id.split("-")[1] for t in train} == {"upper", "reverse", "lower"}
        assert not {t.id for t in train} & {t.id for t in measured}
    with pytest.raises(ConfigError, match="tasks.eval_suite_kwargs: only the nano suite"):
        load_tasks(_cfg("tasks.suite='micro'", "tasks.eval_suite_kwargs={only='upper'}"))


def test_each_groups_advantages_are_computed_once(monkeypatch):
    """The filter and the units share one ``group_advantages`` per group (before: the
    zero-variance filter computed them, then every chunk's units again)."""
    calls = []
    real = sampling.group_advantages

    def counted(tree, cfg):
        calls.append(tree.group)
        return real(tree, cfg)

    monkeypatch.setattr(sampling, "group_advantages", counted)
    trees = _trees()
    mbs, _ = rl_minibatches(trees, _cfg("schedule.epochs=2"), np.random.default_rng(0))
    assert mbs
    assert sorted(calls) == sorted(t.group for t in trees)


def test_the_seed_sets_the_built_in_models_initial_weights():
    """Seeds change the initial weights as well as sampling (``model.seed`` unset), and an
    explicit ``model.seed`` holds the weights fixed across seeds."""
    from safetensors.numpy import load_file

    from gyre_env.train.setup import prepare_model

    def weights(*more):
        shape = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1"]
        folder = prepare_model(apply_overrides(TrainConfig(), [*shape, *more]))
        return load_file(next(folder.glob("*.safetensors")))

    a, b = weights("seed=0"), weights("seed=1")
    name = next(k for k in a if "mlp" in k)
    assert not np.array_equal(a[name], b[name])
    assert np.array_equal(weights("seed=0")[name], a[name])
    pinned = weights("seed=1", "model.seed=0")
    assert np.array_equal(pinned[name], a[name])


def test_rl_no_gold_share_draws_that_share_from_the_tasks_without_gold(capsys):
    cfg = _cfg("tasks.train_count=48", "tasks.heldout_count=4", "sft.trajectories=8",
               "tasks.suite_kwargs={names='fixed', only='upper,sum', phrasings='coined'}",
               "tasks.rl_includes_sft_tasks=false")  # fmt: skip
    train, _ = load_tasks(cfg)
    _, rl = split_pool(cfg, train)
    without = {t.id for t in rl if not t.gold_dir}
    assert 0 < len(without) < len(rl) / 2  # the coined phrasing alone carries no gold

    def share(value, n=6, draws=50):
        rng = np.random.default_rng(0)
        picked = [draw_rl_tasks(rl, n, rng, no_gold_share=value) for _ in range(draws)]
        assert all(len(p) == n for p in picked)
        return sum(t.id in without for p in picked for t in p) / (n * draws)

    assert share(0.5) == 0.5 and share(1.0) == 1.0 and share(0.0) == 0.0
    assert 0.05 < share(None) < 0.5  # uniform: the pool's own share
    # a side with no tasks gives its share to the other
    gold_only = [t for t in rl if t.gold_dir]
    assert all(t.gold_dir for t in draw_rl_tasks(gold_only, 6, np.random.default_rng(0),
                                                 no_gold_share=1.0))  # fmt: skip
    with pytest.raises(ConfigError, match="rl_no_gold_share must be in"):
        apply_overrides(cfg, ["tasks.rl_no_gold_share=1.5"]).validate()
    # a pool with no coined task says so rather than drawing uniformly in silence
    words = apply_overrides(cfg, ["tasks.suite_kwargs={names='fixed', only='upper,sum'}",
                                  "tasks.rl_no_gold_share=0.5"])  # fmt: skip
    capsys.readouterr()
    load_tasks(words)
    assert "include no task without gold" in capsys.readouterr().out
