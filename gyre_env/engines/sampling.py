"""Token sampling for the embedded engine: temperature, top-p, top-k, min-p, per-request seeds.

Logprob convention (the behaviour logprob the trainer compares against): the log-probability
of the sampled id under ``log_softmax(logits / temperature)``, before top-p/top-k/min-p
truncation;
for greedy decoding (temperature 0) under ``log_softmax(logits)``.
"""

from __future__ import annotations

import math
import random

from gyre_env.engines.base import SamplingParams


def validate_params(params: SamplingParams) -> None:
    """Reject sampling parameters no engine could honour, naming the field."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    if not isinstance(params.max_new_tokens, int) or params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {params.max_new_tokens!r}")
    if not isinstance(params.temperature, int | float) or not params.temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0, got {params.temperature!r}")
    if not isinstance(params.top_p, int | float) or not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p!r}")
    if not isinstance(params.top_k, int) or (params.top_k != -1 and params.top_k < 1):
        raise ValueError(f"top_k must be -1 (disabled) or an int >= 1, got {params.top_k!r}")
    if not isinstance(params.min_p, int | float) or not 0 <= params.min_p < 1:
        raise ValueError(f"min_p must be in [0, 1) (0 disables it), got {params.min_p!r}")
    if not all(isinstance(t, int) and t >= 0 for t in params.stop_token_ids):
        raise ValueError(f"stop_token_ids must be non-negative ints, got {params.stop_token_ids!r}")
    if params.seed is not None and not isinstance(params.seed, int):
        raise ValueError(f"seed must be an int or None, got {params.seed!r}")
    if not math.isfinite(float(params.temperature)):
        raise ValueError("temperature must be finite")


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature == 0 or params.top_k == 1


def make_generator(params: SamplingParams, device):
    """A torch.Generator seeded from ``params.seed`` (a fresh random seed when None)."""
    import torch

    seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**63)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def sample_rows(
    logits, params: list[SamplingParams], generators: list
) -> tuple[list[int], list[float]]:
    """Sample one token per row of ``logits`` ``[batch, vocab]``; returns ids and logprobs."""
    import torch

    logits = logits.float()
    ids: list[int] = []
    logprobs: list[float] = []
    greedy_logp = torch.log_softmax(logits, dim=-1)  # [batch, vocab]
    if bool(torch.isnan(greedy_logp).any()):  # on CUDA, multinomial would assert on device
        rows = torch.isnan(greedy_logp).any(dim=-1).nonzero().flatten().tolist()
        raise FloatingPointError(
            f"the model's logits are NaN or +inf (batch rows {rows}): its weights are broken, "
            "e.g. pushed from a training step that diverged"
        )
    greedy_ids = greedy_logp.argmax(dim=-1).tolist()
    for row, p in enumerate(params):
        if is_greedy(p):
            token = greedy_ids[row]
            if p.temperature == 0:
                lp = float(greedy_logp[row, token])
            else:  # top_k == 1 at a temperature: logprob under the scaled distribution
                lp = float(torch.log_softmax(logits[row] / p.temperature, dim=-1)[token])
            ids.append(token)
            logprobs.append(lp)
            continue
        token, lp = _sample_one(logits[row], p, generators[row])
        ids.append(token)
        logprobs.append(lp)
    return ids, logprobs


def _sample_one(row, p: SamplingParams, generator) -> tuple[int, float]:
    import torch

    scaled = row / p.temperature  # [vocab]
    logp = torch.log_softmax(scaled, dim=-1)
    filtered = scaled.clone()
    if p.top_k > 0 and p.top_k < filtered.numel():
        kth = torch.topk(filtered, p.top_k).values[-1]
        filtered[filtered < kth] = float("-inf")
    if p.top_p < 1.0:
        sorted_vals, order = torch.sort(filtered, descending=True)
        probs = torch.softmax(sorted_vals, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (keeps >= 1)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= p.top_p
        filtered[order[drop]] = float("-inf")
    if p.min_p > 0:
        # p_i >= min_p * p_max, after temperature, as a logit margin; the most likely token
        # always passes, so at least one token is left
        floor = filtered.max() + math.log(p.min_p)
        filtered[filtered < floor] = float("-inf")
    probs = torch.softmax(filtered, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator).item())
    return token, float(logp[token])
