"""A small decoder-only transformer that trains on packed token trees.

It takes ``(input_ids, position_ids, attention)`` for one packed sequence: RoPE uses
the explicit position ids (the depth in the tree), and ``attention`` says who sees whom:

- ``"causal"``: an ordinary causal sequence (one path alone; torch SDPA);
- a ``[n, n]`` bool tensor (``PackedTree.dense_mask()``): small inputs; O(n^2) memory;
- a ``TreeBlockLayout``: the block-sparse CPU kernel with recomputing backward;
- a flex_attention ``BlockMask`` (``PackedTree.block_mask()``): flex_attention, which in
  torch 2.13 runs forward-only on CPU and fwd+bwd on GPU.

``packed_logprobs`` and ``tree_policy_loss`` are how a trainer consumes a ``PackedTree``:
the logits that predict token ``i`` sit at ``parent_index[i]``, and only loss tokens
get logits at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from gyre_env.trainers.tree_attention import TreeBlockLayout, tree_attention
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(kw_only=True)
class TreeModelConfig:
    """Shape of the tiny model (defaults: ~0.6M parameters, fast on 2 CPU cores)."""

    vocab_size: int = 1024
    """Token ids must be below this."""
    d_model: int = 128
    """Hidden size."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads (``d_model`` must divide evenly)."""
    d_ff: int = 384
    """SwiGLU inner size."""
    rope_theta: float = 10000.0
    """RoPE base."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model={self.d_model} must split into {self.n_heads} heads of even size"
            )


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``[H, n, D]`` by explicit ``[n]`` positions."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # [n, D/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class _Block(nn.Module):
    def __init__(self, cfg: TreeModelConfig):
        super().__init__()
        self.cfg = cfg
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attention) -> torch.Tensor:
        n, h = x.shape[0], self.cfg.n_heads
        q, k, v = self.qkv(self.attn_norm(x)).view(n, 3, h, -1).permute(1, 2, 0, 3)  # [H, n, D]
        q = _rope(q, positions, self.cfg.rope_theta)
        k = _rope(k, positions, self.cfg.rope_theta)
        o = _attend(q, k, v, attention)  # [H, n, D]
        x = x + self.proj(o.transpose(0, 1).reshape(n, -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def _attend(q, k, v, attention) -> torch.Tensor:
    if isinstance(attention, str):
        if attention != "causal":
            raise ValueError(f"unknown attention {attention!r}; use 'causal' or a mask")
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if isinstance(attention, TreeBlockLayout):
        return tree_attention(q, k, v, attention)
    if isinstance(attention, torch.Tensor):
        if attention.dtype != torch.bool or attention.shape != (q.shape[1], q.shape[1]):
            raise ValueError(f"dense mask must be bool [{q.shape[1]}]*2, got {attention.shape}")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention)
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    if isinstance(attention, BlockMask):
        flex = _compiled_flex() if q.is_cuda else flex_attention  # CPU: forward only
        return flex(q[None], k[None], v[None], block_mask=attention)[0]
    raise TypeError(f"unsupported attention structure {type(attention).__name__}")


_COMPILED_FLEX = []


def _compiled_flex():
    """flex_attention compiled once (on GPU the eager version materialises all scores)."""
    if not _COMPILED_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX.append(torch.compile(flex_attention))
    return _COMPILED_FLEX[0]


def attention_for(
    packed, *, device: str = "cpu", dense_max_tokens: int = 2048, block_size: int = 128
):
    """The attention structure for a ``PackedTree``: a dense mask up to
    ``dense_max_tokens`` tokens, else the block-sparse CPU kernel's layout, or on a GPU a
    flex_attention ``BlockMask`` (run compiled)."""
    if len(packed) <= dense_max_tokens:
        return packed.dense_mask(device)
    if str(device).startswith("cuda"):
        return packed.block_mask(block_size, device=device)
    return TreeBlockLayout(packed.parent_index, block_size)


class TreeTransformer(nn.Module):
    """Embeddings, ``n_layers`` pre-norm blocks, untied LM head. One packed sequence in."""

    def __init__(self, cfg: TreeModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def hidden(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention
    ) -> torch.Tensor:
        """[n, d_model] final hidden states."""
        if input_ids.dim() != 1 or input_ids.shape != position_ids.shape:
            raise ValueError(
                f"want 1-D input_ids and position_ids of one shape, got "
                f"{tuple(input_ids.shape)} and {tuple(position_ids.shape)}"
            )
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, position_ids, attention)
        return self.norm(x)

    def forward(self, input_ids, position_ids, attention) -> torch.Tensor:
        """[n, vocab] logits; position ``i`` predicts the token after ``i`` on its path."""
        return self.lm_head(self.hidden(input_ids, position_ids, attention))


def packed_logprobs(
    model: TreeTransformer, batch: dict, attention, *, chunk_size: int = 2048
) -> torch.Tensor:
    """[num_loss_tokens] logprobs of the loss tokens of a packed batch, in token order.

    ``batch`` is ``PackedTree.tensors()``; only rows that predict a loss token go through
    the LM head, ``chunk_size`` rows at a time, recomputed in backward (checkpointed), so
    ``[num_loss_tokens, vocab]`` logits never exist at once - with a large vocabulary
    they would otherwise dominate memory in both tree and flat layouts.
    """
    hidden = model.hidden(batch["input_ids"], batch["position_ids"], attention)
    sel = batch["loss_mask"]
    rows = hidden[batch["parent_index"][sel]]  # [m, d_model]
    targets = batch["input_ids"][sel]
    weight = model.lm_head.weight
    out = []
    for a in range(0, len(rows), chunk_size):
        args = (rows[a : a + chunk_size], weight, targets[a : a + chunk_size])
        if torch.is_grad_enabled():
            out.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(*args))
    return torch.cat(out) if out else rows.new_zeros(0)


def _chunk_logprobs(rows: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
    logits = F.linear(rows, weight).float()  # [chunk, vocab]
    return logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def tree_policy_loss(
    logprobs: torch.Tensor, batch: dict, *, clip: float = 0.2, normalizer: float | None = None
) -> torch.Tensor:
    """PPO-clip policy loss over loss tokens: ``-sum(w * min(r*A, clip(r)*A)) / normalizer``.

    ``logprobs`` comes from ``packed_logprobs``; ``r`` is the ratio to the behaviour
    logprobs; ``w`` and ``A`` are the packed weights and advantages. ``normalizer``
    defaults to the number of loss tokens; to compare a tree with its flat layout pass
    the same value to both. On-policy (``r == 1``) the tree loss equals the flat one
    exactly; with clipping, tokens shared by several sampling calls use their weighted
    mean advantage.
    """
    sel = batch["loss_mask"]
    adv = batch["advantages"][sel]
    w = batch["weights"][sel]
    ratio = torch.exp(logprobs - batch["behaviour_logprobs"][sel])
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    total = -(w * surrogate).sum()
    return total / (normalizer if normalizer is not None else max(int(sel.sum()), 1))


def hf_packed_logprobs(hf_model, batch: dict, dense_mask: torch.Tensor) -> torch.Tensor:
    """``packed_logprobs`` for a Hugging Face causal LM (checked exact on Qwen2, sdpa and
    eager attention, transformers 5.x): the tree goes in as a 4-D additive mask with
    explicit position ids. Dense, so O(n^2) memory: for small packed trees."""
    mask = torch.zeros(dense_mask.shape, dtype=torch.float32, device=dense_mask.device)
    mask.masked_fill_(~dense_mask, torch.finfo(torch.float32).min)
    out = hf_model(
        input_ids=batch["input_ids"][None],
        position_ids=batch["position_ids"][None],
        attention_mask=mask[None, None],
    )
    sel = batch["loss_mask"]
    logits = out.logits[0, batch["parent_index"][sel]]
    return torch.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][sel][:, None])[:, 0]
