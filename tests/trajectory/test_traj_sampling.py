"""Bounded samples, GRPO advantages and role weights (synthetic records, real code)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gyre_env.proxy.records import CallRecord
from gyre_env.trajectory.packing import pack
from gyre_env.trajectory.sampling import SampleConfig, bounded_samples, group_advantages
from gyre_env.trajectory.synthetic import grpo_group, nl2repo_group
from gyre_env.trajectory.tree import EpisodeInfo, build_trees


def rec(session, call, prompt, output):
    return CallRecord(
        session=session,
        call_index=call,
        branch="main",
        parent=None,
        role="main",
        prompt_ids=prompt,
        output_ids=output,
        output_logprobs=[-0.5] * len(output),
        weight_version=0,
    )


def _tree(**kw):
    records, episodes = nl2repo_group(
        spec_len=200, group_size=4, main_tokens=80, sub_tokens=40, turns=4, **kw
    )
    return build_trees(records, episodes)


@pytest.mark.parametrize("outcome", ["infra_error", "cancelled"])
def test_advantages_are_reward_minus_group_mean_and_skip_unscored_outcomes(outcome):
    """An infrastructure failure, or an episode the runner cancelled before grading, has
    no reward to learn from: it is left out of the group mean and of the loss."""
    (tree,) = _tree()
    rewards = {s: e.reward for s, e in tree.episodes.items()}
    s_bad = sorted(rewards)[0]
    tree.episodes[s_bad].outcome = outcome
    adv = group_advantages(tree, SampleConfig())
    kept = {s: r for s, r in rewards.items() if s != s_bad}
    mean = sum(kept.values()) / len(kept)
    assert adv == pytest.approx({s: r - mean for s, r in kept.items()})
    adv_std = group_advantages(tree, SampleConfig(normalize_std=True))
    import numpy as np

    std = float(np.std(list(kept.values())))
    assert adv_std == pytest.approx({s: (r - mean) / (std + 1e-6) for s, r in kept.items()})


def test_negative_scale_weighs_only_the_below_mean_attempts():
    """``negative_scale`` scales the failures' advantages and leaves the better attempts'
    as GRPO gives them; 0 is rejection-sampling RL (only the better attempts train)."""
    (tree,) = _tree()
    for i, s in enumerate(sorted(tree.episodes)):
        tree.episodes[s].reward = [1.0, 0.0, 0.0, 0.5][i]
    grpo = group_advantages(tree, SampleConfig())
    assert grpo == pytest.approx(
        {s: r - 0.375 for s, r in zip(sorted(grpo), [1, 0, 0, 0.5], strict=True)}
    )
    for scale in (0.0, 0.25):
        adv = group_advantages(tree, SampleConfig(negative_scale=scale))
        assert adv == pytest.approx({s: a if a > 0 else a * scale for s, a in grpo.items()})
    units, _ = bounded_samples([tree], SampleConfig(negative_scale=0.0))
    packed = [pack(u) for u in units]
    adv = [a for p in packed for a, m in zip(p.advantages, p.loss_mask, strict=True) if m]
    assert adv and min(adv) >= 0 and max(adv) > 0  # no token is pushed down
    with pytest.raises(ValueError, match="negative_scale"):
        SampleConfig(negative_scale=1.5)


def test_branch_negatives_push_down_only_the_token_where_a_worse_attempt_parted():
    """``negative_tokens = "branch"``: a below-mean attempt is pushed down at the first
    token where it went another way than its group, not on the format that follows; the
    better attempt trains on all of its tokens and the shared prefix keeps its mean."""
    from gyre_env.trajectory.tree import TokenTree

    prompt = [1, 2, 3]
    tree = TokenTree(group="g")
    outputs = {"a": [7, 8, 9, 10], "b": [7, 8, 11, 12, 13], "c": [14, 15, 16]}
    for s, out in outputs.items():
        tree.add_episode(EpisodeInfo(session=s, group="g", task="t", reward=float(s == "a")))
        tree.add_call(rec(s, 0, prompt, out))

    def trained(negative_tokens):
        cfg = SampleConfig(reward="pass", negative_tokens=negative_tokens)
        (unit,) = bounded_samples([tree], cfg)[0]
        p = pack(unit)
        return {
            int(t): float(a)
            for t, a, m in zip(p.input_ids, p.advantages, p.loss_mask, strict=True)
            if m
        }

    every = trained("all")
    assert every == pytest.approx({7: 1 / 6, 8: 1 / 6, 9: 2 / 3, 10: 2 / 3, 11: -1 / 3,
                                   12: -1 / 3, 13: -1 / 3, 14: -1 / 3, 15: -1 / 3, 16: -1 / 3})  # fmt: skip
    branch = trained("branch")
    assert branch == pytest.approx(
        {7: 1 / 6, 8: 1 / 6, 9: 2 / 3, 10: 2 / 3, 11: -1 / 3, 14: -1 / 3}
    )
    with pytest.raises(ValueError, match="negative_tokens"):
        SampleConfig(negative_tokens="first")


def test_a_unit_left_with_no_loss_token_is_not_trained():
    """A failed group pushed down (``failed_group_advantage``) whose attempts all wrote
    the same answer: under ``negative_tokens = "branch"`` none of its tokens is a parting,
    so its unit has nothing to train. It is dropped: kept, its loss had no gradient and
    ``backward()`` raised in the 10th iteration of an RL run."""
    from gyre_env.trajectory.sampling import packed_units, rl_minibatches
    from gyre_env.trajectory.tree import TokenTree

    tree = TokenTree(group="g")
    for s in "abcd":
        tree.add_episode(EpisodeInfo(session=s, group="g", task="t", reward=0.0))
        tree.add_call(rec(s, 0, [1, 2, 3], [7, 8, 9]))
    push = dict(reward="pass", failed_group_advantage=-0.2, failed_group_scope="all")
    (unit,) = packed_units([tree], SampleConfig(**push))
    assert unit.num_loss_tokens == 3
    branch = SampleConfig(**push, negative_tokens="branch")
    assert packed_units([tree], branch) == []
    minibatches, _ = rl_minibatches(
        [tree], branch, steps=1, epochs=1, skip_zero_variance=True, rng=np.random.default_rng(0)
    )
    assert minibatches == []


def test_failed_group_advantage_pushes_down_only_groups_without_any_reward():
    """A group none of whose attempts passed: ``scored`` pushes down its well-formed
    attempts (some hidden tests passed), ``all`` every attempt; a group with a pass keeps
    its rejection-sampling advantages."""
    (tree,) = _tree()
    names = sorted(tree.episodes)
    for s, score in zip(names, [0.25, 0.0, 0.25, 0.0], strict=True):
        tree.episodes[s].reward = score
    rs = SampleConfig(reward="pass", negative_scale=0.0)
    scored = SampleConfig(reward="pass", negative_scale=0.0, failed_group_advantage=-0.25)
    every = SampleConfig(
        reward="pass", negative_scale=0.0, failed_group_advantage=-0.25, failed_group_scope="all"
    )
    assert set(group_advantages(tree, rs).values()) == {0.0}
    assert [group_advantages(tree, scored)[s] for s in names] == [-0.25, 0.0, -0.25, 0.0]
    assert set(group_advantages(tree, every).values()) == {-0.25}
    tree.episodes[names[1]].reward = 1.0  # one success: rejection sampling as without it
    assert group_advantages(tree, scored) == group_advantages(tree, rs)
    assert group_advantages(tree, every) == group_advantages(tree, rs)
    for bad in (0.5, -1.5):
        with pytest.raises(ValueError, match="failed_group_advantage"):
            SampleConfig(failed_group_advantage=bad)
    with pytest.raises(ValueError, match="failed_group_scope"):
        SampleConfig(failed_group_scope="some")


def test_units_fit_the_budget_and_every_loss_is_carried_exactly_once():
    trees = _tree() + _tree(seed=5, group="other")
    budget = 700
    units, stats = bounded_samples(trees, SampleConfig(token_budget=budget))
    assert len(units) > 2 and stats.truncated_tokens == 0
    carried = Counter()
    for unit in units:
        packed = pack(unit)
        assert len(packed) == unit.num_tokens <= budget
        for part in unit.parts:
            assert len(part.nodes) == len(set(part.nodes))  # no prefix twice in a unit
            carried.update((id(part.tree), n) for n in part.loss_nodes)
    expected = {(id(t), n.id) for t in trees for n in t.nodes if n.sampled}
    assert set(carried) == expected and max(carried.values()) == 1


def test_infra_error_episode_is_kept_in_the_tree_but_not_sampled():
    (tree,) = _tree()
    bad = sorted(tree.episodes)[1]
    tree.episodes[bad].outcome = "infra_error"
    units, stats = bounded_samples([tree], SampleConfig(token_budget=10**6))
    assert stats.excluded_episodes == 1
    nodes = set(units[0].parts[0].nodes)
    only_bad = {n.id for n in tree.nodes[1:] if n.sessions == {bad}}
    assert only_bad and not nodes & only_bad
    packed = pack(units[0])
    assert packed.num_loss_tokens == sum(
        len(n) for n in tree.nodes[1:] if n.sampled and n.sessions != {bad}
    )


def test_role_weights_scale_sampled_tokens():
    (tree,) = _tree()
    cfg = SampleConfig(role_weights={"main": 1.0, "sub-agent": 0.3, "summary": 0.1})
    (unit,), _ = bounded_samples([tree], cfg)
    p = pack(unit)
    roles = {n.id: n.role for n in tree.nodes}
    for node_id, w, loss in zip(p.node_ids, p.weights, p.loss_mask, strict=True):
        if loss:
            assert w == pytest.approx(cfg.role_weights[roles[node_id]])
    assert {roles[i] for i in p.node_ids[p.loss_mask]} == {"main", "sub-agent"}


def test_shared_sample_sums_weights_and_averages_advantages():
    eps = [
        EpisodeInfo(session="a", group="g", reward=1.0),
        EpisodeInfo(session="b", group="g", reward=0.0),
    ]
    (tree,) = build_trees([rec("a", 0, [1, 2], [3, 4]), rec("b", 0, [1, 2], [3, 5])], eps)
    (unit,), _ = bounded_samples([tree])
    p = pack(unit)
    i3 = list(p.input_ids).index(3)
    assert p.weights[i3] == 2.0 and p.advantages[i3] == pytest.approx(0.0)
    i4 = list(p.input_ids).index(4)
    assert p.weights[i4] == 1.0 and p.advantages[i4] == pytest.approx(0.5)


def test_overlong_path_is_truncated_or_rejected():
    records, episodes = grpo_group(group_size=2, prompt_len=64, turns=3, turn_tokens=32)
    trees = build_trees(records, episodes)
    units, stats = bounded_samples(trees, SampleConfig(token_budget=100))
    assert stats.truncated_tokens > 0 and all(u.num_tokens <= 100 for u in units)
    with pytest.raises(ValueError, match="exceeds token_budget=100"):
        bounded_samples(trees, SampleConfig(token_budget=100, overflow="error"))


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"token_budget": 0}, "token_budget"),
        (
            {"role_weights": {"main": 1.0, "sub-agent": 1.0, "summary": 1.0, "critic": 1.0}},
            "critic",
        ),
        ({"role_weights": {"main": 1.0}}, "missing roles"),
        ({"overflow": "wrap"}, "overflow"),
    ],
)
def test_config_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        SampleConfig(**kw)


def test_j_max_caps_the_paths_one_episode_contributes_main_branch_first():
    """An episode that branched 7 times gives at most ``max_paths_per_episode`` paths; its
    main branch is always among them; with a large cap nothing is dropped."""
    prompt = list(range(1, 30))
    records = [rec("a", 0, prompt, [40, 41, 42])]
    records[0].role = "main"
    for k in range(1, 8):  # sub-agent calls that each start a branch from the prompt
        r = rec("a", k, prompt[:10] + [100 + k] * (3 + k), [50, 51])
        r.role, r.branch = "sub-agent", f"sub{k}"
        records.append(r)
    episodes = [
        EpisodeInfo(session="a", group="g", outcome="success", reward=1.0),
        EpisodeInfo(session="b", group="g", outcome="failure", reward=0.0),
    ]
    records.append(rec("b", 0, prompt, [43, 44]))
    (tree,) = build_trees(records, episodes)
    units, stats = bounded_samples([tree], SampleConfig(max_paths_per_episode=3))
    assert stats.dropped_paths == 5
    packed = [pack(u) for u in units]
    carried = {int(t) for p in packed for t in p.input_ids[p.loss_mask]}
    assert {40, 41, 42, 43, 44} <= carried  # both main branches kept
    kept_subs = {t for t in carried if t >= 100}
    assert len(kept_subs) == 0  # sub-agent prompts carry no loss; their outputs do
    sub_outputs = sum(int(((p.input_ids == 50) & p.loss_mask).sum()) for p in packed)
    assert sub_outputs == 2  # the 2 longest sub-agent branches fill the cap of 3
    _, stats = bounded_samples([tree], SampleConfig(max_paths_per_episode=50))
    assert stats.dropped_paths == 0
    with pytest.raises(ValueError, match="max_paths_per_episode"):
        SampleConfig(max_paths_per_episode=0)
