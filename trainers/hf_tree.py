"""Train a Hugging Face causal LM on packed token trees (``PackedTree``).

The model that trains is the model that serves: any transformers causal LM whose decoder
takes ``position_ids`` and dispatches attention through transformers'
``AttentionInterface`` (Qwen2, Llama, Qwen3, ...). ``attention_for`` picks the attention
structure of a packed tree; ``tree_logprobs`` runs one packed forward and returns the
logprob of every loss token (the logits predicting token ``i`` sit at
``parent_index[i]``).

Attention. For the duration of a ``tree_logprobs`` call the model's attention
implementation is switched to ``"gyre_tree"`` (registered with transformers once), and
every layer receives the tree structure as its ``attention_mask``:

- a ``[n, n]`` bool mask: torch SDPA with that mask (small trees, O(n^2) memory);
- a ``TreeBlockLayout``: the block-sparse CPU kernel of ``tree_attention`` (O(n * d)
  memory, recomputing backward);
- a flex_attention ``BlockMask``: flex_attention, compiled on CUDA (fwd + bwd); on CPU
  torch 2.13 runs it forward only.

Grouped-query attention is handled without repeating k/v. Serving is untouched: the
previous implementation is restored on exit, and any ordinary mask reaching
``"gyre_tree"`` goes to SDPA. The switch is on the model object, so do not serve the
same object from another thread during a training call.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from gyre_env.trainers.tree_attention import TreeBlockLayout, tree_attention
from torch.utils.checkpoint import checkpoint

from gyre_env.trajectory.packing import PackedTree

TREE_ATTENTION = "gyre_tree"
"""The name Gyre's tree attention is registered under in transformers."""


def attention_for(
    packed: PackedTree, *, device="cpu", dense_max_tokens: int = 2048, block_size: int = 128
):
    """The attention structure for ``tree_logprobs``: a dense ``[n, n]`` bool mask up to
    ``dense_max_tokens`` tokens; beyond, on CUDA a flex_attention ``BlockMask``, else the
    block-sparse CPU kernel's ``TreeBlockLayout``."""
    if len(packed) <= dense_max_tokens:
        return packed.dense_mask(device)
    if str(device).startswith("cuda"):
        return packed.block_mask(block_size, device=device)
    return TreeBlockLayout(packed.parent_index, block_size)


def tree_logprobs(
    model,
    batch: dict,
    attention,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 2048,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[num_loss_tokens]`` logprobs of the loss tokens under ``softmax(logits /
    temperature)``, in token order, and their entropies if ``with_entropy`` (else ``None``).

    ``batch`` is ``PackedTree.tensors()`` and ``attention`` comes from ``attention_for``.
    Only rows that predict a loss token go through the LM head, ``chunk_size`` rows at a
    time and recomputed in backward, so ``[num_loss_tokens, vocab]`` logits never exist at
    once (with a large vocabulary they would dominate memory).
    """
    if batch["input_ids"].dim() != 1 or batch["input_ids"].shape != batch["position_ids"].shape:
        raise ValueError("want one packed sequence: 1-D input_ids and position_ids of one shape")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    hidden = tree_hidden_states(model, batch["input_ids"], batch["position_ids"], attention)
    sel = batch["loss_mask"]
    rows = hidden[batch["parent_index"][sel]]  # [m, hidden]
    targets = batch["input_ids"][sel]
    head = model.get_output_embeddings()
    kw = {"temperature": temperature, "with_entropy": with_entropy}
    return chunked_logprobs(
        _chunk_logprobs, rows, targets, (head.weight, head.bias), chunk_size, kw
    )


def chunked_logprobs(fn, rows, targets, consts: tuple, chunk_size: int, kw: dict):
    """``fn(rows_chunk, *consts, targets_chunk, **kw) -> (logprobs, entropies)`` over
    ``chunk_size`` rows at a time, each chunk recomputed in backward (checkpointed) when
    gradients are on, so a chunk's logits are never all kept; returns the concatenation
    (entropies None unless ``kw["with_entropy"]``)."""
    lps, ents = [], []
    for a in range(0, len(rows), chunk_size):
        args = (rows[a : a + chunk_size], *consts, targets[a : a + chunk_size])
        if torch.is_grad_enabled():
            lp, ent = checkpoint(fn, *args, **kw, use_reentrant=False)
        else:
            lp, ent = fn(*args, **kw)
        lps.append(lp)
        ents.append(ent)
    empty = rows.new_zeros(0, dtype=torch.float32)
    lp = torch.cat(lps) if lps else empty
    return lp, ((torch.cat(ents) if ents else empty) if kw["with_entropy"] else None)


def _chunk_logprobs(rows, weight, bias, targets, *, temperature: float, with_entropy: bool):
    logits = F.linear(rows, weight, bias).float() / temperature  # [chunk, vocab]
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, targets[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else lp.new_zeros(0)
    return lp, ent


def tree_hidden_states(
    model, input_ids: torch.Tensor, position_ids: torch.Tensor, attention
) -> torch.Tensor:
    """``[n, hidden]`` final hidden states of one packed sequence under tree attention."""
    decoder = model.get_decoder()
    layer_types = getattr(model.config, "layer_types", None) or ["full_attention"]
    mask = _TreeMask(attention)
    with tree_attention_mode(model):
        out = decoder(
            input_ids=input_ids[None],
            position_ids=position_ids[None],
            attention_mask={t: mask for t in set(layer_types)},  # prepared: no mask building
            use_cache=False,
        )
    return out.last_hidden_state[0]


@contextlib.contextmanager
def tree_attention_mode(model):
    """Switch ``model`` to ``"gyre_tree"`` attention inside the block; restore on exit."""
    _register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(TREE_ATTENTION)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


@dataclass(frozen=True)
class _TreeMask:
    """What every layer gets as ``attention_mask``: the tree's attention structure."""

    structure: object


_REGISTERED: list[bool] = []


def _register() -> None:
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(TREE_ATTENTION, _tree_attention_forward)
    AttentionMaskInterface.register(TREE_ATTENTION, sdpa_mask)  # ordinary calls: SDPA masks
    _REGISTERED.append(True)


def _tree_attention_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``[B, H, n, D]`` q, ``[B, Hkv, n, D]`` k/v in,
    ``[B, n, H, D]`` out."""
    if not isinstance(attention_mask, _TreeMask):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("tree attention does not implement sliding-window layers")
    if query.shape[0] != 1:
        raise ValueError(f"tree attention takes one packed sequence, got batch {query.shape[0]}")
    structure = attention_mask.structure
    if isinstance(structure, TreeBlockLayout):
        _no_dropout(dropout, "the block-sparse kernel")
        out = tree_attention(query[0], key[0], value[0], structure, scale=scaling)[None]
    elif isinstance(structure, torch.Tensor):
        n = query.shape[2]
        if structure.dtype != torch.bool or structure.shape != (n, n):
            raise ValueError(f"dense tree mask must be bool [{n}, {n}], got {structure.shape}")
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=structure[None, None],
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=True,
        )
    else:
        _no_dropout(dropout, "flex_attention")
        out = flex_tree_attention(query, key, value, structure, scaling)
    return out.transpose(1, 2).contiguous(), None


def flex_tree_attention(query, key, value, block_mask, scaling=None) -> torch.Tensor:
    """flex_attention over a tree's ``BlockMask``: ``[B, H, n, D]`` queries, ``[B, Hkv, n,
    D]`` keys and values (``H`` a multiple of ``Hkv``), compiled on CUDA (its eager form
    builds every score). Both backends' trees past their dense limit go through here on
    a GPU."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"unsupported tree attention structure {type(block_mask).__name__}")
    if not query.is_cuda and torch.is_grad_enabled() and query.requires_grad:
        raise ValueError("flex_attention has no CPU backward; use a TreeBlockLayout on CPU")
    flex = _compiled_flex() if query.is_cuda else flex_attention
    return flex(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=True)


def _no_dropout(dropout: float, where: str) -> None:
    if dropout:
        raise NotImplementedError(f"attention dropout is not implemented in {where}")


_COMPILED_FLEX: list = []


def _compiled_flex():
    """flex_attention compiled once (on GPU the eager version materialises all scores)."""
    if not _COMPILED_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX.append(torch.compile(flex_attention))
    return _COMPILED_FLEX[0]


def tiny_qwen2(
    *,
    vocab_size: int = 1024,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    seed: int = 0,
):
    """A random-init fp32 ``Qwen2ForCausalLM`` (nothing downloaded), for tests and
    benchmarks; attention dropout 0, SDPA for ordinary calls."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=1 << 17,
        attention_dropout=0.0,
        use_sliding_window=False,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(cfg).float()
