"""Block-sparse tree attention for CPU training, with a flash-style backward.

``torch.nn.attention.flex_attention`` takes the tree's ``BlockMask`` but, in torch 2.13,
refuses ``requires_grad`` inputs on CPU ("FlexAttention does not support backward on
CPU"); the math fallback would also materialise every score. This kernel walks the same
block structure (``PackedTree.block_structure``): each query block gathers only the key
blocks its tokens' ancestors live in, masks the partial ones with the ancestor rule
``k <= q < subtree_end[k]``, and keeps only ``out`` and the log-sum-exp for backward,
where scores are recomputed block by block. Memory is O(n * head_dim), never O(n^2);
work is proportional to the (query, ancestor) pairs plus block-boundary waste.

On a GPU use ``flex_attention`` with ``PackedTree.block_mask()`` instead (compiled).
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
    kv: torch.Tensor | None
    """[L] key token indices to gather, or None when they are one contiguous range."""
    kv_lo: int
    kv_hi: int
    kv_end: torch.Tensor
    """[L] subtree_end of those keys (for the ancestor mask)."""
    kv_pos: torch.Tensor
    """[L] their token indices (for the ancestor mask)."""


class TreeBlockLayout:
    """Per query block, the keys it may attend to. Build once per packed batch."""

    def __init__(self, subtree_end: np.ndarray, block_size: int = 128):
        from gyre_env.trajectory.packing import block_structure

        end = np.asarray(subtree_end, dtype=np.int64)
        n = len(end)
        nonempty, _ = block_structure(end, block_size)
        self.n, self.block_size = n, block_size
        self.blocks: list[_QueryBlock] = []
        end_t = torch.as_tensor(end)
        for qb in range(nonempty.shape[0]):
            kbs = np.flatnonzero(nonempty[qb])
            idx = np.concatenate(
                [np.arange(k * block_size, min((k + 1) * block_size, n)) for k in kbs]
            )
            contiguous = idx[-1] - idx[0] + 1 == len(idx)
            idx_t = torch.as_tensor(idx)
            self.blocks.append(
                _QueryBlock(
                    lo=qb * block_size,
                    hi=min((qb + 1) * block_size, n),
                    kv=None if contiguous else idx_t,
                    kv_lo=int(idx[0]),
                    kv_hi=int(idx[-1]) + 1,
                    kv_end=end_t[idx_t],
                    kv_pos=idx_t,
                )
            )

    @property
    def pairs(self) -> int:
        """(query, key) score pairs the kernel computes (work, including block waste)."""
        return sum((b.hi - b.lo) * len(b.kv_pos) for b in self.blocks)


def _gather(x: torch.Tensor, blk: _QueryBlock) -> torch.Tensor:
    return x[:, blk.kv_lo : blk.kv_hi] if blk.kv is None else x.index_select(1, blk.kv)


def _scatter_add(x: torch.Tensor, blk: _QueryBlock, val: torch.Tensor) -> None:
    if blk.kv is None:
        x[:, blk.kv_lo : blk.kv_hi] += val
    else:
        x.index_add_(1, blk.kv, val)


def _probs(q_blk, k_blk, blk: _QueryBlock, scale: float, lse=None):
    s = torch.matmul(q_blk, k_blk.transpose(-1, -2)) * scale  # [H, Bq, L]
    qpos = torch.arange(blk.lo, blk.hi)[:, None]
    allowed = (blk.kv_pos[None, :] <= qpos) & (qpos < blk.kv_end[None, :])  # [Bq, L]
    s = s.masked_fill(~allowed, float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)  # [H, Bq]
    return torch.exp(s - lse[..., None]), lse


class _TreeAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout: TreeBlockLayout):  # q, k, v: [H, n, D]
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:2], dtype=q.dtype)
        for blk in layout.blocks:
            p, m = _probs(q[:, blk.lo : blk.hi], _gather(k, blk), blk, scale)
            out[:, blk.lo : blk.hi] = torch.matmul(p, _gather(v, blk))
            lse[:, blk.lo : blk.hi] = m
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (dout * out).sum(-1)  # [H, n]
        for blk in ctx.layout.blocks:
            sl = slice(blk.lo, blk.hi)
            q_blk, k_blk, v_blk = q[:, sl], _gather(k, blk), _gather(v, blk)
            p, _ = _probs(q_blk, k_blk, blk, ctx.scale, lse[:, sl])
            _scatter_add(dv, blk, torch.matmul(p.transpose(-1, -2), dout[:, sl]))
            dp = torch.matmul(dout[:, sl], v_blk.transpose(-1, -2))
            ds = p * (dp - delta[:, sl, None]) * ctx.scale
            dq[:, sl] = torch.matmul(ds, k_blk)
            _scatter_add(dk, blk, torch.matmul(ds.transpose(-1, -2), q_blk))
        return dq, dk, dv, None


def tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeBlockLayout
) -> torch.Tensor:
    """Attention of ``[heads, n, head_dim]`` q/k/v where each token sees its ancestors."""
    if q.shape[1] != layout.n:
        raise ValueError(f"layout is for {layout.n} tokens, got {q.shape[1]}")
    return _TreeAttentionFn.apply(q, k, v, layout)
