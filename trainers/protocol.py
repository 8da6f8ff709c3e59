"""The ``Trainer`` protocol: what the training loop, weight sync and the elastic cells
need from a training backend (torch now; Megatron-core later, behind the same methods).

A trainer owns a causal LM (the one the engines serve), its optimizer state and its
weight version. The loop hands it ``TrainBatch``es of packed trees, one optimizer step
each; weight sync reads ``named_parameters()`` (Hugging Face names, full tensors, so an
engine loading a Hugging Face checkpoint can take them as they are) after a step; a cell
going back to rollout calls ``offload()`` and, before training again, ``onload()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from gyre_env.trajectory.packing import PackedTree


@dataclass(kw_only=True)
class TrainBatch:
    """One optimizer step's data: packed trees, each one forward pass (a microbatch)."""

    units: list[PackedTree]
    kind: Literal["rl", "sft"] = "rl"
    """``rl``: the policy loss with advantages; ``sft``: NLL of the sampled tokens."""
    info: dict = field(default_factory=dict)
    """Free-form facts the loop wants in the metrics (iteration, minibatch index)."""

    def __post_init__(self) -> None:
        if self.kind not in ("rl", "sft"):
            raise ValueError(f"TrainBatch.kind must be 'rl' or 'sft', got {self.kind!r}")
        if not self.units:
            raise ValueError("a TrainBatch needs at least one packed unit")

    @property
    def num_tokens(self) -> int:
        return sum(len(u) for u in self.units)

    @property
    def num_loss_tokens(self) -> int:
        return sum(u.num_loss_tokens for u in self.units)


@runtime_checkable
class Trainer(Protocol):
    """A training backend. ``version`` counts optimizer steps published so far."""

    @property
    def version(self) -> int:
        """Weight version of the current parameters (0 before the first step)."""
        ...

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Forward/backward over ``batch.units`` and one optimizer step; returns metrics
        (``loss``, ``grad_norm``, ``tokens``, ``tokens_per_s``, ...). Bumps ``version``."""
        ...

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: model, optimizer, step/version."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights a sync pushes, by Hugging Face name, as full (unsharded) tensors."""
        ...

    def load_named_parameters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load full Hugging Face-named weights (what ``named_parameters`` yields, e.g. a
        newer version another cell published) into the model; optimizer state is kept."""
        ...

    def offload(self) -> None:
        """Free the training memory (weights, gradients, optimizer state) on the device."""
        ...

    def onload(self) -> None:
        """Bring back what ``offload`` freed."""
        ...
