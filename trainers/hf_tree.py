"""Train a Hugging Face causal LM on packed token trees (``PackedTree``).

The model that trains is the model that serves: any transformers causal LM whose decoder
takes ``position_ids`` (Qwen2 at least). ``attention_for`` picks the attention structure
for a packed tree and ``tree_logprobs`` runs one packed forward and returns the logprob
of every loss token; the logits that predict token ``i`` sit at ``parent_index[i]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gyre_env.trainers.tree_attention import TreeBlockLayout
from torch.utils.checkpoint import checkpoint

from gyre_env.trajectory.packing import PackedTree


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
    """``[num_loss_tokens]`` logprobs of the loss tokens of ``softmax(logits / temperature)``
    in token order, and their entropies if ``with_entropy`` (else ``None``).

    ``batch`` is ``PackedTree.tensors()``. Only rows that predict a loss token go through
    the LM head, ``chunk_size`` rows at a time and recomputed in backward, so
    ``[num_loss_tokens, vocab]`` logits never exist at once.
    """
    if not isinstance(attention, torch.Tensor):
        raise NotImplementedError("only dense masks for now")
    mask = torch.zeros(attention.shape, dtype=torch.float32, device=attention.device)
    mask.masked_fill_(~attention, torch.finfo(torch.float32).min)
    hidden = model.get_decoder()(
        input_ids=batch["input_ids"][None],
        position_ids=batch["position_ids"][None],
        attention_mask=mask[None, None],
        use_cache=False,
    ).last_hidden_state[0]
    return _loss_rows_logprobs(model, hidden, batch, temperature, with_entropy, chunk_size)


def _loss_rows_logprobs(model, hidden, batch, temperature, with_entropy, chunk_size):
    sel = batch["loss_mask"]
    rows = hidden[batch["parent_index"][sel]]  # [m, hidden]
    targets = batch["input_ids"][sel]
    head = model.get_output_embeddings()
    lps, ents = [], []
    for a in range(0, len(rows), chunk_size):
        args = (rows[a : a + chunk_size], head.weight, head.bias, targets[a : a + chunk_size])
        kw = dict(temperature=temperature, with_entropy=with_entropy)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk, *args, **kw, use_reentrant=False)
        else:
            lp, ent = _chunk(*args, **kw)
        lps.append(lp)
        ents.append(ent)
    empty = rows.new_zeros(0, dtype=torch.float32)
    lp = torch.cat(lps) if lps else empty
    ent = (torch.cat(ents) if ents else empty) if with_entropy else None
    return lp, ent


def _chunk(rows, weight, bias, targets, *, temperature: float, with_entropy: bool):
    logits = F.linear(rows, weight, bias).float() / temperature  # [chunk, vocab]
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, targets[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else lp.new_zeros(0)
    return lp, ent
