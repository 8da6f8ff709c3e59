"""The torch training backend: a Hugging Face causal LM trained on packed token trees.

The model is loaded from the same folder the engines serve (the built-in tiny Qwen2 or
any local HF model), so the trained weights are the served weights under the same
names: ``named_parameters()`` feeds ``Engine.update_weights`` directly. Each
``train_step`` is one optimizer step over its microbatches (one packed forward each,
tree attention from ``gyre_env.trainers.hf_tree``), with gradients accumulated against
one normalizer for the whole step (``losses.step_normalizer``).

Devices: CPU, or one CUDA device; under ``torch.distributed`` with several ranks the
model is sharded with FSDP2 (``fully_shard`` per decoder layer, then the root), each
rank training on its own share of the batch.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from gyre_env.trainers.hf_tree import attention_for, tree_logprobs
from gyre_env.trainers.losses import LossConfig, step_normalizer
from gyre_env.trainers.protocol import TrainBatch
from gyre_env.trainers.steps import (
    accumulate,
    cpu_threads,
    finite_step,
    lr_factor,
    lr_schedule,
    proximal_for,
    set_proximal,
    share_batch,
    step_metrics,
    unit_loss,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(kw_only=True)
class TorchTrainerConfig:
    """Optimizer and device settings of the torch backend."""

    lr: float = 3e-4
    """AdamW learning rate (after warm-up)."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many optimizer steps."""
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: str = "float32"
    """Parameter dtype: ``float32``, ``bfloat16`` or ``float16``."""
    dense_max_tokens: int = 2048
    """Packed trees up to this many tokens use a dense tree mask; longer ones the
    block-sparse kernel (CPU) or flex_attention (CUDA)."""
    block_size: int = 128
    """Block size of the sparse tree attention."""
    fsdp: bool | None = None
    """Shard with FSDP2; None: when ``torch.distributed`` runs with more than one rank."""
    num_threads: int | None = None
    """torch CPU threads during a train step (restored after it: an embedded engine in the
    same process keeps its own setting between steps); None: every core."""
    max_nonfinite_steps: int = 5
    """A step whose loss or gradient norm is inf/NaN is skipped (weights untouched, logged
    as ``skipped``); this many in a row stop the run with ``NonFiniteStepError``."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.lr <= 0 or self.grad_clip < 0 or self.warmup_steps < 0:
            raise ValueError("lr must be > 0, grad_clip and warmup_steps >= 0")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers, got {self.betas}")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class TorchTrainer:
    """``Trainer`` over a Hugging Face causal LM (see the module docstring)."""

    config: TorchTrainerConfig
    loss: LossConfig
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    reference: torch.nn.Module | None

    def __init__(
        self,
        model_path: str | Path,
        config: TorchTrainerConfig | None = None,
        loss: LossConfig | None = None,
    ):
        from gyre_env._optional import require

        transformers = require("transformers", "the torch trainer")
        self.config = config or TorchTrainerConfig()
        self.loss = loss or LossConfig()
        self.model_path = Path(model_path)
        self.device = resolve_device(self.config.device)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=_DTYPES[self.config.dtype]
        )
        self.model = model.to(self.device).train()
        self._forward = _TreeForward(self.model)
        self._sharded = self._maybe_shard()
        self.reset_optimizer()
        self.reference = None
        self._version = 0
        self._offloaded = False
        self._stash = None  # host buffers of the state a CUDA switch moves (HostStash)
        self._nonfinite_steps = 0

    def reset_optimizer(
        self, lr: float | None = None, *, cosine_steps: int = 0, min_lr: float = 0.0
    ) -> None:
        """A fresh AdamW (and warm-up) at ``lr`` (default ``config.lr``): e.g. between
        the SFT warm start and RL; see ``Trainer.reset_optimizer``."""
        lr = lr if lr is not None else self.config.lr
        schedule = lr_schedule(self.config.warmup_steps, lr, cosine_steps, min_lr)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=lr,
            betas=self.config.betas,
            eps=self.config.eps,
            weight_decay=self.config.weight_decay,
        )
        self._schedule = schedule  # read at every step: a loaded state replaces it
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, **self._schedule)
        )

    # ---- protocol -------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if self._offloaded:
            raise RuntimeError("the trainer is offloaded; call onload() before train_step()")
        with cpu_threads(self.device.type == "cpu", self.config.num_threads):
            return self._train_step(batch)

    def _train_step(self, batch: TrainBatch) -> dict[str, float]:
        start = time.perf_counter()
        rl = batch.kind == "rl"
        agg = self.loss.aggregation if rl else "token"
        if rl and self.loss.kl_coef > 0 and self.reference is None:
            self.set_reference()
        tensors = [u.tensors(self.device) for u in batch.units]
        normalizer = step_normalizer(
            tensors,
            agg,
            current_version=self._version,
            max_staleness=self.loss.max_staleness if rl else None,
        )
        scale = 1.0
        if self._sharded:  # one normalizer over all ranks; FSDP averages grads over ranks
            import torch.distributed as dist

            total = torch.tensor([normalizer], dtype=torch.float64)
            dist.all_reduce(total)
            normalizer, scale = float(total), float(dist.get_world_size())
        self.optimizer.zero_grad(set_to_none=True)
        sums = accumulate(
            batch, tensors, lambda p, t: self._microbatch(p, t, rl, agg, normalizer), scale
        )
        grad_norm, lr, stepped = self.optimizer_step(sums["loss"])
        if stepped:
            self._version += 1
        else:
            self.optimizer.zero_grad(set_to_none=True)
        metrics = step_metrics(sums, batch, grad_norm, lr, time.perf_counter() - start)
        return {**metrics, "skipped": float(not stepped)}

    def optimizer_step(self, loss: float = 0.0) -> tuple[float, float, bool]:
        """Clip the accumulated gradients and take the optimizer and lr-schedule step,
        unless the loss or gradient norm is inf/NaN (``finite_step``). Returns the
        gradient norm, the lr and whether the step was taken. ``train_step`` ends with it,
        as does the elastic core's step (``apply_grads``)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.config.grad_clip or float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip)) if params else 0.0
        lr = self.scheduler.get_last_lr()[0]
        stepped = finite_step(self, grad_norm, lr, loss)
        if stepped:
            self.optimizer.step()
            self.scheduler.step()
        return grad_norm, lr, stepped

    # ---- the elastic core cell (gyre_env.scheduler.core_cell) -----------------------------
    def zero_grads(self) -> None:
        """Drop the parameters' ``.grad`` (the model's, not the optimizer's: a satellite
        of a ``TrainingGroup`` has none)."""
        self.model.zero_grad(set_to_none=True)

    def accumulate_grads(
        self, units, kind: str, normalizer: float, version: int, *, tensors=None
    ) -> dict:
        """Forward and backward over ``units`` into the parameters' ``.grad`` (not zeroed
        first), the loss normalized by ``normalizer`` (the whole step's) at the core's
        ``version``: a satellite's or the core's share of an elastic step, the same loss
        as ``train_step``. ``tensors``: the units' ``tensors(self.device)``, when the
        caller built them already (built here otherwise). With ``kl_coef > 0`` the
        reference must already be set (every rank's the same weights: ``set_reference``
        when RL starts). Returns the summed loss and tokens, and the loss tokens left out
        as sampled past ``loss.max_staleness`` (``stale_tokens``)."""
        batch = share_batch(self, units, kind)
        if batch is None:
            return {"loss": 0.0, "tokens": 0.0, "stale_tokens": 0.0}
        rl = kind == "rl"
        agg = self.loss.aggregation if rl else "token"
        if tensors is None:  # threads: the caller's
            tensors = [u.tensors(self.device) for u in batch.units]
        sums = accumulate(
            batch, tensors, lambda p, t: self._microbatch(p, t, rl, agg, normalizer, version)
        )
        stale = sums.get("stale_tokens", 0.0)
        return {"loss": sums["loss"], "tokens": float(batch.num_tokens), "stale_tokens": stale}

    def grad_buffers(self) -> list[torch.Tensor]:
        """The parameters' ``.grad`` in model order, zeros allocated for a parameter that
        has none (what the core sums a satellite's into; what a ``TrainingGroup``
        reduces)."""
        out = []
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            out.append(p.grad)
        return out

    def apply_grads(self, *, sync: bool = True) -> dict:
        """The core's step: ``optimizer_step`` over the accumulated gradients (not for
        inf/NaN ones), then the gradients dropped. ``sync`` changes nothing here: FSDP
        reduces the gradients in the backward, a ``TrainingGroup`` sums them itself."""
        grad_norm, lr, stepped = self.optimizer_step()
        self.zero_grads()
        return {"grad_norm": grad_norm, "lr": lr, "skipped": float(not stepped)}

    def _microbatch(
        self, packed, t: dict, rl: bool, agg: str, normalizer: float, version: int | None = None
    ):
        cfg = self.loss
        attn = self._attention(packed)
        extra = {}
        if rl and cfg.policy_loss == "decoupled":
            extra["proximal"] = proximal_for(t, lambda: self.logprobs(t, attn))
        if rl and cfg.kl_coef > 0:
            extra["reference"] = self.logprobs(t, attn, model=self.reference)
        lp, ent = self._forward(t, attn, temperature=cfg.temperature if rl else 1.0)
        version = self._version if version is None else version
        return unit_loss(
            t, lp, ent, extra, cfg, rl=rl, agg=agg, normalizer=normalizer, version=version
        )

    def _attention(self, packed):
        c = self.config
        return attention_for(
            packed, device=self.device, dense_max_tokens=c.dense_max_tokens, block_size=c.block_size
        )

    def set_proximal(self, units) -> None:
        """Store on each unit its logprobs under the current weights: decoupled PPO's
        proximal policy, fixed for the iteration (``steps.set_proximal``)."""
        set_proximal(self, units, lambda u, t: self.logprobs(t, self._attention(u)))

    @torch.no_grad()
    def logprobs(self, t: dict, attention, *, model=None) -> torch.Tensor:
        """Loss-token logprobs of a packed batch under ``model`` (default: the policy)."""
        if model is None:
            return self._forward(t, attention, temperature=self.loss.temperature)[0]
        return tree_logprobs(model, t, attention, temperature=self.loss.temperature)[0]

    def set_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference model."""
        if self._sharded:
            raise NotImplementedError("a KL reference model is not supported under FSDP yet")
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)

    def state_dict(self) -> dict:
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "schedule": dict(self._schedule),
            "version": self._version,
            "reference": None if self.reference is None else self.reference.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # (a state saved before schedules were kept ran at a constant rate after warm-up)
        self._schedule = state.get("schedule", lr_schedule(self.config.warmup_steps, 1.0))
        self._version = int(state["version"])
        if state.get("reference") is not None:
            if self.reference is None:
                self.set_reference()
            self.reference.load_state_dict(state["reference"])

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.model.state_dict().items():
            if hasattr(tensor, "full_tensor"):  # an FSDP2 shard (DTensor)
                tensor = tensor.full_tensor()
            yield name, tensor.detach()

    def load_named_parameters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy HF-named full tensors into the model (shapes and names checked first, so a
        bad set changes nothing); the optimizer state is kept."""
        own = self.model.state_dict()
        unknown = sorted(set(tensors) - set(own))
        if unknown:
            raise KeyError(f"not parameters of this model: {unknown[:5]}")
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"{name}: shape {tuple(tensor.shape)}, expected {tuple(own[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in tensors.items():
                target = own[name]
                if hasattr(target, "full_tensor"):  # an FSDP2 shard: copy this rank's part
                    target.copy_(
                        torch.distributed.tensor.distribute_tensor(
                            tensor.to(target.dtype),
                            target.device_mesh,
                            target.placements,
                            src_data_rank=None,  # every rank holds the full tensor
                        )
                    )
                else:
                    target.copy_(tensor)

    def offload(self) -> None:
        """Gradients dropped; on CUDA weights, the reference model and optimizer state move
        to host memory, through buffers kept for the next switch (``HostStash``: pinned,
        allocated at the first offload only)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            self._move(offload=True)
            torch.cuda.empty_cache()
        self._offloaded = True

    def onload(self) -> None:
        if self._offloaded and self.device.type == "cuda":
            self._move(offload=False)
        self._offloaded = False

    @property
    def last_move_bytes(self) -> int:
        """Bytes the last offload or onload moved between device and host (0: none moved,
        as on CPU, where the state stays put)."""
        return self._stash.moved_bytes if self._stash is not None else 0

    def _state_slots(self) -> dict[str, tuple]:
        """Every tensor a switch moves (``host_stash.module_slots``): the model's, the
        reference model's, and the optimizer state's (its step counters stay put)."""
        from gyre_env.host_stash import module_slots

        slots = module_slots("model", self.model)
        if self.reference is not None:
            slots |= module_slots("reference", self.reference)
        for i, state in enumerate(self.optimizer.state.values()):
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    slots[f"optim.{i}.{k}"] = (state, k, "item")
        return slots

    def _move(self, *, offload: bool) -> None:
        from gyre_env.host_stash import HostStash, park, unpark

        if self._stash is None:
            self._stash = HostStash()
        if offload:
            park(self._stash, self._state_slots())
        else:
            unpark(self._stash, self._state_slots(), self.device)

    def save_pretrained(self, folder: str | Path, *, write: bool | None = None) -> Path:
        """The current weights as a Hugging Face model folder (config + safetensors),
        written unless ``write`` is False (None: this process writes)."""
        folder = Path(folder)
        if write is None or write:
            self.model.save_pretrained(folder)
        return folder

    # ---- distributed ----------------------------------------------------------------
    def _maybe_shard(self) -> bool:
        import torch.distributed as dist

        want = self.config.fsdp
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if want is None:
            want = world > 1
        if not want:
            return False
        if world <= 1:
            raise ValueError("fsdp=True needs torch.distributed initialised with several ranks")
        from torch.distributed.fsdp import fully_shard

        for layer in self.model.get_decoder().layers:
            fully_shard(layer)
        # The root unit is the training forward, so the parameters outside the layers
        # (embeddings, final norm, LM head, used directly by tree_logprobs) are gathered
        # before it and their gradients reduced after its backward.
        fully_shard(self._forward)
        return True


class _TreeForward(torch.nn.Module):
    """The training forward as a module (FSDP2's root unit): loss-token logprobs and
    entropies of a packed batch."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, batch: dict, attention, temperature: float = 1.0):
        return tree_logprobs(
            self.model, batch, attention, temperature=temperature, with_entropy=True
        )
