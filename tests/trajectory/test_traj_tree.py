"""Token trees built from TITO records (records are synthetic; the builder is real)."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_env.proxy.records import CallRecord, JsonlSink
from gyre_env.trajectory.synthetic import grpo_group, nl2repo_group
from gyre_env.trajectory.tree import EpisodeInfo, TokenTree, build_trees, trees_from_jsonl


def rec(session, call, prompt, output, *, role="main", branch="main", parent=None, wv=0, lp=None):
    return CallRecord(
        session=session,
        call_index=call,
        branch=branch,
        parent=parent,
        role=role,
        prompt_ids=list(prompt),
        output_ids=list(output),
        output_logprobs=lp if lp is not None else [-0.5] * len(output),
        weight_version=wv,
    )


def test_grpo_group_shares_prompt_once_and_paths_reproduce_calls():
    records, episodes = grpo_group(group_size=4, prompt_len=64, turns=3, turn_tokens=32)
    (tree,) = build_trees(records, episodes)
    assert tree.num_tokens == 64 + 4 * 3 * 32
    assert tree.flat_tokens == 4 * (64 + 3 * 32)
    assert tree.sharing == pytest.approx(1 - tree.num_tokens / tree.flat_tokens)
    for r in records:  # every call's context is exactly a root path
        end = tree.call_end[(r.session, r.call_index)]
        assert tree.path_tokens(end).tolist() == r.prompt_ids + r.output_ids
    assert tree.parent_mismatches == 0
    assert len(tree.leaves()) == 4


def test_sampled_tokens_keep_logprobs_and_version_when_reread_as_prompt():
    a = rec("s", 0, [1, 2, 3], [4, 5], lp=[-0.1, -0.2], wv=7)
    b = rec("s", 1, [1, 2, 3, 4, 5, 6], [7], parent=0, lp=[-0.3], wv=8)
    tree = TokenTree.from_records([a, b])
    kinds = [(n.tokens.tolist(), n.sampled, n.weight_version) for n in tree.nodes[1:]]
    assert ([4, 5], True, 7) in kinds and ([1, 2, 3], False, -1) in kinds
    node45 = next(n for n in tree.nodes if n.tokens.tolist() == [4, 5])
    np.testing.assert_allclose(node45.logprobs, [-0.1, -0.2])
    assert node45.samplers == [("s", 0, "main")]
    assert tree.num_sampled == 3


def test_sub_agent_branches_from_main_context_halfway():
    records, episodes = nl2repo_group(
        spec_len=100, group_size=2, main_tokens=40, sub_tokens=20, turns=4
    )
    (tree,) = build_trees(records, episodes)
    subs = [r for r in records if r.role == "sub-agent"]
    first_sub = subs[0]
    end = tree.call_end[(first_sub.session, first_sub.call_index)]
    sub_nodes = [tree.nodes[i] for i in tree.path(end)]
    assert any(n.role == "sub-agent" and n.sampled for n in sub_nodes)
    assert sub_nodes[0].role == "main"  # the spec is shared, owned by the main branch
    # the sub-agent and main continuation diverge after the main context at halfway
    main_after = [
        r
        for r in records
        if r.session == first_sub.session
        and r.call_index > first_sub.call_index
        and r.role == "main"
    ][0]
    lcp = 0
    for x, y in zip(first_sub.prompt_ids, main_after.prompt_ids, strict=False):
        if x != y:
            break
        lcp += 1
    half = records[first_sub.call_index - 1]
    assert lcp == len(half.prompt_ids) + len(half.output_ids)
    assert len(tree.leaves()) == 4  # main + sub-agent per episode


def test_summary_compaction_starts_a_branch_at_the_common_prefix():
    system = [9, 9, 9]
    c0 = rec("s", 0, system + [1, 2], [3, 4])
    summ = rec("s", 1, system + [1, 2, 3, 4, 50], [60, 61], role="summary", branch="sum", parent=0)
    c2 = rec("s", 2, system + [60, 61, 70], [80], branch="main")  # compacted: no parent
    tree = TokenTree.from_records([c0, summ, c2])
    assert tree.parent_mismatches == 0
    root_child = tree.nodes[tree.nodes[0].children[9]]
    assert root_child.tokens.tolist() == system and len(root_child.children) == 2
    summ_end = tree.nodes[tree.call_end[("s", 1)]]
    assert summ_end.role == "summary" and summ_end.sampled


def test_identical_samples_of_two_episodes_share_a_node_with_two_samplers():
    tree = TokenTree.from_records(
        [rec("a", 0, [1, 2], [3, 4]), rec("b", 0, [1, 2], [3, 5])],
        [EpisodeInfo(session="a", group="g"), EpisodeInfo(session="b", group="g")],
    )
    n3 = next(n for n in tree.nodes if n.tokens.tolist() == [3])
    assert n3.sampled and sorted(s for s, _, _ in n3.samplers) == ["a", "b"]
    assert n3.sessions == {"a", "b"}


def test_step_rewards_and_outcomes_attach_where_they_belong():
    eps = [EpisodeInfo(session="s", outcome="timeout", reward=0.2, step_rewards={0: 0.5})]
    calls = [rec("s", 0, [1, 2], [3]), rec("s", 1, [1, 2, 3, 4], [5, 6], parent=0)]
    calls[1].finish_reason = "length"  # the episode timed out during this call
    tree = TokenTree.from_records(calls, eps)
    assert tree.nodes[tree.call_end[("s", 0)]].rewards == {"s": 0.5}
    assert tree.episodes["s"].outcome == "timeout"
    assert tree.num_sampled == 3  # the completed calls and their logprobs are kept


def test_parent_claim_that_does_not_match_is_counted():
    tree = TokenTree.from_records([rec("s", 0, [1], [2]), rec("s", 1, [7, 8], [9], parent=0)])
    assert tree.parent_mismatches == 1


@pytest.mark.parametrize(
    "bad, match",
    [
        (rec("s", 0, [1], [2, 3], lp=[-1.0]), "2 output_ids but 1 logprobs"),
        (rec("s", 0, [1], [2], role="critic"), "role 'critic'"),
        (rec("s", 0, [], [2]), "empty prompt_ids"),
    ],
)
def test_bad_records_are_rejected_with_the_reason(bad, match):
    with pytest.raises(ValueError, match=match):
        TokenTree.from_records([bad])


def test_groups_come_from_episode_info_or_record_extra(tmp_path):
    records, episodes = grpo_group(group_size=2, group="g1")
    more, _ = grpo_group(group_size=3, group="g2", seed=1)
    for r in more:
        r.extra = {"run": "r", "group": "g2", "task": "t2"}
    sink = JsonlSink(tmp_path / "calls.jsonl", compact=True)  # as the proxy writes long runs
    for r in records + more:
        sink.write(r)
    sink.close()
    with open(tmp_path / "episodes.jsonl", "w") as fh:
        for e in episodes:
            import json

            fh.write(json.dumps(e.to_dict()) + "\n")
    trees = trees_from_jsonl(tmp_path / "calls.jsonl", tmp_path / "episodes.jsonl")
    by_group = {t.group: t for t in trees}
    assert set(by_group) == {"g1", "g2"}
    assert len(by_group["g1"].episodes) == 2 and len(by_group["g2"].episodes) == 3
    assert by_group["g2"].task == "t2"
    assert by_group["g1"].episodes["g1-e0"].step_rewards == {0: 0.1}
