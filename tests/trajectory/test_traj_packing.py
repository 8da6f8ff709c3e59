"""Packed layout: positions are depths, parents are path predecessors, masks are ancestry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gyre_env.trajectory.packing import block_structure, pack
from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
from gyre_env.trajectory.synthetic import nl2repo_group, sharing_group
from gyre_env.trajectory.tree import build_trees


def _packed(sharing=None):
    if sharing is None:
        records, episodes = nl2repo_group(
            spec_len=90, group_size=3, main_tokens=40, sub_tokens=20, turns=4
        )
    else:
        records, episodes = sharing_group(sharing, group_size=4, path_len=64)
    trees = build_trees(records, episodes)
    (unit,), _ = bounded_samples(trees, SampleConfig(token_budget=10**6))
    return trees, unit, pack(unit)


def _ancestry(p):
    """Brute force: walk parent_index from every token."""
    n = len(p)
    allowed = np.zeros((n, n), bool)
    for q in range(n):
        k = q
        while k >= 0:
            allowed[q, k] = True
            k = p.parent_index[k]
    return allowed


def test_positions_are_depths_and_paths_reproduce_calls():
    trees, unit, p = _packed()
    (tree,) = trees
    for end in tree.call_end.values():
        # walk back from the last token of the call's end node
        i = int(np.flatnonzero(p.node_ids == end)[-1])
        toks = []
        while i >= 0:
            toks.append(int(p.input_ids[i]))
            i = int(p.parent_index[i])
        assert len(toks) == p.position_ids[np.flatnonzero(p.node_ids == end)[-1]] + 1
        assert toks[::-1] == tree.path_tokens(end).tolist()


def test_dense_mask_is_exactly_ancestor_or_self():
    _, _, p = _packed()
    assert np.array_equal(p.dense_mask().numpy(), _ancestry(p))


@pytest.mark.parametrize("block", [4, 16, 64])
def test_block_structure_matches_the_dense_mask(block):
    _, _, p = _packed()
    dense = _ancestry(p)
    nonempty, full = block_structure(p.subtree_end, block)
    nb = nonempty.shape[0]
    for qb in range(nb):
        for kb in range(nb):
            tile = dense[qb * block : (qb + 1) * block, kb * block : (kb + 1) * block]
            assert nonempty[qb, kb] == tile.any() or (qb == kb)
            assert full[qb, kb] == (tile.all() and qb != kb)


def test_block_mask_equals_create_block_mask_and_flex_forward_matches_dense():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    _, _, p = _packed(0.5)
    n, end = len(p), torch.as_tensor(p.subtree_end)
    ours = p.block_mask(block_size=32)

    def mask_mod(b, h, q, kv):
        return (kv <= q) & (q < end[kv])

    ref = create_block_mask(mask_mod, None, None, n, n, device="cpu", BLOCK_SIZE=32)
    assert torch.equal(ours.to_dense(), ref.to_dense())
    q, k, v = (torch.randn(1, 2, n, 8) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=p.dense_mask())
    got = flex_attention(q, k, v, block_mask=ours)
    assert (got - want).abs().max().item() < 1e-5


def test_flat_layout_repeats_prefixes_and_keeps_the_same_loss():
    trees, unit, p = _packed()
    f = pack(unit, flat=True)
    assert len(f) == trees[0].flat_tokens and len(p) == trees[0].num_tokens
    assert f.num_loss_tokens == p.num_loss_tokens
    coef_f = np.sort((f.weights * f.advantages)[f.loss_mask])
    coef_p = np.sort((p.weights * p.advantages)[p.loss_mask])
    assert coef_f == pytest.approx(coef_p, abs=1e-7)
    assert np.array_equal(f.dense_mask().numpy(), _ancestry(f))


def test_sharing_generator_hits_its_target():
    for s in (0.0, 0.25, 0.5, 0.75):
        records, episodes = sharing_group(s, group_size=8, path_len=512)
        (tree,) = build_trees(records, episodes)
        assert tree.sharing == pytest.approx(s, abs=0.01)


def test_a_unit_unpickled_over_read_only_buffers_gives_writable_arrays():
    """A unit sent to a Ray actor arrives over read-only views of the object store
    (pickle protocol 5, out-of-band buffers): its arrays are writable copies, so making
    tensors of them warns nothing (each rank used to print torch's non-writable warning)."""
    import pickle
    import warnings

    unit = _packed()[2]
    buffers: list = []
    data = pickle.dumps(unit, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(b.raw()).toreadonly() for b in buffers]
    assert views, "the arrays went out of band, as through Ray"
    arrived = pickle.loads(data, buffers=views)
    arrays = [getattr(arrived, k) for k in arrived.__dataclass_fields__]
    assert all(a.flags.writeable for a in arrays if a is not None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arrived.tensors()
        arrived.dense_mask()
    assert np.array_equal(arrived.input_ids, unit.input_ids)
