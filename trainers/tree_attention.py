"""Block-sparse tree attention for CPU training, with a flash-style backward.

``torch.nn.attention.flex_attention`` takes the tree's ``BlockMask`` but, in torch 2.13,
refuses ``requires_grad`` inputs on CPU ("FlexAttention does not support backward on
CPU"), and its eager fallback materialises every score. This kernel follows the tree
instead of a fixed block grid: query blocks are runs of at most ``block_size`` tokens
that lie on one chain (no branch starts inside), so all their tokens share the same
ancestors; each block gathers exactly those ancestor ranges plus itself, masks only
the causal part of its own diagonal, and keeps just ``out`` and the log-sum-exp for
backward, where scores are recomputed block by block. Memory is O(n * head_dim), never
O(n^2); the work is the (query, ancestor) pairs plus half a block per query block, the
same for a tree and for flat sequences, so comparisons between the two are fair.

This is the CPU backend of the Hugging Face model's tree attention
(``gyre_env.trainers.hf_tree``); on a GPU that uses ``flex_attention`` with
``PackedTree.block_mask()`` instead (compiled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class _QueryBlock:
    lo: int
    hi: int
    ranges: tuple[tuple[int, int], ...]
    """Key token ranges ``[a, b)`` to gather, root first; the last one ends at ``hi``."""
    num_keys: int


class TreeBlockLayout:
    """Per query block, the keys it may attend to. Build once per packed batch.

    ``parent_index`` is ``PackedTree.parent_index``: the token before each token on its
    path, -1 at a root.
    """

    def __init__(self, parent_index: np.ndarray, block_size: int = 128):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        parent = np.asarray(parent_index, dtype=np.int64)
        n = len(parent)
        if n == 0:
            raise ValueError("empty packed sequence")
        if np.any(parent >= np.arange(n)):
            raise ValueError("parent_index must point to earlier tokens (depth-first layout)")
        starts = np.flatnonzero(parent != np.arange(n) - 1)  # tokens that begin a chain run
        seg_start = np.maximum.accumulate(np.where(parent != np.arange(n) - 1, np.arange(n), 0))
        cuts = sorted(set(starts.tolist()) | set(range(0, n, block_size)))
        bounds = []
        for a, b in zip(cuts, cuts[1:] + [n], strict=True):  # split long runs at block_size
            bounds += [(x, min(x + block_size, b)) for x in range(a, b, block_size)]
        self.n, self.block_size = n, block_size
        self.blocks = [self._block(lo, hi, parent, seg_start) for lo, hi in bounds]

    @staticmethod
    def _block(lo: int, hi: int, parent: np.ndarray, seg_start: np.ndarray) -> _QueryBlock:
        ranges = [(int(seg_start[lo]), hi)]
        i = parent[seg_start[lo]]
        while i >= 0:
            s = int(seg_start[i])
            ranges.append((s, int(i) + 1))
            i = parent[s]
        ranges.reverse()
        merged = [ranges[0]]
        for a, b in ranges[1:]:  # a first child usually follows its parent directly
            if a == merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        ranges = merged
        return _QueryBlock(
            lo=lo, hi=hi, ranges=tuple(ranges), num_keys=sum(b - a for a, b in ranges)
        )

    @property
    def pairs(self) -> int:
        """(query, key) score pairs the kernel computes (work, including diagonal waste)."""
        return sum((b.hi - b.lo) * b.num_keys for b in self.blocks)


def _gather(x: torch.Tensor, blk: _QueryBlock) -> torch.Tensor:
    """``[H, L, D]`` keys (or values) of a block: one view, or a concatenation of ranges."""
    if len(blk.ranges) == 1:
        a, b = blk.ranges[0]
        return x[:, a:b]
    return torch.cat([x[:, a:b] for a, b in blk.ranges], dim=1)


def _scatter_add(x: torch.Tensor, blk: _QueryBlock, val: torch.Tensor) -> None:
    off = 0
    for a, b in blk.ranges:
        x[:, a:b] += val[:, off : off + b - a]
        off += b - a


def _probs(q_blk, k_blk, blk: _QueryBlock, scale: float, lse=None):
    """Attention probabilities ``[Hkv, G, Bq, L]`` of one query block (and its
    log-sum-exp); ``q_blk`` is ``[Hkv, G, Bq, D]``, ``k_blk`` ``[Hkv, L, D]``."""
    s = torch.matmul(q_blk * scale, k_blk[:, None].transpose(-1, -2))  # [Hkv, G, Bq, L]
    # every gathered key before ``lo`` is an ancestor of the whole block; the block's own
    # keys (one chain, the last Bq columns) are masked causally
    bq = blk.hi - blk.lo
    s[..., -bq:].masked_fill_(_causal_mask(bq), float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)  # [Hkv, G, Bq]
    return s.sub_(lse[..., None]).exp_(), lse


_MASKS: dict[int, torch.Tensor] = {}


def _causal_mask(n: int) -> torch.Tensor:
    """[n, n] True above the diagonal (future keys), cached per size."""
    if n not in _MASKS:
        _MASKS[n] = torch.ones(n, n, dtype=torch.bool).triu_(1)
    return _MASKS[n]


class _TreeAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout: TreeBlockLayout, scale: float):
        # q: [Hkv, G, n, D] (G query heads per key/value head); k, v: [Hkv, n, D]
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], dtype=q.dtype)
        for blk in layout.blocks:
            p, m = _probs(q[:, :, blk.lo : blk.hi], _gather(k, blk), blk, scale)
            out[:, :, blk.lo : blk.hi] = torch.matmul(p, _gather(v, blk)[:, None])
            lse[:, :, blk.lo : blk.hi] = m
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (dout * out).sum(-1)  # [Hkv, G, n]
        for blk in ctx.layout.blocks:
            sl = slice(blk.lo, blk.hi)
            q_blk, k_blk, v_blk = q[:, :, sl], _gather(k, blk), _gather(v, blk)
            p, _ = _probs(q_blk, k_blk, blk, ctx.scale, lse[:, :, sl])
            dout_blk = dout[:, :, sl]
            _scatter_add(dv, blk, torch.matmul(p.transpose(-1, -2), dout_blk).sum(1))
            ds = torch.matmul(dout_blk, v_blk[:, None].transpose(-1, -2))  # dP
            ds.sub_(delta[:, :, sl, None]).mul_(p)  # dS / scale
            dq[:, :, sl] = torch.matmul(ds, k_blk[:, None] * ctx.scale)
            dk_blk = torch.matmul(ds.transpose(-1, -2), q_blk * ctx.scale).sum(1)
            _scatter_add(dk, blk, dk_blk)
        return dq, dk, dv, None, None


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: TreeBlockLayout,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of ``[heads, n, head_dim]`` q and ``[kv_heads, n, head_dim]`` k/v where
    each token sees its ancestors; ``[heads, n, head_dim]`` out.

    Grouped-query attention: query head ``h`` uses key/value head ``h // (heads //
    kv_heads)`` (as transformers' ``repeat_kv``), without repeating k/v in memory.
    ``scale`` defaults to ``1 / sqrt(head_dim)``.
    """
    if q.shape[1] != layout.n or k.shape[1] != layout.n:
        raise ValueError(f"layout is for {layout.n} tokens, got {q.shape[1]}")
    heads, kv_heads = q.shape[0], k.shape[0]
    if heads % kv_heads or k.shape != v.shape:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    grouped = q.reshape(kv_heads, heads // kv_heads, *q.shape[1:])
    return _TreeAttentionFn.apply(grouped, k, v, layout, scale).reshape(q.shape)
