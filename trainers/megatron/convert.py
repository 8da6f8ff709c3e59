"""Hugging Face ⇄ megatron-core weights for Qwen2-style models, both ways, bit-exact.

Only reshuffles (no arithmetic), so a round trip returns the same bits. Layout facts:

- ``linear_qkv`` stacks q, k and v per query group: for group ``g``, its ``heads /
  groups`` query heads, then ``k_g``, then ``v_g`` (rows of ``head_dim`` each). Bias the
  same way.
- ``linear_fc1`` is ``[gate; up]``; under tensor parallelism each rank holds ``[gate_r;
  up_r]``, so sharding splits gate and up separately.
- Column-parallel weights (qkv, fc1, embeddings, output layer) split on dim 0, row-parallel
  ones (``linear_proj``, ``linear_fc2``) on dim 1; norms are replicated.
- With Transformer Engine's spec the pre-attention and pre-MLP norms are fused into
  ``linear_qkv.layer_norm_weight`` and ``linear_fc1.layer_norm_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QkvDims:
    heads: int
    groups: int
    head_dim: int

    @classmethod
    def of(cls, hf_config) -> QkvDims:
        from gyre_env.trainers.megatron.model import head_dim

        return cls(
            hf_config.num_attention_heads, hf_config.num_key_value_heads, head_dim(hf_config)
        )


def _qkv_to_megatron(q, k, v, dims: QkvDims) -> torch.Tensor:
    g, per = dims.groups, dims.heads // dims.groups
    rest = q.shape[1:]
    q = q.reshape(g, per * dims.head_dim, *rest)
    k = k.reshape(g, dims.head_dim, *rest)
    v = v.reshape(g, dims.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _qkv_to_hf(qkv, dims: QkvDims):
    g, per, d = dims.groups, dims.heads // dims.groups, dims.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (per + 2) * d, *rest)
    q, k, v = torch.split(grouped, [per * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _layer_names(i: int, te: bool) -> dict[str, str]:
    """megatron name -> HF name for the one-to-one tensors of decoder layer ``i``."""
    m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
    ln_attn = "self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"
    ln_mlp = "mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"
    return {
        m + ln_attn: h + "input_layernorm.weight",
        m + ln_mlp: h + "post_attention_layernorm.weight",
        m + "self_attention.linear_proj.weight": h + "self_attn.o_proj.weight",
        m + "mlp.linear_fc2.weight": h + "mlp.down_proj.weight",
    }


def hf_to_megatron(hf: dict, hf_config, *, te: bool = False) -> dict[str, torch.Tensor]:
    """Full (unsharded) megatron tensors by megatron name from an HF state dict."""
    dims, out = QkvDims.of(hf_config), {}
    out["embedding.word_embeddings.weight"] = hf["model.embed_tokens.weight"]
    for i in range(hf_config.num_hidden_layers):
        for m_name, h_name in _layer_names(i, te).items():
            out[m_name] = hf[h_name]
        m, a = f"decoder.layers.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias"):
            if a + f"self_attn.q_proj.{kind}" in hf:
                qkv = [hf[a + f"self_attn.{p}_proj.{kind}"] for p in "qkv"]
                out[m + f"self_attention.linear_qkv.{kind}"] = _qkv_to_megatron(*qkv, dims)
        gate, up = hf[a + "mlp.gate_proj.weight"], hf[a + "mlp.up_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if not hf_config.tie_word_embeddings:
        out["output_layer.weight"] = hf["lm_head.weight"]
    return out


def megatron_to_hf(full: dict, hf_config, *, te: bool = False) -> dict[str, torch.Tensor]:
    """An HF state dict (the served model's names, ``lm_head.weight`` included when tied)
    from full megatron tensors."""
    dims, out = QkvDims.of(hf_config), {}
    out["model.embed_tokens.weight"] = full["embedding.word_embeddings.weight"]
    for i in range(hf_config.num_hidden_layers):
        m, a = f"decoder.layers.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias"):
            if m + f"self_attention.linear_qkv.{kind}" in full:
                q, k, v = _qkv_to_hf(full[m + f"self_attention.linear_qkv.{kind}"], dims)
                for p, t in zip("qkv", (q, k, v), strict=True):
                    out[a + f"self_attn.{p}_proj.{kind}"] = t
        for m_name, h_name in _layer_names(i, te).items():
            out[h_name] = full[m_name]
        gate, up = torch.chunk(full[m + "mlp.linear_fc1.weight"], 2, dim=0)
        out[a + "mlp.gate_proj.weight"], out[a + "mlp.up_proj.weight"] = gate, up
    out["model.norm.weight"] = full["decoder.final_layernorm.weight"]
    tied = hf_config.tie_word_embeddings
    out["lm_head.weight"] = full[
        "embedding.word_embeddings.weight" if tied else "output_layer.weight"
    ]
    return out


def _split_dim(name: str) -> int | None:
    """The dimension a tensor-parallel weight is split on; None when replicated."""
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    if "layernorm" in name or name.endswith("layer_norm_weight"):
        return None
    return 0


def shard(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s share of a full megatron tensor under ``size``-way TP."""
    dim = _split_dim(name)
    if size == 1 or dim is None:
        return full
    if name.endswith("linear_fc1.weight"):
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([gate.chunk(size, 0)[rank], up.chunk(size, 0)[rank]], dim=0)
    return full.chunk(size, dim=dim)[rank]


def unshard(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor from every TP rank's share (inverse of ``shard``)."""
    dim = _split_dim(name)
    if len(shards) == 1 or dim is None:
        return shards[0]
    if name.endswith("linear_fc1.weight"):
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=dim)


@torch.no_grad()
def load_hf_into(model, hf: dict, hf_config, *, te: bool = False) -> None:
    """Copy an HF state dict into this TP rank's megatron ``model`` parameters; every
    parameter must be covered (a missed one would silently keep its init). Also marks
    the split parameters tensor-parallel, as megatron's own initialisation would."""
    from megatron.core import parallel_state as ps

    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    full = hf_to_megatron(hf, hf_config, te=te)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(full))
    unused = sorted(set(full) - set(params))
    if missing or unused:
        raise KeyError(f"HF->Megatron mapping mismatch: missing {missing}, unused {unused}")
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    for name, param in params.items():
        dim = _split_dim(name)
        if dim is not None and not getattr(param, "tensor_model_parallel", False):
            # megatron sets these only when it initialises the weight itself
            # (perform_initialization); its grad-norm and optimizer read them
            set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)
        local = shard(name, full[name], rank, size)
        if local.shape != param.shape:
            raise ValueError(
                f"{name}: HF gives {tuple(local.shape)}, model has {tuple(param.shape)}"
            )
        param.copy_(local)


@torch.no_grad()
def full_megatron_state(model) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` as a full tensor, gathered over the TP group."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    size = ps.get_tensor_model_parallel_world_size()
    out = {}
    for name, param in model.named_parameters():
        local = param.detach()
        if size > 1 and _split_dim(name) is not None:
            shards = [torch.empty_like(local) for _ in range(size)]
            dist.all_gather(shards, local.contiguous(), group=ps.get_tensor_model_parallel_group())
            local = unshard(name, shards)
        out[name] = local
    return out
