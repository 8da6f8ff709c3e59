"""One packed-tree forward gives exactly what running every root-to-leaf path alone gives.

The model is a random-init Hugging Face Qwen2 (the family the engine serves; nothing is
downloaded) trained through ``gyre_env.trainers.hf_tree``; records are synthetic. The
reference runs each path through the model's ordinary causal forward (positions 0..L-1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gyre_env.trainers.hf_tree import attention_for, tiny_qwen2, tree_logprobs
from gyre_env.trainers.tree_attention import TreeBlockLayout, tree_attention

from gyre_env.proxy.records import CallRecord
from gyre_env.trajectory.packing import pack
from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
from gyre_env.trajectory.synthetic import grpo_group, nl2repo_group
from gyre_env.trajectory.tree import build_trees

TOL = 1e-5


def _with_summary(records):
    """Add a summary call and a compacted main call to the first session."""
    first = [r for r in records if r.session == records[0].session]
    last = first[-1]
    ctx = last.prompt_ids + last.output_ids
    n = len(records)
    mk = dict(session=last.session, weight_version=4)
    summary = CallRecord(
        call_index=n,
        branch="sum",
        parent=last.call_index,
        role="summary",
        prompt_ids=ctx + [7, 7],
        output_ids=[11, 12, 13],
        output_logprobs=[-0.1, -0.2, -0.3],
        **mk,
    )
    compact = CallRecord(
        call_index=n + 1,
        branch="main",
        parent=None,
        role="main",
        prompt_ids=ctx[:5] + [11, 12, 13, 5],
        output_ids=[21, 22],
        output_logprobs=[-1.0, -2.0],
        **mk,
    )
    return records + [summary, compact]


def _two_groups():
    r1, e1 = grpo_group(group_size=2, prompt_len=40, turns=2, turn_tokens=16)
    r2, e2 = nl2repo_group(spec_len=60, group_size=2, main_tokens=40, sub_tokens=20, turns=2)
    return r1 + r2, e1 + e2


CASES = {
    "grpo_shared_prompt": lambda: grpo_group(group_size=4, prompt_len=48, turns=3, turn_tokens=20),
    "sub_agents_and_summary": lambda: (lambda r, e: (_with_summary(r), e))(
        *nl2repo_group(spec_len=120, group_size=3, main_tokens=60, sub_tokens=30, turns=4)
    ),
    "two_groups_one_unit": _two_groups,
}


def _setup(case):
    torch.manual_seed(0)
    records, episodes = CASES[case]()
    trees = build_trees(records, episodes)
    (unit,), _ = bounded_samples(trees, SampleConfig(token_budget=10**6))
    model = tiny_qwen2(vocab_size=1024, hidden_size=32, num_heads=4, num_kv_heads=2)
    return trees, unit, model


def _key(p, i):
    return (int(p.tree_index[i]), int(p.node_ids[i]), int(p.position_ids[i]))


def _path_logprobs(model, flat):
    """Logprob of every loss token of the flat layout, each path run alone (causal)."""
    starts = np.flatnonzero(flat.parent_index < 0).tolist() + [len(flat)]
    out = {}
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        ids = torch.as_tensor(flat.input_ids[a:b])
        logits = model(input_ids=ids[None]).logits[0]
        lp = torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None])[:, 0]
        for i in range(a + 1, b):
            if flat.loss_mask[i]:
                out[_key(flat, i)] = lp[i - a - 1]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_tree_logprobs_equal_each_path_alone(case):
    trees, unit, model = _setup(case)
    tree, flat = pack(unit), pack(unit, flat=True)
    assert len(tree) < len(flat) and tree.num_loss_tokens == flat.num_loss_tokens
    if case == "sub_agents_and_summary":
        roles = {tree_node.role for t in trees for tree_node in t.nodes if tree_node.sampled}
        assert roles == {"main", "sub-agent", "summary"}
    batch = tree.tensors()
    with torch.no_grad():
        ref = _path_logprobs(model, flat)
        keys = [_key(tree, i) for i in np.flatnonzero(tree.loss_mask)]
        want = torch.stack([ref[k] for k in keys])
        assert len(ref) == len(keys) == tree.num_loss_tokens
        for name, attn in [
            ("dense", attention_for(tree)),
            ("block-sparse", attention_for(tree, dense_max_tokens=0, block_size=16)),
            ("flex", tree.block_mask(block_size=128)),
        ]:
            got, _ = tree_logprobs(model, batch, attn)
            diff = (got - want).abs().max().item()
            assert diff <= TOL, f"{name}: max abs diff {diff}"


def _weighted_sum_grads(model, packed, attention):
    model.zero_grad()
    batch = packed.tensors()
    lp, _ = tree_logprobs(model, batch, attention)
    sel = batch["loss_mask"]
    loss = -(batch["weights"][sel] * batch["advantages"][sel] * lp).sum()
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_tree_gradient_equals_flat_per_path_gradient(case):
    """``-(w * adv * logprob).sum()``: tokens shared by several calls carry the sum of
    their weights (and the weighted mean advantage), so the tree loss is the flat one."""
    _, unit, model = _setup(case)
    tree, flat = pack(unit), pack(unit, flat=True)
    loss_flat, g_flat = _weighted_sum_grads(model, flat, attention_for(flat, dense_max_tokens=0))
    for name, attn in [
        ("dense", attention_for(tree)),
        ("block-sparse", attention_for(tree, dense_max_tokens=0, block_size=32)),
    ]:
        loss_tree, g_tree = _weighted_sum_grads(model, tree, attn)
        assert loss_tree == pytest.approx(loss_flat, abs=1e-4)
        worst = max((a - b).abs().max().item() for a, b in zip(g_tree, g_flat, strict=True))
        assert worst <= TOL, f"{name}: max abs grad diff {worst}"


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_block_sparse_kernel_matches_dense_attention_forward_and_backward(kv_heads):
    _, unit, _ = _setup("sub_agents_and_summary")
    p = pack(unit)
    n, gen = len(p), torch.Generator().manual_seed(0)
    q = torch.randn(4, n, 8, generator=gen, requires_grad=True)
    k, v = (torch.randn(kv_heads, n, 8, generator=gen, requires_grad=True) for _ in range(2))
    dout = torch.randn(4, n, 8, generator=gen)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=p.dense_mask(), scale=0.3, enable_gqa=True
    )
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    for bs in (7, 32, 128):
        out = tree_attention(q, k, v, TreeBlockLayout(p.parent_index, bs), scale=0.3)
        assert (out - ref).abs().max().item() <= TOL
        for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), ref_grads, strict=True):
            assert (a - b).abs().max().item() <= TOL


def test_attention_for_picks_dense_then_block_sparse_with_equal_results():
    _, unit, model = _setup("grpo_shared_prompt")
    p = pack(unit)
    dense = attention_for(p, dense_max_tokens=len(p))
    sparse = attention_for(p, dense_max_tokens=len(p) - 1, block_size=32)
    assert isinstance(dense, torch.Tensor) and isinstance(sparse, TreeBlockLayout)
    with torch.no_grad():
        a, _ = tree_logprobs(model, p.tensors(), dense)
        b, _ = tree_logprobs(model, p.tensors(), sparse)
    assert (a - b).abs().max().item() <= TOL


def test_importing_the_trajectory_package_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, gyre_env, gyre_env.trajectory, gyre_env.trajectory.cli;"
        "print(sorted(m for m in ('torch', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
