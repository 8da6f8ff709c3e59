"""What megatron-core 0.16 needs to train on a CPU over gloo, in one place.

megatron-core assumes a CUDA device even where the math is plain torch. On a host
without CUDA, ``apply_cpu_shim()`` patches exactly two things, and only when
``torch.cuda.is_available()`` is false (on a GPU nothing is touched):

1. ``torch.cuda.current_device`` returns ``torch.device("cpu")``. megatron calls it to
   place buffers and to move RoPE's ``inv_freq`` "to the GPU" (``RotaryEmbedding.get_emb``,
   ``DotProductAttention``, the global memory buffer, DDP grad buffers). Without CUDA the
   original raises, so no working code path can depend on it: the patch only turns that
   error into CPU placement.
2. megatron's CUDA RNG tracker (``tensor_parallel.random._CUDA_RNG_STATE_TRACKER``) is
   replaced by ``CpuRNGStatesTracker``, which forks named CPU generator states instead of
   CUDA ones. Attention dropout runs inside ``get_cuda_rng_tracker().fork()``, whose CUDA
   version reads ``torch.cuda.get_rng_state`` and fails on a CPU host.

What is not patched but must be set instead (``model.transformer_config`` does it on
CPU): every CUDA fusion off (masked-softmax, bias-activation, bias-dropout, RoPE,
gradient-accumulation fusion, persistent layer norm) and ``use_cpu_initialization``.
megatron's optimizer wrappers (``get_megatron_optimizer``, the distributed optimizer)
allocate CUDA buffers and use CUDA streams, so on CPU the trainer uses ``torch.optim.AdamW``
over the model's parameters instead.
"""

from __future__ import annotations

import contextlib

import torch

_APPLIED: list = []
"""The originals while the shim is applied: ``(current_device, tracker, initialized)``."""


class CpuRNGStatesTracker:
    """megatron's ``CudaRNGStatesTracker`` interface over CPU generator states: named
    states added with a seed, and ``fork(name)`` runs a block under that state."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def reset(self) -> None:
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = {k: v.clone() for k, v in states.items()}

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_ or name in self.states_:
            raise ValueError(f"rng state {name!r} or seed {seed} already exists")
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise KeyError(f"rng state {name!r} was not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def _cpu_device() -> torch.device:
    return torch.device("cpu")


def apply_cpu_shim(seed: int = 1234) -> bool:
    """Patch megatron-core for CPU (see the module docstring); idempotent. Returns
    whether the shim is active (False on a CUDA host, where nothing is patched)."""
    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    from megatron.core.tensor_parallel import random as mrandom

    _APPLIED.append(
        (
            torch.cuda.current_device,
            mrandom._CUDA_RNG_STATE_TRACKER,
            mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED,
        )
    )
    torch.cuda.current_device = _cpu_device
    tracker = CpuRNGStatesTracker()
    tracker.add("model-parallel-rng", seed)
    tracker.add("data-parallel-rng", seed + 1)
    tracker.add("expert-parallel-rng", seed + 2)
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    return True


def remove_cpu_shim() -> None:
    """Put back what ``apply_cpu_shim`` replaced (tests that share a process)."""
    if not _APPLIED:
        return
    from megatron.core.tensor_parallel import random as mrandom

    current_device, tracker, initialized = _APPLIED.pop()
    torch.cuda.current_device = current_device
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = initialized
