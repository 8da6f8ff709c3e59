"""Host buffers that a trainer's state leaves through and comes back from on a role switch.

An H200 switch moved a 1.5B trainer's weights, gradients and Adam moments (about 11 GB of
bf16) to host memory in 7.5 s: ``tensor.to("cpu")`` allocates pageable memory each time
and copies at pageable speed (1.5 GB/s device to host, measured), where pinned memory
copies at 55 GB/s each way. ``HostStash`` keeps one host buffer per tensor, allocated
once (pinned where CUDA runs) and reused at every later switch, so that from the second
switch on, leaving is one device-to-host copy per tensor into memory already pinned and
coming back one host-to-device copy. The copies are queued without waiting
(``non_blocking``) and the stash synchronises once at the end.

``moved_bytes`` says what the last move carried, so a switch can report its copy rate
against the copy floor.
"""

from __future__ import annotations

import torch


class HostStash:
    """Per key, a host buffer shaped like the tensor stashed under it."""

    def __init__(self, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        """Page-locked buffers (only where CUDA runs: pinning needs its allocator)."""
        self._host: dict[str, torch.Tensor] = {}
        self.allocated_bytes = 0
        """Host bytes allocated so far (the first stash of each key allocates)."""
        self.moved_bytes = 0
        """Bytes the last ``stash_all`` / ``restore_all`` moved."""

    def _buffer(self, key: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._host.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=self.pin)
            self._host[key] = buf
            self.allocated_bytes += buf.numel() * buf.element_size()
        return buf

    def stash_all(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each tensor copied into its key's host buffer: the host tensors, by key (the
        caller drops its device tensors so that their memory frees)."""
        out, moved = {}, 0
        for key, t in tensors.items():
            buf = self._buffer(key, t)
            buf.copy_(t.detach(), non_blocking=self.pin and t.is_cuda)
            out[key] = buf
            moved += t.numel() * t.element_size()
        if self.pin and torch.cuda.is_available():
            torch.cuda.synchronize()  # the host buffers hold the data from here on
        self.moved_bytes = moved
        return out

    def restore_all(self, keys, device: torch.device) -> dict[str, torch.Tensor]:
        """Fresh tensors on ``device`` holding what ``keys`` stashed (the host buffers are
        kept for the next stash)."""
        out, moved = {}, 0
        for key in keys:
            buf = self._host[key]
            t = torch.empty(buf.shape, dtype=buf.dtype, device=device)
            t.copy_(buf, non_blocking=self.pin and t.is_cuda)
            out[key] = t
            moved += buf.numel() * buf.element_size()
        if self.pin and torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        self.moved_bytes = moved
        return out


def module_slots(tag: str, module) -> dict[str, tuple]:
    """Every tensor of ``module`` a switch moves, by key (``tag`` first): (owner, attribute
    or key, kind). A parameter's ``data`` is swapped in place, so that whoever holds the
    parameter objects (an optimizer) keeps them; a buffer is replaced in its module."""
    slots: dict[str, tuple] = {}
    for name, p in module.named_parameters(remove_duplicate=True):
        slots[f"{tag}.p.{name}"] = (p, "data", "param")
    for mod_name, mod in module.named_modules():
        for name, b in mod._buffers.items():
            if b is not None:
                slots[f"{tag}.b.{mod_name}.{name}"] = (mod._buffers, name, "item")
    return slots


def park(stash: HostStash, slots: dict[str, tuple]) -> None:
    """The tensors of ``slots`` into ``stash``'s host buffers; their owners hold those."""
    now = {k: (o.data if kind == "param" else o[a]) for k, (o, a, kind) in slots.items()}
    _place(slots, stash.stash_all(now))


def unpark(stash: HostStash, slots: dict[str, tuple], device) -> None:
    """The tensors of ``slots`` back on ``device`` from ``stash`` (its buffers kept)."""
    _place(slots, stash.restore_all(slots, device))


def _place(slots: dict[str, tuple], tensors: dict[str, torch.Tensor]) -> None:
    for key, (owner, attr, kind) in slots.items():
        if kind == "param":
            owner.data = tensors[key]
        else:
            owner[attr] = tensors[key]
