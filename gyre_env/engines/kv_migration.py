"""A request in transit between two engines, and its KV cache as bytes on a wire.

A cell leaving ROLLOUT exports its unfinished requests (``EmbeddedEngine.export_inflight``):
each is a :class:`MigratingRequest` holding the engine-internal request (its caller keeps
reading the same stream) and, for a request that was decoding, a copy of its KV per layer.
The KV travels as one flat ``uint8`` buffer described by a :class:`KVLayout`
(:func:`pack_kv` / :func:`unpack_kv`), byte for byte, so a bf16 cache stays bf16. A request
whose KV is dropped (``drop_kv``, e.g. a transfer past its window) is re-prefilled from its
token ids by the engine that imports it.

Nothing here imports torch at module import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVLayout:
    """Where each layer's keys and values sit in a packed buffer (in order k0, v0, k1, ...)."""

    dtype: str
    """torch dtype name without ``torch.``."""
    shapes: tuple[tuple[int, ...], ...]
    nbytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.nbytes)


@dataclass(eq=False)
class MigratingRequest:
    """One unfinished request taken out of an engine (see the module docstring)."""

    request: object
    """The engine's own request object: prompt, output so far, sampler state, caller queue."""
    keys: list | None = None
    """Per layer ``[1, kv_heads, tokens, head_dim]``: the KV of ``context_ids[:-1]`` (the last
    id is fed at the next decode step); None for a request to re-prefill."""
    values: list | None = None

    @property
    def context_ids(self) -> list[int]:
        """Prompt plus every id sampled so far."""
        return list(self.request.prompt_ids) + list(self.request.output_ids)

    @property
    def kv_tokens(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def kv_nbytes(self) -> int:
        if not self.keys:
            return 0
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def drop_kv(self) -> None:
        """Forget the KV: the importing engine re-prefills from the token ids."""
        self.keys = self.values = None


def pack_kv(keys: list, values: list):
    """One flat ``uint8`` tensor holding every layer's keys and values, and its layout."""
    import torch

    tensors = [t for pair in zip(keys, values, strict=True) for t in pair]
    flat = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    layout = KVLayout(
        dtype=str(tensors[0].dtype).removeprefix("torch."),
        shapes=tuple(tuple(t.shape) for t in tensors),
        nbytes=tuple(f.numel() for f in flat),
    )
    return torch.cat(flat), layout


def unpack_kv(buffer, layout: KVLayout) -> tuple[list, list]:
    """The (keys, values) lists of a packed buffer: views into it, no copy."""
    import torch

    dtype = getattr(torch, layout.dtype)
    out, offset = [], 0
    for shape, n in zip(layout.shapes, layout.nbytes, strict=True):
        out.append(buffer[offset : offset + n].view(dtype).view(shape))
        offset += n
    return out[0::2], out[1::2]
