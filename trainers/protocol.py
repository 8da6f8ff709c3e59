"""The ``Trainer`` protocol: what the training loop, weight sync and the elastic cells
need from a training backend (torch and Megatron-core, behind the same methods).

A trainer owns a causal LM (the one the engines serve), its optimizer state and its
weight version. The loop hands it ``TrainBatch``es of packed trees, one optimizer step
each; weight sync reads ``named_parameters()`` (Hugging Face names, full tensors, so an
engine loading a Hugging Face checkpoint can take them as they are) after a step; a cell
going back to rollout calls ``offload()`` and, before training again, ``onload()``; the
elastic core cell computes one step in shares (``zero_grads``, ``accumulate_grads``,
``grad_buffers``, ``apply_grads``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from gyre_env.trainers.losses import LossConfig

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
    """A training backend: every member the drivers (``train.loop``, ``train.elastic``),
    the elastic cells and the core cell (``scheduler.core_cell``) use. Both backends
    implement all of it (``tests/trainers/test_protocol.py``), so no caller tests for a
    capability. ``version`` counts optimizer steps published so far."""

    config: Any
    """The backend's settings (``TorchTrainerConfig``, ``MegatronTrainerConfig``); the
    shared step code reads ``max_nonfinite_steps``, ``num_threads`` from it."""
    loss: LossConfig
    """The loss; the core cell reads ``aggregation``, ``kl_coef``, ``max_staleness``."""
    device: torch.device
    """Where the step's tensors go (``PackedTree.tensors(device)``)."""
    model: torch.nn.Module
    """The trained model (megatron: the ``GPTModel``, without its DDP wrapper); its
    ``parameters()`` are what a ``TrainingGroup`` broadcasts from the core."""
    optimizer: Any
    """The optimizer; a ``TrainingGroup`` satellite's is dropped (the core's is the only
    optimizer state)."""
    reference: torch.nn.Module | None
    """The frozen KL reference model (``set_reference``), None until one is set."""

    @property
    def version(self) -> int:
        """Weight version of the current parameters (0 before the first step)."""
        ...

    # ---- one optimizer step over a whole batch (train.loop) -------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Forward/backward over ``batch.units`` and one optimizer step; returns metrics
        (``loss``, ``grad_norm``, ``tokens``, ``tokens_per_s``, ...). Bumps ``version``."""
        ...

    def set_proximal(self, units: Sequence[PackedTree]) -> None:
        """Store on each unit (``proximal_logprobs``) its loss tokens' logprobs under the
        current weights. Decoupled PPO's proximal policy is the iteration's starting
        policy: a driver calls this once over all of an iteration's units before its first
        update, and the ratio's trust region stays centred there for every minibatch."""
        ...

    def reset_optimizer(
        self, lr: float | None = None, *, cosine_steps: int = 0, min_lr: float = 0.0
    ) -> None:
        """A fresh optimizer and warm-up at ``lr`` (default ``config.lr``): e.g. between
        the SFT warm start and RL. ``cosine_steps`` > 0: the rate then falls along a cosine
        to ``min_lr`` over that many steps (``trainers.steps.lr_factor``), a schedule the
        trainer's state keeps, so that a resumed run follows it."""
        ...

    def set_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference model."""
        ...

    # ---- a step in shares (scheduler.core_cell) -----------------------------------
    def zero_grads(self) -> None:
        """Clear the accumulated gradients (``.grad``, or the backend's own buffers)."""
        ...

    def accumulate_grads(
        self,
        units: Sequence[PackedTree],
        kind: str,
        normalizer: float,
        version: int,
        *,
        tensors: list[dict] | None = None,
    ) -> dict:
        """Forward and backward over ``units`` into the gradients (not zeroed first), the
        loss normalized by ``normalizer`` (the whole step's) at the core's ``version``:
        one share of an elastic step, the same loss as ``train_step``. ``tensors``: the
        units' ``PackedTree.tensors(device)`` when the caller built them already. Returns
        the summed ``loss`` and ``tokens``."""
        ...

    def grad_buffers(self) -> list[torch.Tensor]:
        """The accumulated gradients, one tensor per trainable parameter in model order
        (zeros for a parameter that got none): what the core sums a satellite's into,
        what a ``TrainingGroup`` reduces."""
        ...

    def optimizer_step(self, loss: float = 0.0) -> tuple[float, float, bool]:
        """Clip the accumulated gradients and take the optimizer and lr-schedule step,
        unless they (or ``loss``) are inf/NaN. Returns the gradient norm, the lr and
        whether the step was taken; ``version`` is the caller's to bump."""
        ...

    def apply_grads(self, *, sync: bool = True) -> dict:
        """The core's step over the summed gradients: ``optimizer_step``, then the
        gradients are cleared or left for the next ``zero_grads``. ``sync=False``: the
        caller already summed every rank's gradients here (no data-parallel sync).
        Returns ``grad_norm``, ``lr`` and ``skipped``."""
        ...

    # ---- state and weights --------------------------------------------------------
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

    def save_pretrained(self, folder: str | Path, *, write: bool | None = None) -> Path:
        """The current weights as a Hugging Face model folder (config + safetensors).
        ``write``: whether this process writes the files (None: the backend's default
        writer, e.g. global rank 0; True: an elastic rank exporting on its own)."""
        ...

    # ---- memory -------------------------------------------------------------------
    def offload(self) -> None:
        """Free the training memory (weights, gradients, optimizer state) on the device."""
        ...

    def onload(self) -> None:
        """Bring back what ``offload`` freed."""
        ...
