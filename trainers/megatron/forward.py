"""Packed-tree forward through a megatron-core ``GPTModel``: per-token logprobs.

A packed tree is one sequence whose tokens see only their ancestors, at their depth as
position. Both drive megatron's own modules, not a re-implementation of them:

- positions: the RoPE table from ``model.rotary_pos_emb`` is indexed at each token's
  depth (``position_ids``) and handed to the decoder as ``rotary_pos_emb`` (megatron's
  ``GPTModel.forward`` would build it for positions ``0..n-1``);
- attention: ``model.layer_spec`` sets ``AttnMaskType.arbitrary``; the decoder gets the
  ancestor-only mask (megatron's convention, True = masked) as ``attention_mask`` and
  megatron's ``DotProductAttention`` (or TE's on GPU) applies it. Trees longer than
  ``dense_max_tokens`` go to ``TreeDotProductAttention`` instead, with what the torch
  backend uses for them (``hf_tree.attention_for``): on CPU the block-sparse kernel
  (``trainers.tree_attention``), on CUDA flex_attention with the tree's ``BlockMask``;
  neither builds an ``[n, n]`` mask (a dense 8192-token mask took the 1.5B step out of
  memory on an H200).

Logits: only rows that predict a loss token go through ``output_layer`` (vocab-parallel
under TP, gathered to full rows), in chunks recomputed in backward, as in ``hf_tree``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gyre_env.trainers.hf_tree import attention_for, chunked_logprobs, flex_tree_attention
from gyre_env.trainers.tree_attention import TreeBlockLayout, tree_attention

from gyre_env.trajectory.packing import PackedTree


@dataclass(frozen=True)
class TreeLayoutMask:
    """What the decoder gets as ``attention_mask`` for a tree past the dense limit: the
    block-sparse kernel's ``TreeBlockLayout`` (CPU) or a flex_attention ``BlockMask``
    (CUDA)."""

    layout: object


def attention_mask_for(
    packed: PackedTree, *, device="cpu", dense_max_tokens=2048, block=128, sparse=True
):
    """``[1, 1, n, n]`` bool, True where a query may *not* see a key (megatron's mask
    convention), or a ``TreeLayoutMask`` for trees over ``dense_max_tokens`` (``sparse``:
    the core attention is ``TreeDotProductAttention``; Transformer Engine's takes only a
    dense mask). The structure is the torch backend's (``hf_tree.attention_for``)."""
    limit = dense_max_tokens if sparse else len(packed)
    structure = attention_for(packed, device=device, dense_max_tokens=limit, block_size=block)
    if isinstance(structure, torch.Tensor):
        return ~structure[None, None]
    return TreeLayoutMask(structure)


def tree_core_attention():
    """``DotProductAttention`` that also takes a ``TreeLayoutMask`` (built lazily: the
    class derives from megatron's)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class TreeDotProductAttention(DotProductAttention):
        """megatron's local core attention; a ``TreeLayoutMask`` goes to the tree kernel
        (a ``TreeBlockLayout``) or to flex_attention (a ``BlockMask``)."""

        def forward(self, query, key, value, attention_mask, *args, **kwargs):
            if not isinstance(attention_mask, TreeLayoutMask):
                return super().forward(query, key, value, attention_mask, *args, **kwargs)
            if query.shape[1] != 1:
                raise ValueError("tree attention takes one packed sequence (batch 1)")
            q = query[:, 0].transpose(0, 1)  # [sq, 1, np, hn] -> [np, n, hn]
            k, v = key[:, 0].transpose(0, 1), value[:, 0].transpose(0, 1)
            layout, scale = attention_mask.layout, self.softmax_scale
            if isinstance(layout, TreeBlockLayout):
                out = tree_attention(q, k, v, layout, scale=scale)
            else:  # [1, heads, n, hn] in and out, grouped keys and values as they come
                out = flex_tree_attention(q[None], k[None], v[None], layout, scale)[0]
            return out.transpose(0, 1).reshape(query.shape[0], 1, -1)  # [sq, 1, hp]

    return TreeDotProductAttention


def tree_hidden_states(model, input_ids, position_ids, attention_mask) -> torch.Tensor:
    """``[n, hidden]`` final (normed) hidden states of one packed sequence."""
    x = model.embedding(input_ids=input_ids[None], position_ids=position_ids[None])  # [n, 1, h]
    table = model.rotary_pos_emb(int(position_ids.max()) + 1)  # [L, 1, 1, dim]
    rotary = table[position_ids]  # [n, 1, 1, dim]: RoPE at the tree depths
    hidden = model.decoder(hidden_states=x, attention_mask=attention_mask, rotary_pos_emb=rotary)
    return hidden[:, 0]


def _chunk_logprobs(rows, weight, targets, *, output_layer, temperature, with_entropy):
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    local, _ = output_layer(rows[:, None], weight=weight)  # [chunk, 1, vocab / tp]
    logits = gather_from_tensor_model_parallel_region(local)[:, 0].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, targets[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else lp.new_zeros(0)
    return lp, ent


def tree_logprobs(
    model,
    batch: dict,
    attention_mask,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 2048,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[num_loss_tokens]`` logprobs under ``softmax(logits / temperature)`` (and
    entropies if ``with_entropy``): ``hf_tree.tree_logprobs`` for a megatron model."""
    if batch["input_ids"].dim() != 1 or batch["input_ids"].shape != batch["position_ids"].shape:
        raise ValueError("want one packed sequence: 1-D input_ids and position_ids of one shape")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    hidden = tree_hidden_states(model, batch["input_ids"], batch["position_ids"], attention_mask)
    sel = batch["loss_mask"]
    rows = hidden[batch["parent_index"][sel]]  # [m, hidden]
    targets = batch["input_ids"][sel]
    weight = (
        model.shared_embedding_or_output_weight()
        if model.share_embeddings_and_output_weights
        else None
    )
    kw = dict(output_layer=model.output_layer, temperature=temperature, with_entropy=with_entropy)
    return chunked_logprobs(_chunk_logprobs, rows, targets, (weight,), chunk_size, kw)
