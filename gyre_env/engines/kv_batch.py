"""A left-padded KV cache shared by the sequences the embedded engine decodes together.

Continuous batching with left padding: each new sequence is prefilled alone (so its prompt
is computed exactly as if it ran alone), then its cache is merged into the running batch by
padding the shorter side on the left; every decode step feeds one token per row with a
``[batch, past + 1]`` attention mask that hides the padding and per-row position ids.
Finished rows are dropped and all-padding columns on the left are trimmed.

Only plain full-attention caches (``DynamicLayer``) can be merged this way; models with
sliding-window or other cache layers are served one sequence at a time (``mergeable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def cache_is_mergeable(model_config) -> bool:
    """True when the model's dynamic cache is made only of plain full-attention layers."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model_config)
    except Exception:  # noqa: BLE001 - an exotic config: be conservative
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def new_cache(model_config):
    from transformers import DynamicCache

    return DynamicCache(config=model_config)


def filled_cache(model_config, keys: list, values: list):
    """A batch-1 cache holding migrated KV: per layer ``[1, kv_heads, tokens, head_dim]``."""
    cache = new_cache(model_config)
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        cache.update(k, v, i)
    return cache


@dataclass
class KVBatch:
    """Rows being decoded together; row ``i`` of every tensor belongs to ``rows[i]``."""

    rows: list = field(default_factory=list)
    """Request objects, one per batch row."""
    cache: object = None
    """A ``DynamicCache`` with tensors ``[batch, kv_heads, columns, head_dim]``."""
    mask: object = None
    """``[batch, columns]`` long: 1 for a real token, 0 for left padding."""
    positions: list[int] = field(default_factory=list)
    """Per row: the position id of the next token fed (= number of real tokens so far)."""

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row, cache, length: int) -> None:
        """Merge one prefilled sequence (``cache`` of batch 1 holding ``length`` tokens)."""
        import torch

        one_mask = torch.ones((1, length), dtype=torch.long, device=_device(cache))
        if not self.rows:
            self.rows, self.cache, self.mask, self.positions = [row], cache, one_mask, [length]
            return
        width = max(self.mask.shape[1], length)
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)], 0)
            mine.values = torch.cat(
                [_pad_left(mine.values, width), _pad_left(theirs.values, width)], 0
            )
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(one_mask, width)], 0)
        self.rows.append(row)
        self.positions.append(length)

    def remove(self, keep: list[int]) -> None:
        """Keep only the rows at indices ``keep`` (in order); trim all-padding columns."""
        import torch

        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.cache, self.mask, self.positions = [], None, None, []
            return
        index = torch.tensor(keep, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        first = int(mask.any(dim=0).nonzero()[0])  # first column some row still uses
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:, :]
            layer.values = layer.values.index_select(0, index)[:, :, first:, :]
        self.mask = mask[:, first:]
        self.rows = [self.rows[i] for i in keep]
        self.positions = [self.positions[i] for i in keep]

    def export_rows(self) -> list[tuple[object, list, list]]:
        """Every row with a copy of its own KV (per layer ``[1, kv_heads, tokens, head_dim]``,
        padding cut off), leaving the batch empty: what a KV migration moves elsewhere."""
        out = []
        for i, row in enumerate(self.rows):
            n = self.positions[i]  # real tokens of row i: its last n columns (left padding)
            keys = [layer.keys[i : i + 1, :, -n:, :].clone() for layer in self.cache.layers]
            values = [layer.values[i : i + 1, :, -n:, :].clone() for layer in self.cache.layers]
            out.append((row, keys, values))
        self.rows, self.cache, self.mask, self.positions = [], None, None, []
        return out

    def step_inputs(self, last_tokens: list[int]) -> dict:
        """Model kwargs for one decode step feeding ``last_tokens`` (one per row); the caller
        adds ``self.cache`` under the model's cache argument name."""
        import torch

        device = self.mask.device
        self.mask = torch.cat(
            [self.mask, torch.ones((len(self.rows), 1), dtype=self.mask.dtype, device=device)], 1
        )
        inputs = {
            "input_ids": torch.tensor([[t] for t in last_tokens], device=device),
            "position_ids": torch.tensor([[p] for p in self.positions], device=device),
            "attention_mask": self.mask,
            "use_cache": True,
        }
        self.positions = [p + 1 for p in self.positions]
        return inputs


def _device(cache):
    return cache.layers[0].keys.device


def _pad_left(tensor, width: int):
    """Left-pad dim 2 (KV ``[b, h, t, d]``) or dim 1 (mask ``[b, t]``) with zeros to ``width``."""
    import torch

    dim = 2 if tensor.dim() == 4 else 1
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
