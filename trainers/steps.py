"""What every training backend's optimizer step shares: the CPU thread setting around a
step, the microbatch loop, decoupled PPO's proximal logprobs, one unit's loss from its
logprobs, and the step's metrics.

Backends differ in their forward pass (HF model with tree attention, megatron's
``GPTModel``) and their optimizer; these pieces are the same for both, so a backend's
``train_step`` gives the same numbers for the same logprobs.
"""

from __future__ import annotations

import logging
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from gyre_env.trainers.losses import LossConfig, LossTerms, policy_loss, sft_loss
from gyre_env.trainers.protocol import TrainBatch

log = logging.getLogger(__name__)


class NonFiniteStepError(FloatingPointError):
    """Training diverged: the loss or gradient norm was inf/NaN in too many steps in a row."""


def lr_factor(step: int, warmup: int = 0, cosine_steps: int = 0, floor: float = 1.0) -> float:
    """The learning rate's multiplier at optimizer step ``step`` (from 0): a linear warm-up
    over ``warmup`` steps, times, when ``cosine_steps`` > 0, a cosine from 1 down to
    ``floor`` over that many steps (``floor`` after them)."""
    factor = min(1.0, (step + 1) / warmup) if warmup else 1.0
    if cosine_steps > 0:
        t = min(step, cosine_steps) / cosine_steps
        factor *= floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))
    return factor


def lr_schedule(warmup: int, lr: float, cosine_steps: int = 0, min_lr: float = 0.0) -> dict:
    """:func:`lr_factor`'s keywords for a rate ``lr`` that falls along a cosine to ``min_lr``
    over ``cosine_steps`` (0: constant after the warm-up); checked."""
    if cosine_steps < 0 or not 0 <= min_lr <= lr:
        raise ValueError(
            f"a cosine schedule needs cosine_steps >= 0 and 0 <= min_lr <= lr, got "
            f"cosine_steps={cosine_steps}, min_lr={min_lr}, lr={lr}"
        )
    floor = min_lr / lr if cosine_steps else 1.0
    return {"warmup": int(warmup), "cosine_steps": int(cosine_steps), "floor": floor}


def finite_step(trainer, grad_norm: float, lr: float, loss: float = 0.0) -> bool:
    """Whether an optimizer step may be taken. A non-finite loss or gradient norm (one
    overflow, or a diverged run) would write NaN into every weight and, through a weight
    push, into the served model; such a step is skipped instead (the caller leaves weights
    and optimizer state as they are and drops the gradients). After
    ``trainer.config.max_nonfinite_steps`` skipped steps in a row it raises
    ``NonFiniteStepError`` naming the figures, so that a diverged run stops at its last
    good checkpoint rather than training on NaN."""
    if math.isfinite(grad_norm) and math.isfinite(loss):
        trainer._nonfinite_steps = 0
        return True
    count = trainer._nonfinite_steps + 1  # 0 when the backend is built
    trainer._nonfinite_steps = count
    limit = trainer.config.max_nonfinite_steps
    what = f"loss {loss}, grad norm {grad_norm} at lr {lr:.3g}"
    if count >= limit:
        raise NonFiniteStepError(
            f"{what}: {count} non-finite steps in a row (limit max_nonfinite_steps="
            f"{limit}); training diverged. Lower the learning rate (sft.lr, "
            "algorithm.optim.lr), lengthen warmup_steps, or train in float32 "
            "(algorithm.optim.dtype)"
        )
    log.warning("optimizer step skipped: %s (%d in a row, limit %d)", what, count, limit)
    return False


@contextmanager
def cpu_threads(on_cpu: bool, num_threads: int | None) -> Iterator[None]:
    """On CPU, run the step with ``num_threads`` (default: every core); restore after."""
    previous = torch.get_num_threads()
    if on_cpu:
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def accumulate(batch: TrainBatch, tensors: list[dict], microbatch: Callable, scale: float = 1.0):
    """Forward and backward of every unit (``microbatch(packed, t) -> (loss, metrics)``);
    returns the summed loss and metrics."""
    sums: dict[str, float] = defaultdict(float)
    for packed, t in zip(batch.units, tensors, strict=True):
        loss, metrics = microbatch(packed, t)
        (loss * scale if scale != 1.0 else loss).backward()
        sums["loss"] += float(loss.detach())
        for k, v in metrics.items():
            sums[k] += v
    return sums


def share_batch(trainer, units, kind: str) -> TrainBatch | None:
    """``units`` as a batch for a trainer's ``accumulate_grads`` (its share of an elastic
    step), None when empty. With ``kl_coef > 0`` the trainer's reference must be set
    already: every rank's the same weights (``scheduler.core_cell.with_reference``)."""
    if kind == "rl" and trainer.loss.kl_coef > 0 and trainer.reference is None:
        raise RuntimeError(
            "kl_coef > 0 but this trainer has no KL reference: call set_reference() on "
            "every rank's trainer when RL starts, before any of them steps"
        )
    if not units:
        return None
    if trainer._offloaded:
        raise RuntimeError("the trainer is offloaded; call onload() first")
    return TrainBatch(units=list(units), kind=kind)


def set_proximal(trainer, units, unit_logprobs: Callable) -> None:
    """Decoupled PPO's proximal policy for one iteration (AReaL): each unit's loss-token
    logprobs under the trainer's current weights (``unit_logprobs(unit, tensors)``),
    stored on the unit as ``proximal_logprobs``. Called once before the iteration's
    first update, the proximal policy is the iteration's starting policy and stays fixed
    across its minibatches and epochs, so the ratio ``pi_theta / pi_prox`` moves away
    from 1 as the updates go and the clip bounds each update's drift from that start."""
    if trainer._offloaded:
        raise RuntimeError("the trainer is offloaded; call onload() before set_proximal()")
    with cpu_threads(trainer.device.type == "cpu", trainer.config.num_threads):
        for unit in units:
            unit.proximal_logprobs = None  # the arrays of this pass, not an earlier one's
            lp = unit_logprobs(unit, unit.tensors(trainer.device))
            full = np.zeros(len(unit), np.float32)
            full[unit.loss_mask] = lp.float().cpu().numpy()
            unit.proximal_logprobs = full


def proximal_for(t: dict, current: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A unit's proximal loss-token logprobs: those ``set_proximal`` stored, or else the
    current weights' (``current()``). The fallback is exact only for a unit trained in a
    single update, as in an elastic step, where the policy at the start of its update is
    the current one; a driver that takes several minibatches from one iteration's data
    calls ``set_proximal`` first (``train.run.TrainRun.train_steps``)."""
    if "proximal_logprobs" in t:
        return t["proximal_logprobs"][t["loss_mask"]]
    return current()


def unit_loss(
    t: dict,
    lp: torch.Tensor,
    ent: torch.Tensor,
    extra: dict,
    cfg: LossConfig,
    *,
    rl: bool,
    agg: str,
    normalizer: float,
    version: int,
):
    """One unit's loss: NLL for SFT, the configured policy loss for RL."""
    terms = LossTerms.from_batch(t, lp, agg, entropy=ent, **extra)
    if not rl:
        return sft_loss(terms, normalizer=normalizer)
    return policy_loss(terms, cfg, normalizer=normalizer, current_version=version)


def step_metrics(sums: dict, batch: TrainBatch, grad_norm: float, lr: float, seconds: float):
    """The metrics ``train_step`` returns: token sums as per-token means, throughput."""
    tokens = max(sums.pop("tokens", 0.0), 1.0)
    out = {"loss": sums.pop("loss"), "grad_norm": grad_norm, "lr": lr}
    if "kl_ref" in sums:  # already normalized like the loss
        out["kl_ref"] = sums.pop("kl_ref")
    for key, value in sums.items():  # token sums -> per-token means
        out[key] = value / tokens
    out.update(
        loss_tokens=tokens,
        tokens=float(batch.num_tokens),
        step_s=seconds,
        tokens_per_s=batch.num_tokens / seconds if seconds > 0 else 0.0,
    )
    return out
