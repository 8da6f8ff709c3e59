"""The Megatron-core training backend: the ``Trainer`` protocol over a megatron-core
``GPTModel``, trained on packed token trees exactly like the torch backend.

The weights come from the served Hugging Face folder (``convert.load_hf_into``) and go
back to engines under Hugging Face names (``named_parameters``, full tensors gathered over
tensor parallelism), so engines never see megatron's layout. Each ``train_step`` is one
optimizer step over its microbatches with the loss functions of ``trainers.losses`` and
one normalizer for the step (summed over data-parallel ranks).

Parallelism: megatron's ``parallel_state`` over ``torch.distributed`` (a one-process gloo
group is started when none runs). Tensor parallelism is ``tensor_parallel``; the other
ranks are data parallel, their gradients summed by megatron's ``DistributedDataParallel``
(grad buffers, bucketed all-reduce). Pipeline and expert parallelism are not wired.

Devices: on CPU (``cpu_shim``) the optimizer is ``torch.optim.AdamW`` with the global
gradient-norm clip computed over the TP group; on CUDA ``optimizer="megatron"`` (the
default there) uses megatron's optimizer, distributed over data-parallel ranks.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from gyre_env.trainers.losses import LossConfig, step_normalizer
from gyre_env.trainers.megatron.forward import attention_mask_for, tree_logprobs
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


def indexed_cuda_device(device: torch.device, env=None) -> torch.device:
    """``device`` with a device index: ``torch.cuda.set_device`` refuses a bare ``cuda``
    ("Expected a torch.device with a specified index", the backend's first CUDA call on an
    H200). A bare one is this process's ``LOCAL_RANK`` (torchrun), else 0 (the first
    device it sees: a Ray actor sees only its own)."""
    if device.type != "cuda" or device.index is not None:
        return device
    env = os.environ if env is None else env
    return torch.device("cuda", int(env.get("LOCAL_RANK", 0)))


@dataclass(kw_only=True)
class MegatronTrainerConfig:
    """Optimizer, device and parallel settings of the Megatron backend (the optimizer
    fields mean what they mean in ``TorchTrainerConfig``)."""

    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    warmup_steps: int = 0
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: str = "float32"
    dense_max_tokens: int = 2048
    """Trees up to this many tokens use a dense mask in megatron's attention; longer ones
    the block-sparse tree kernel (CPU) or flex_attention (CUDA), unless Transformer
    Engine's attention runs (``use_te``), which takes only a dense mask."""
    block_size: int = 128
    tensor_parallel: int = 1
    """Tensor-parallel ranks (the rest of the world is data parallel)."""
    optimizer: str = "auto"
    """``torch`` (AdamW), ``megatron`` (megatron-core's, CUDA only) or ``auto``."""
    distributed_optimizer: bool = True
    """With the megatron optimizer: shard its state over data-parallel ranks."""
    use_te: bool | None = None
    """Transformer Engine layer spec; None: when TE imports and the device is CUDA."""
    num_threads: int | None = None
    """torch CPU threads during a train step (restored after); None: every core."""
    max_nonfinite_steps: int = 5
    """With the torch optimizer: inf/NaN gradient norms skip the step; this many in a row
    stop the run (``NonFiniteStepError``)."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.lr <= 0 or self.grad_clip < 0 or self.warmup_steps < 0:
            raise ValueError("lr must be > 0, grad_clip and warmup_steps >= 0")
        if self.optimizer not in ("auto", "torch", "megatron"):
            raise ValueError(f"optimizer must be auto, torch or megatron, got {self.optimizer!r}")
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")


def _te_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


class MegatronTrainer:
    """``Trainer`` over a megatron-core ``GPTModel`` (see the module docstring)."""

    config: MegatronTrainerConfig
    loss: LossConfig
    device: torch.device
    model: torch.nn.Module
    """The ``GPTModel`` (``ddp`` wraps it)."""
    optimizer: object
    """``torch.optim.AdamW`` or megatron-core's optimizer (``config.optimizer``)."""
    reference: torch.nn.Module | None

    def __init__(
        self,
        model_path: str | Path,
        config: MegatronTrainerConfig | None = None,
        loss: LossConfig | None = None,
    ):
        from gyre_env._optional import require

        require("megatron.core", "the Megatron trainer")
        transformers = require("transformers", "the Megatron trainer")
        from gyre_env.trainers.torch_backend import resolve_device

        self.config = cfg = config or MegatronTrainerConfig()
        self.loss = loss or LossConfig()
        self.model_path = Path(model_path)
        self.device = resolve_device(cfg.device)
        self.cuda = self.device.type == "cuda"
        self.hf_config = transformers.AutoConfig.from_pretrained(self.model_path)
        self.use_te = (_te_available() and self.cuda) if cfg.use_te is None else cfg.use_te
        want = cfg.optimizer if cfg.optimizer != "auto" else ("megatron" if self.cuda else "torch")
        if want == "megatron" and not self.cuda:
            raise ValueError("megatron's optimizer needs CUDA; use optimizer='torch' on CPU")
        self.megatron_optimizer = want == "megatron"
        self._setup_parallel()
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=_DTYPES[cfg.dtype]
        ).state_dict()
        self.model = self._build(hf)
        self.ddp = self._wrap_ddp(self.model)
        self.reset_optimizer()
        self.reference = None
        self._version = 0
        self._offloaded = False
        self._nonfinite_steps = 0

    # ---- construction -----------------------------------------------------------------
    def _setup_parallel(self) -> None:
        from gyre_env.trainers.megatron.model import init_parallel

        if self.cuda:
            self.device = indexed_cuda_device(self.device)
            torch.cuda.set_device(self.device)
        else:
            from gyre_env.trainers.megatron.cpu_shim import apply_cpu_shim

            apply_cpu_shim()
        init_parallel(self.config.tensor_parallel, backend="nccl" if self.cuda else "gloo")
        if self.cuda:
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(1234)

    def _build(self, hf_state: dict):
        """A ``GPTModel`` on the device holding this rank's share of ``hf_state``."""
        from gyre_env.trainers.megatron.convert import load_hf_into
        from gyre_env.trainers.megatron.model import build_gpt_model

        model = build_gpt_model(
            self.hf_config, dtype=self.config.dtype, use_te=self.use_te, cuda=self.cuda
        ).to(self.device)
        load_hf_into(model, hf_state, self.hf_config, te=self.use_te)
        return model.train()

    def _wrap_ddp(self, model):
        from megatron.core.distributed import DistributedDataParallel as DDP
        from megatron.core.distributed import DistributedDataParallelConfig

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=self.megatron_optimizer and self.config.distributed_optimizer,
        )
        return DDP(model.config, ddp_config, model)

    def reset_optimizer(
        self, lr: float | None = None, *, cosine_steps: int = 0, min_lr: float = 0.0
    ) -> None:
        """A fresh optimizer (and warm-up) at ``lr`` (default ``config.lr``); see
        ``Trainer.reset_optimizer``."""
        cfg = self.config
        lr = lr if lr is not None else cfg.lr
        schedule = lr_schedule(cfg.warmup_steps, lr, cosine_steps, min_lr)
        if self.megatron_optimizer:
            self.optimizer = _megatron_optimizer(cfg, lr, self.ddp)
        else:
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=lr,
                betas=cfg.betas,
                eps=cfg.eps,
                weight_decay=cfg.weight_decay,
            )
        self._base_lr = lr
        self._lr_step = 0
        self._schedule = schedule

    def _lr(self) -> float:
        return self._base_lr * lr_factor(self._lr_step, **self._schedule)

    # ---- protocol -------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if self._offloaded:
            raise RuntimeError("the trainer is offloaded; call onload() before train_step()")
        with cpu_threads(not self.cuda, self.config.num_threads):
            return self._train_step(batch)

    def _train_step(self, batch: TrainBatch) -> dict[str, float]:
        start = time.perf_counter()
        rl = batch.kind == "rl"
        agg = self.loss.aggregation if rl else "token"
        if rl and self.loss.kl_coef > 0 and self.reference is None:
            self.set_reference()
        tensors = [u.tensors(self.device) for u in batch.units]
        normalizer = self._global_normalizer(
            step_normalizer(
                tensors,
                agg,
                current_version=self._version,
                max_staleness=self.loss.max_staleness if rl else None,
            )
        )
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        sums = accumulate(batch, tensors, lambda p, t: self._microbatch(p, t, rl, agg, normalizer))
        self.ddp.finish_grad_sync()  # data-parallel sum into the grad buffers
        grad_norm, lr, stepped = self.optimizer_step()
        if stepped:
            self._version += 1
        metrics = step_metrics(sums, batch, grad_norm, lr, time.perf_counter() - start)
        return {**metrics, "skipped": float(not stepped)}

    def _global_normalizer(self, local: float) -> float:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        group = ps.get_data_parallel_group()
        if dist.get_world_size(group) == 1:
            return local
        total = torch.tensor([local], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=group)
        return float(total)

    def optimizer_step(self, loss: float = 0.0) -> tuple[float, float, bool]:
        """Clip the gradient buffers and take the optimizer step and the lr schedule's,
        unless the gradients (or ``loss``) are inf/NaN: megatron's optimizer reports that
        itself, the torch one is checked by ``finite_step``. Returns the gradient norm,
        the lr and whether the step was taken (``version`` is the caller's to bump)."""
        lr = self._lr()
        grad_norm, stepped = self._optimizer_step(lr, loss)
        self._lr_step += int(stepped)
        return grad_norm, lr, stepped

    def _optimizer_step(self, lr: float, loss: float) -> tuple[float, bool]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.megatron_optimizer:
            stepped, grad_norm, _ = self.optimizer.step()
            return float(grad_norm or 0.0), bool(stepped)
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = p.main_grad.to(p.dtype)
        grad_norm = _clip_grad_norm(params, self.config.grad_clip or math.inf)
        stepped = finite_step(self, grad_norm, lr, loss)  # inf/NaN: weights stay as they are
        if stepped:
            self.optimizer.step()
        return grad_norm, stepped

    # ---- the elastic core cell (gyre_env.scheduler.core_cell.CoreStep) ----------------------
    def zero_grads(self) -> None:
        """Zero the gradient buffers (megatron's DDP keeps them in ``main_grad``) and drop
        the parameters' ``.grad`` (the torch optimizer's copy of them)."""
        self.ddp.zero_grad_buffer()
        if self.optimizer is not None:
            self.optimizer.zero_grad()
        self.model.zero_grad(set_to_none=True)

    def accumulate_grads(
        self, units, kind: str, normalizer: float, version: int, *, tensors=None
    ) -> dict:
        """Forward and backward over ``units`` into the gradient buffers (not zeroed
        first), the loss normalized by ``normalizer`` (the whole step's) at the core's
        ``version``; the same loss as ``train_step``. ``tensors``: the units'
        ``tensors(self.device)``, when the caller built them already. Returns the summed
        loss and tokens, and the loss tokens left out as sampled past
        ``loss.max_staleness`` (``stale_tokens``), as the torch backend does."""
        batch = share_batch(self, units, kind)
        if batch is None:
            return {"loss": 0.0, "tokens": 0.0, "stale_tokens": 0.0}
        rl = kind == "rl"
        agg = self.loss.aggregation if rl else "token"
        with cpu_threads(not self.cuda, self.config.num_threads):
            if tensors is None:
                tensors = [u.tensors(self.device) for u in batch.units]
            sums = accumulate(
                batch, tensors, lambda p, t: self._microbatch(p, t, rl, agg, normalizer, version)
            )
        return {
            "loss": sums["loss"],
            "tokens": float(batch.num_tokens),
            "stale_tokens": sums.get("stale_tokens", 0.0),
        }

    def grad_buffers(self) -> list[torch.Tensor]:
        """The accumulated gradients, one per trainable parameter in model order (what the
        core sums a satellite's into)."""
        return [p.main_grad for p in self.model.parameters() if p.requires_grad]

    def apply_grads(self, *, sync: bool = True) -> dict:
        """Clip the accumulated gradients and take the optimizer step (the core's).
        ``sync=False`` skips DDP's data-parallel sum: the caller already summed every
        rank's share into this rank's buffers (``TrainingGroup``'s reduce to the core)."""
        with cpu_threads(not self.cuda, self.config.num_threads):
            if sync:
                self.ddp.finish_grad_sync()
            grad_norm, lr, stepped = self.optimizer_step()
        return {"grad_norm": grad_norm, "lr": lr, "skipped": float(not stepped)}

    def _microbatch(
        self, packed, t: dict, rl: bool, agg: str, normalizer: float, version: int | None = None
    ):
        cfg = self.loss
        mask = self._mask(packed)
        extra = {}
        if rl and cfg.policy_loss == "decoupled":
            extra["proximal"] = proximal_for(t, lambda: self.logprobs(t, mask))
        if rl and cfg.kl_coef > 0:
            extra["reference"] = self.logprobs(t, mask, model=self.reference)
        temperature = cfg.temperature if rl else 1.0
        lp, ent = tree_logprobs(self.model, t, mask, temperature=temperature, with_entropy=True)
        version = self._version if version is None else version
        return unit_loss(
            t, lp, ent, extra, cfg, rl=rl, agg=agg, normalizer=normalizer, version=version
        )

    def _mask(self, packed):
        c = self.config
        return attention_mask_for(
            packed, device=self.device, dense_max_tokens=c.dense_max_tokens,
            block=c.block_size, sparse=not self.use_te,
        )  # fmt: skip

    def set_proximal(self, units) -> None:
        """Store on each unit its logprobs under the current weights: decoupled PPO's
        proximal policy, fixed for the iteration (``steps.set_proximal``)."""
        set_proximal(self, units, lambda u, t: self.logprobs(t, self._mask(u)))

    @torch.no_grad()
    def logprobs(self, t: dict, mask, *, model=None) -> torch.Tensor:
        """Loss-token logprobs of a packed batch under ``model`` (default: the policy)."""
        model = self.model if model is None else model
        return tree_logprobs(model, t, mask, temperature=self.loss.temperature)[0]

    def set_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference model."""
        from gyre_env.trainers.megatron.model import build_gpt_model

        ref = build_gpt_model(
            self.hf_config, dtype=self.config.dtype, use_te=self.use_te, cuda=self.cuda
        ).to(self.device)
        ref.load_state_dict(self.model.state_dict())
        self.reference = ref.eval().requires_grad_(False)

    def state_dict(self) -> dict:
        return {
            "model": {k: _clone(v) for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "lr": {"base": self._base_lr, "step": self._lr_step, "schedule": dict(self._schedule)},
            "version": self._version,
            "reference": None if self.reference is None else self.reference.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._base_lr, self._lr_step = state["lr"]["base"], state["lr"]["step"]
        # (a state saved before schedules were kept ran at a constant rate after warm-up)
        self._schedule = state["lr"].get("schedule", lr_schedule(self.config.warmup_steps, 1.0))
        self._version = int(state["version"])
        if state.get("reference") is not None:
            if self.reference is None:
                self.set_reference()
            self.reference.load_state_dict(state["reference"])

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Hugging Face names, full tensors (gathered over TP: a collective, so every TP
        rank must iterate)."""
        from gyre_env.trainers.megatron.convert import full_megatron_state, megatron_to_hf

        full = full_megatron_state(self.model)
        yield from megatron_to_hf(full, self.hf_config, te=self.use_te).items()

    def load_named_parameters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load full HF-named weights (what ``named_parameters`` yields, e.g. a weight
        board's newest version) into this rank's shards; the optimizer state is kept."""
        from gyre_env.trainers.megatron.convert import load_hf_into

        load_hf_into(self.model, tensors, self.hf_config, te=self.use_te)

    def offload(self) -> None:
        """Gradients dropped; on CUDA weights, grad buffers and optimizer state go to host
        (megatron's own buffer offload, which keeps the parameter views valid)."""
        self.optimizer.zero_grad()
        self.ddp.zero_grad_buffer()
        if self.cuda:
            torch.cuda.synchronize()
            self._move_cuda(offload=True)
            torch.cuda.empty_cache()
        self._offloaded = True

    def onload(self) -> None:
        if self._offloaded and self.cuda:
            self._move_cuda(offload=False)
        self._offloaded = False

    def _move_cuda(self, *, offload: bool) -> None:
        device = torch.device("cpu") if offload else self.device
        in_buffers = False
        for buf in self.ddp.buffers:  # grads always; params when they live in the buffer
            in_buffers |= buf.param_data is not None
            move = dict(move_params=buf.param_data is not None, move_grads=True)
            if offload:
                buf.offload_to_cpu(**move)
            else:
                buf.reload_from_cpu(**move)
        if not in_buffers:
            for p in self.model.parameters():  # in place: the optimizer keeps these objects
                p.data = p.data.to(device)
        if self.reference is not None:
            self.reference.to(device)
        if self.megatron_optimizer and offload:
            self.optimizer.offload_to_cpu()
        elif self.megatron_optimizer:
            self.optimizer.restore_from_cpu()
        if self.megatron_optimizer:
            return
        for s in self.optimizer.state.values():
            for k, v in s.items():
                if isinstance(v, torch.Tensor):
                    s[k] = v.to(device)

    def save_pretrained(self, folder: str | Path, *, write: bool | None = None) -> Path:
        """The current weights as a Hugging Face model folder (config + safetensors),
        gathered by every TP rank; written by global rank 0, or where ``write`` (an
        elastic rank exporting on its own, outside any collective)."""
        import torch.distributed as dist
        import transformers

        folder = Path(folder)
        state = dict(self.named_parameters())
        if dist.get_rank() == 0 if write is None else write:
            model = transformers.AutoModelForCausalLM.from_config(self.hf_config)
            model.load_state_dict(state)
            model.save_pretrained(folder)
        return folder


def _clone(value):
    """A detached copy of a state-dict entry (megatron's include non-tensor extra state)."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def _clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over a tensor-parallel model: each weight
    counted once (replicated ones on TP rank 0 only), the squared norms summed over TP."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    own = [p.grad for p in params if param_is_not_tensor_parallel_duplicate(p)]
    norms = [torch.linalg.vector_norm(g.float()) for g in own]
    total = torch.linalg.vector_norm(torch.stack(norms)) ** 2 if norms else torch.zeros(())
    group = ps.get_tensor_model_parallel_group()
    if dist.get_world_size(group) > 1:
        dist.all_reduce(total, group=group)
    norm = total.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef.to(p.grad.dtype))
    return float(norm)


def _megatron_optimizer(cfg: MegatronTrainerConfig, lr: float, ddp):
    """megatron-core's Adam (distributed over data-parallel ranks when asked); CUDA only."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.betas[0],
        adam_beta2=cfg.betas[1],
        adam_eps=cfg.eps,
        clip_grad=cfg.grad_clip,
        bf16=cfg.dtype == "bfloat16",
        fp16=cfg.dtype == "float16",
        params_dtype=_DTYPES[cfg.dtype],
        use_distributed_optimizer=cfg.distributed_optimizer,
    )
    return get_megatron_optimizer(opt_config, [ddp])
