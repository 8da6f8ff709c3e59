"""A megatron-core ``GPTModel`` built from a Hugging Face Qwen2-style config.

Qwen2 (and Llama-style models with q/k/v bias) map onto megatron-core as: RMSNorm
(``normalization="RMSNorm"``), SwiGLU (``gated_linear_unit`` with SiLU, gate and up
fused in ``linear_fc1``), RoPE (``position_embedding_type="rope"``, not interleaved:
HF's ``rotate_half``), grouped-query attention (``num_query_groups``), bias on q/k/v only
(``add_qkv_bias``, ``add_bias_linear=False``). The layer spec is megatron's local one
(plain torch modules) unless Transformer Engine is importable and asked for.
"""

from __future__ import annotations

import os
import socket

import torch

_STARTED_GROUP: list[bool] = []
"""Set when ``init_parallel`` started the process group itself (``shutdown_parallel``)."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise NotImplementedError(f"RoPE scaling {params['rope_type']!r} is not mapped")
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def check_supported(hf_config) -> None:
    """Refuse HF configs whose architecture this mapping would get wrong."""
    if hf_config.model_type not in ("qwen2", "llama"):
        raise NotImplementedError(f"no Megatron mapping for model_type {hf_config.model_type!r}")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise NotImplementedError(f"activation {hf_config.hidden_act!r} is not SwiGLU")
    if getattr(hf_config, "use_sliding_window", False):
        raise NotImplementedError("sliding-window attention is not mapped")
    if getattr(hf_config, "attention_dropout", 0.0):
        raise NotImplementedError("attention dropout is not supported by tree training")


def head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads
    )


def fused_softmax_available() -> bool:
    """Whether megatron's fused masked-softmax kernel imports (``scaled_masked_softmax_cuda``,
    built by apex or Transformer Engine; a plain megatron-core wheel lacks it). With the
    fusion on and the kernel missing, the bf16 path for units of 4096 tokens or fewer
    fails at its first forward; without the fusion megatron uses torch's softmax."""
    import importlib.util

    kernels = ("scaled_masked_softmax_cuda", "scaled_softmax_cuda")
    return all(importlib.util.find_spec(k) is not None for k in kernels)


def transformer_config(hf_config, *, dtype: str = "float32", tp: int = 1, cuda: bool = False):
    """megatron's ``TransformerConfig`` for ``hf_config``; fusions only on CUDA."""
    from megatron.core.transformer import TransformerConfig

    check_supported(hf_config)
    qkv_bias = hf_config.model_type == "qwen2" or getattr(hf_config, "attention_bias", False)
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim(hf_config),
        layernorm_epsilon=hf_config.rms_norm_eps,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=_DTYPES[dtype],
        bf16=dtype == "bfloat16",
        fp16=dtype == "float16",
        tensor_model_parallel_size=tp,
        use_cpu_initialization=not cuda,
        perform_initialization=False,  # every weight comes from the HF checkpoint
        bias_activation_fusion=cuda,
        masked_softmax_fusion=cuda and fused_softmax_available(),
        bias_dropout_fusion=cuda,
        apply_rope_fusion=False,  # positions are per token (tree depths), not 0..n-1
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        attention_softmax_in_fp32=True,
        # losses arrive already divided by the step's global normalizer: data-parallel
        # gradients are summed, not averaged
        calculate_per_token_loss=True,
    )


def layer_spec(use_te: bool = False):
    """The decoder layer spec with an arbitrary attention mask (the tree's): megatron's
    local modules (core attention that also takes the block-sparse tree layout), or
    Transformer Engine's when ``use_te``."""
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.enums import AttnMaskType

    if use_te:
        spec = specs.get_gpt_layer_with_transformer_engine_spec()
    else:
        from gyre_env.trainers.megatron.forward import tree_core_attention

        spec = specs.get_gpt_layer_local_spec(normalization="RMSNorm")
        spec.submodules.self_attention.submodules.core_attention = tree_core_attention()
    spec.submodules.self_attention.params["attn_mask_type"] = AttnMaskType.arbitrary
    return spec


def build_gpt_model(hf_config, *, dtype: str = "float32", use_te: bool = False, cuda=False):
    """An uninitialised ``GPTModel`` shaped like ``hf_config`` (load weights after)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    tp = parallel_state.get_tensor_model_parallel_world_size()
    if hf_config.vocab_size % tp:
        raise ValueError(f"vocab_size {hf_config.vocab_size} must divide by TP={tp}")
    config = transformer_config(hf_config, dtype=dtype, tp=tp, cuda=cuda)
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(use_te),
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
        position_embedding_type="rope",
        rotary_base=_rope_theta(hf_config),
    )


def init_parallel(tensor_parallel: int = 1, *, backend: str = "gloo") -> None:
    """megatron's parallel state over the current ``torch.distributed`` group, starting a
    one-process group first when none runs (a single trainer needs one too)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
        _STARTED_GROUP.append(True)
    if parallel_state.model_parallel_is_initialized():
        have = parallel_state.get_tensor_model_parallel_world_size()
        if have != tensor_parallel:
            raise ValueError(f"megatron already runs with TP={have}, asked for {tensor_parallel}")
        return
    if dist.get_world_size() % tensor_parallel:
        raise ValueError(f"world size {dist.get_world_size()} does not divide by TP")
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel)


def shutdown_parallel() -> None:
    """Undo ``init_parallel``: megatron's parallel state, and the process group if
    ``init_parallel`` started it (so a process can go on without megatron)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if _STARTED_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _STARTED_GROUP.clear()
