"""Policy-gradient and SFT losses on packed token trees.

Every function here takes per-loss-token tensors (``[m]``, the tokens where
``PackedTree.loss_mask`` is set, in token order) and returns a scalar that is a *sum*
over those tokens divided by a ``normalizer`` the caller computes once for the whole
optimizer step. Summing the microbatches' losses therefore gives the loss of the full
batch, and a packed tree gives the same loss and gradient as the flat per-path layout
(each sampled token carries its loss once, with the summed coefficients of the calls
that sampled it).

Objectives (``LossConfig.policy_loss``):

- ``ppo``: PPO-clip with the per-token ratio ``r = pi_theta / pi_behav`` against the
  behaviour logprobs the engine returned (TITO records):
  ``-A * min(r, clip(r, 1 - eps_low, 1 + eps_high))`` (sign-aware ``min``).
  With one optimizer step per rollout batch ``r == 1`` and this is GRPO's gradient.
- ``decoupled``: decoupled PPO (AReaL). The trust region is taken around a *proximal*
  policy, the iteration's starting weights: their logprobs are recomputed once before
  the iteration's first update (``Trainer.set_proximal``) and held fixed across its
  minibatches, ``r = pi_theta / pi_prox``; the
  behaviour policy enters only through the importance weight ``pi_prox / pi_behav``,
  truncated at ``tis_cap`` (truncated importance sampling), which corrects stale samples
  - those sampled by older weight versions - without letting them dominate.

Advantages are GRPO's (reward minus group mean, optionally divided by the group std;
``gyre_env.trajectory.sampling``); branch-role weights (main > sub-agent > summary)
scale each token's coefficient.

Aggregation (``LossConfig.aggregation``):

- ``token``: every sampled token counts the same; the normalizer is the sum of the
  token weights in the step (long answers weigh more in total, as in DAPO / Dr. GRPO).
- ``sequence``: every sampled call counts the same; a token's coefficient is its role
  weight divided by its call's length, the normalizer the weighted number of calls
  (GRPO's original per-sequence mean).

Also: an optional KL penalty to a frozen reference model (the k3 estimator
``exp(ref - lp) - (ref - lp) - 1``, always >= 0), an entropy bonus, and a staleness
bound: tokens sampled more than ``max_staleness`` versions behind the trainer get zero
weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

POLICY_LOSSES = ("ppo", "decoupled")
AGGREGATIONS = ("token", "sequence")


@dataclass(kw_only=True)
class LossConfig:
    """What the RL objective is; see the module docstring."""

    policy_loss: Literal["ppo", "decoupled"] = "ppo"
    """``ppo`` (ratio to the behaviour policy) or ``decoupled`` (ratio to a recomputed
    proximal policy, behaviour policy only in a truncated importance weight)."""
    clip_low: float = 0.2
    """Ratio clip below 1: ``1 - clip_low``."""
    clip_high: float = 0.28
    """Ratio clip above 1: ``1 + clip_high`` (above ``clip_low``: DAPO's clip-higher)."""
    tis_cap: float = 2.0
    """Truncation of the importance weight ``pi_prox / pi_behav`` (``decoupled``)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference model; 0 loads no reference model."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    aggregation: Literal["token", "sequence"] = "token"
    """``token`` or ``sequence`` (see the module docstring)."""
    max_staleness: int | None = None
    """Tokens sampled more than this many weight versions ago get zero weight and are
    counted (``stale_tokens``). None: all count in the synchronous loop (the decoupled
    objective corrects them instead); ``gyre train --elastic`` sets its driver's staleness
    bound here, so the bound that gates admission also gates the loss."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts: logprobs are of ``softmax(logits / T)``."""

    def __post_init__(self) -> None:
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(
                f"policy_loss must be one of {POLICY_LOSSES}, got {self.policy_loss!r}"
            )
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        for name in ("clip_low", "clip_high", "kl_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.tis_cap <= 0 or self.temperature <= 0:
            raise ValueError("tis_cap and temperature must be > 0")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {self.max_staleness}")


@dataclass(kw_only=True)
class LossTerms:
    """The per-loss-token inputs of one microbatch (all ``[m]``)."""

    logprobs: torch.Tensor
    """Under the policy being trained (with grad)."""
    behaviour: torch.Tensor
    """From the engine that sampled the token (TITO)."""
    advantages: torch.Tensor
    coef: torch.Tensor
    """Role weights (token aggregation) or role weight / call length (sequence)."""
    versions: torch.Tensor
    """Weight version that sampled each token."""
    proximal: torch.Tensor | None = None
    """Recomputed logprobs of the proximal policy (``decoupled``), no grad."""
    reference: torch.Tensor | None = None
    """Logprobs under the reference model (KL), no grad."""
    entropy: torch.Tensor | None = None
    """Entropy of the policy at each loss token (entropy bonus), with grad."""

    @classmethod
    def from_batch(cls, batch: dict, logprobs: torch.Tensor, aggregation: str, **kw) -> LossTerms:
        """Gather the loss tokens' columns from ``PackedTree.tensors()``."""
        sel = batch["loss_mask"]
        weights = batch["seq_weights"] if aggregation == "sequence" else batch["weights"]
        return cls(
            logprobs=logprobs,
            behaviour=batch["behaviour_logprobs"][sel],
            advantages=batch["advantages"][sel],
            coef=weights[sel],
            versions=batch["weight_versions"][sel],
            **kw,
        )


def stale_mask(versions: torch.Tensor, current: int, max_staleness: int | None) -> torch.Tensor:
    """True where a token was sampled more than ``max_staleness`` versions ago."""
    if max_staleness is None:
        return torch.zeros_like(versions, dtype=torch.bool)
    return versions < current - max_staleness


def policy_loss(
    terms: LossTerms, cfg: LossConfig, *, normalizer: float, current_version: int = 0
) -> tuple[torch.Tensor, dict[str, float]]:
    """The RL loss of one microbatch (a sum over its tokens / ``normalizer``) and its
    metrics (sums over tokens, so microbatches add up; ``tokens`` counts them)."""
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    lp, adv = terms.logprobs, terms.advantages
    coef = terms.coef.masked_fill(
        stale_mask(terms.versions, current_version, cfg.max_staleness), 0.0
    )
    if cfg.policy_loss == "decoupled":
        if terms.proximal is None:
            raise ValueError("the decoupled objective needs the proximal logprobs")
        base = terms.proximal
        iw = torch.exp(terms.proximal - terms.behaviour)
        truncated = iw > cfg.tis_cap
        iw = iw.clamp(max=cfg.tis_cap)
    else:
        base, iw, truncated = (
            terms.behaviour,
            torch.ones_like(lp),
            torch.zeros_like(lp, dtype=torch.bool),
        )
    ratio = torch.exp(lp - base)
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    per_token = -iw * surrogate
    clip_active = (ratio * adv > clipped * adv) & (adv != 0)
    kl = torch.zeros((), dtype=lp.dtype, device=lp.device)
    if cfg.kl_coef > 0:
        if terms.reference is None:
            raise ValueError("kl_coef > 0 needs the reference logprobs")
        delta = terms.reference - lp
        k3 = torch.exp(delta) - delta - 1.0
        per_token = per_token + cfg.kl_coef * k3
        kl = (coef * k3).sum().detach()
    if cfg.entropy_coef > 0:
        if terms.entropy is None:
            raise ValueError("entropy_coef > 0 needs the entropies")
        per_token = per_token - cfg.entropy_coef * terms.entropy
    loss = (coef * per_token).sum() / normalizer
    active = coef > 0
    metrics = {
        "tokens": float(active.sum()),
        "clip_frac": float((clip_active & active).sum()),
        "approx_kl_behaviour": float(((terms.behaviour - lp.detach()) * active).sum()),
        "ratio": float((ratio.detach() * active).sum()),
        "tis_truncated": float((truncated & active).sum()),
        "stale_tokens": float((terms.coef > 0).sum() - active.sum()),
        "kl_ref": float(kl) / normalizer,
    }
    if terms.entropy is not None:
        metrics["entropy"] = float((terms.entropy.detach() * active).sum())
    return loss, metrics


def sft_loss(terms: LossTerms, *, normalizer: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted negative log-likelihood of the sampled (assistant) tokens."""
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    nll = -(terms.coef * terms.logprobs).sum()
    metrics = {"tokens": float((terms.coef > 0).sum()), "nll": float(nll.detach())}
    if terms.entropy is not None:
        metrics["entropy"] = float((terms.entropy.detach() * (terms.coef > 0)).sum())
    return nll / normalizer, metrics


def step_normalizer(
    batches: list[dict], aggregation: str, *, current_version: int = 0, max_staleness=None
) -> float:
    """The normalizer of one optimizer step over its microbatches (``tensors()`` dicts):
    the summed token weights (``token``) or the weighted number of calls (``sequence``),
    stale tokens left out."""
    key = "seq_weights" if aggregation == "sequence" else "weights"
    total = 0.0
    for b in batches:
        sel = b["loss_mask"]
        fresh = ~stale_mask(b["weight_versions"][sel], current_version, max_staleness)
        total += float(b[key][sel][fresh].sum())
    return total if total > 0 else 1.0
