"""The torch backend on real Hugging Face Qwen2 models (random init, built here): the
data path records -> trees -> units -> packed batches -> train_step, tree/flat exactness
of the loss and its gradient, a bandit that GRPO must learn, exact resume, staleness and
infra-error exclusion, and weights pushed to the embedded engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from gyre_env.trainers.hf_tree import tiny_qwen2
from gyre_env.trainers.losses import LossConfig
from gyre_env.trainers.protocol import TrainBatch, Trainer
from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig

from gyre_env.proxy.records import CallRecord
from gyre_env.trajectory.packing import pack
from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
from gyre_env.trajectory.tree import EpisodeInfo, build_trees


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    tiny_qwen2(vocab_size=64, hidden_size=32, seed=3).save_pretrained(folder)
    return folder


def _record(session, call, prompt, output, version=0, lp=-1.0, role="main"):
    return CallRecord(
        session=session, call_index=call, branch="main" if role == "main" else "b1",
        parent=None, role=role, prompt_ids=list(prompt), output_ids=list(output),
        output_logprobs=[lp] * len(output), weight_version=version,
    )  # fmt: skip


def _group(rng, sessions=4, versions=None, outcomes=None):
    """A GRPO group: a shared prompt, two turns per episode, and one sub-agent branch."""
    prompt = rng.integers(1, 60, 40).tolist()
    records, episodes = [], []
    for k in range(sessions):
        s = f"ep{k}"
        out0 = rng.integers(1, 60, 6).tolist()
        v = versions[k] if versions else 0
        records.append(_record(s, 0, prompt, out0, v))
        turn2 = prompt + out0 + rng.integers(1, 60, 5).tolist()
        records.append(_record(s, 1, turn2, rng.integers(1, 60, 7).tolist(), v))
        sub = prompt[:10] + rng.integers(1, 60, 8).tolist()
        records.append(_record(s, 2, sub, rng.integers(1, 60, 4).tolist(), v, role="sub-agent"))
        outcome = outcomes[k] if outcomes else "success"
        episodes.append(
            EpisodeInfo(session=s, group="g", outcome=outcome, reward=float(rng.random()))
        )
    return build_trees(records, episodes)


def _batch(trees, flat=False, kind="rl", budget=4096):
    units, _ = bounded_samples(trees, SampleConfig(token_budget=budget))
    return TrainBatch(units=[pack(u, flat=flat) for u in units], kind=kind)


def _grads(trainer):
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize(
    "loss",
    [
        LossConfig(),
        LossConfig(aggregation="sequence"),
        LossConfig(policy_loss="decoupled", kl_coef=0.1, entropy_coef=0.01),
    ],
    ids=["ppo-token", "ppo-sequence", "decoupled-kl-entropy"],
)
def test_tree_loss_and_gradient_equal_the_flat_per_path_computation(model_dir, loss):
    trees = _group(np.random.default_rng(0))
    grads, losses = [], []
    for flat in (False, True):
        trainer = TorchTrainer(model_dir, TorchTrainerConfig(lr=1e-3, grad_clip=0), loss)
        for group in trainer.optimizer.param_groups:  # keep weights: compare gradients only
            group["lr"] = 0.0
        metrics = trainer.train_step(_batch(trees, flat=flat))
        losses.append(metrics["loss"])
        grads.append(_grads(trainer))
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    worst = max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0])
    assert worst <= 1e-5, worst
    assert sum(float(g.abs().sum()) for g in grads[0].values()) > 0


@pytest.mark.parametrize("fixed", [True, False], ids=["iteration-start", "current-weights"])
def test_decoupled_ppo_clips_around_the_iterations_starting_policy(model_dir, fixed):
    """Decoupled PPO's proximal policy is the one the iteration's updates start from,
    computed once (``set_proximal``) and held fixed: on the second minibatch the ratio
    has moved and a tight clip binds. Recomputing it with the current weights inside each
    step (what this backend did before) makes the ratio 1 and the clip never binds."""
    rng = np.random.default_rng(0)
    first, second = _batch(_group(rng)), _batch(_group(rng))
    loss = LossConfig(policy_loss="decoupled", clip_low=0.01, clip_high=0.01)
    trainer = TorchTrainer(model_dir, TorchTrainerConfig(lr=1e-2, grad_clip=0), loss)
    if fixed:
        trainer.set_proximal(first.units + second.units)
        assert all(u.proximal_logprobs is not None for u in second.units)
    m1, m2 = trainer.train_step(first), trainer.train_step(second)
    assert m1["clip_frac"] == 0.0  # the first update starts at the proximal policy
    if fixed:
        assert m2["clip_frac"] > 0.1, m2
    else:
        assert m2["clip_frac"] == 0.0


def test_torch_trainer_is_a_trainer_and_its_names_are_the_served_models(model_dir):
    from transformers import AutoModelForCausalLM

    trainer = TorchTrainer(model_dir)
    assert isinstance(trainer, Trainer)
    served = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    named = dict(trainer.named_parameters())
    assert set(named) == set(served)
    assert all(named[k].shape == served[k].shape for k in served)


def _bandit_step(trainer, prompt, target, step, group_size, gen):
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([prompt])).logits[0, -1]
    logp = torch.log_softmax(logits.float(), -1)
    tokens = torch.multinomial(logp.exp(), group_size, replacement=True, generator=gen)
    records, episodes = [], []
    for k, tok in enumerate(tokens.tolist()):
        s = f"it{step}.{k}"
        records.append(_record(s, 0, prompt, [tok], trainer.version, float(logp[tok])))
        reward = 1.0 if tok == target else 0.0
        episodes.append(EpisodeInfo(session=s, group=f"it{step}", outcome="success", reward=reward))
    trainer.train_step(_batch(build_trees(records, episodes)))
    return float(logp[target].exp())


def test_grpo_bandit_learns_to_emit_the_rewarded_token_within_50_steps(tmp_path):
    """One token answers a fixed prompt; reward 1 for token 7, else 0. From a uniform-ish
    random model (p ~ 1/16), GRPO through the whole data path must push p(7) past 0.9."""
    folder = tmp_path / "bandit"
    tiny_qwen2(vocab_size=16, hidden_size=32, seed=1).save_pretrained(folder)
    trainer = TorchTrainer(folder, TorchTrainerConfig(lr=3e-3), LossConfig())
    gen = torch.Generator().manual_seed(0)
    prompt, target = [1, 2, 3, 4], 7
    probs = [_bandit_step(trainer, prompt, target, step, 16, gen) for step in range(50)]
    assert probs[0] < 0.2
    assert probs[-1] > 0.9, probs[::10]
    assert trainer.version == 50


def test_resume_from_state_dict_gives_the_same_next_step_loss(model_dir):
    """Three steps, save, then a fresh trainer loaded from the save and the original
    must agree on step four (loss <= 1e-6, weights equal)."""
    rng = np.random.default_rng(1)
    batches = [_batch(_group(rng)) for _ in range(4)]
    cfg = TorchTrainerConfig(lr=1e-3, warmup_steps=2)
    a = TorchTrainer(model_dir, cfg, LossConfig(kl_coef=0.05))
    for b in batches[:3]:
        a.train_step(b)
    saved = a.state_dict()
    b_ = TorchTrainer(model_dir, cfg, LossConfig(kl_coef=0.05))
    b_.load_state_dict(saved)
    la, lb = a.train_step(batches[3])["loss"], b_.train_step(batches[3])["loss"]
    assert abs(la - lb) <= 1e-6
    assert b_.version == a.version == 4
    for (n, x), (_, y) in zip(a.named_parameters(), b_.named_parameters(), strict=True):
        assert torch.equal(x, y), n


def test_stale_tokens_and_infra_error_episodes_get_zero_weight(model_dir):
    """Episodes sampled beyond the staleness bound and infra errors move no weight."""
    trainer = TorchTrainer(model_dir, TorchTrainerConfig(lr=1e-3), LossConfig(max_staleness=2))
    trainer._version = 10
    rng = np.random.default_rng(2)
    stale = _group(rng, versions=[5, 6, 7, 7])  # all more than 2 versions behind
    metrics = trainer.train_step(_batch(stale))
    assert metrics["loss"] == 0.0
    assert all(float(g.abs().max()) == 0.0 for g in _grads(trainer).values())
    fresh = _group(np.random.default_rng(2), versions=[9, 9, 10, 5])
    metrics = trainer.train_step(_batch(fresh))
    assert metrics["stale_tokens"] > 0 and metrics["loss"] != 0.0

    infra = _group(rng, outcomes=["infra_error"] * 4)
    units, stats = bounded_samples(infra, SampleConfig())
    assert stats.excluded_episodes == 4 and units == []
    mixed = _group(rng, outcomes=["infra_error", "success", "timeout", "infra_error"])
    units, stats = bounded_samples(mixed, SampleConfig())
    assert stats.excluded_episodes == 2
    for part in (p for u in units for p in u.parts):
        assert set(part.advantages) == {"ep1", "ep2"}  # the timed-out episode trains too
        for node in part.loss_nodes:
            assert {s for s, _, _ in part.tree.nodes[node].samplers} & {"ep1", "ep2"}
    (tree,) = mixed
    infra_only = [
        n for n in tree.nodes if n.sampled and {s for s, _, _ in n.samplers} <= {"ep0", "ep3"}
    ]
    assert infra_only and not any(
        n.id in p.loss_nodes for u in units for p in u.parts for n in infra_only
    )


def test_the_elastic_loss_zero_weights_and_counts_tokens_past_the_drivers_bound(model_dir):
    """``gyre train --elastic`` gives the loss its driver's staleness bound (before, the
    loss's ``max_staleness`` stayed None and the bound only gated admission): an elastic
    step over a core and a satellite moves no weight on tokens sampled past it and counts
    them (``stale_tokens``), exactly the loss tokens whose version lags too far."""
    from gyre_env.scheduler.core_cell import CoreStep
    from gyre_env.scheduler.driver import ElasticConfig
    from gyre_env.train.config import TrainConfig, apply_overrides
    from gyre_env.train.elastic import _bounded_staleness

    bound = ElasticConfig().staleness_bound
    loss = _bounded_staleness(TrainConfig()).loss_config()
    assert loss.max_staleness == bound
    mine = apply_overrides(TrainConfig(), ["algorithm.loss.max_staleness=5"])
    assert _bounded_staleness(mine).loss_config().max_staleness == 5  # set: kept

    def trainer():
        return TorchTrainer(model_dir, TorchTrainerConfig(lr=1e-3, weight_decay=0.0), loss)

    def stale_count(units, current):
        total = 0
        for u in units:
            t = u.tensors("cpu")
            sel = t["loss_mask"]
            total += int(
                ((t["weight_versions"][sel] < current - bound) & (t["weights"][sel] > 0)).sum()
            )
        return total

    core, satellite = trainer(), trainer()
    step = CoreStep(core, version=10)
    before = {n: p.detach().clone() for n, p in core.model.named_parameters()}
    stale = _batch(_group(np.random.default_rng(2), versions=[5, 6, 7, 7])).units
    metrics = step.step(stale, [satellite])
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
    assert metrics["stale_tokens"] == stale_count(stale, 10) > 0
    for name, p in core.model.named_parameters():
        assert torch.equal(p, before[name]), f"{name} moved on stale tokens only"
    mixed = _batch(_group(np.random.default_rng(3), versions=[10, 9, 11, 5])).units
    metrics = step.step(mixed, [satellite])
    assert metrics["loss"] != 0.0
    assert metrics["stale_tokens"] == stale_count(mixed, 11) > 0  # ep3's tokens only


def test_sft_step_lowers_the_nll_of_the_sampled_tokens(model_dir):
    trees = _group(np.random.default_rng(4))
    trainer = TorchTrainer(model_dir, TorchTrainerConfig(lr=3e-3))
    first = trainer.train_step(_batch(trees, kind="sft"))["loss"]
    for _ in range(5):
        last = trainer.train_step(_batch(trees, kind="sft"))["loss"]
    assert last < first


def test_offload_onload_and_weights_pushed_to_the_embedded_engine(model_dir):
    """After a step the engine serves the trained weights under a new version: its
    logprobs equal the trainer's model's."""
    from gyre_env.engines.base import SamplingParams
    from gyre_env.engines.embedded import EmbeddedEngine, EmbeddedEngineConfig

    trainer = TorchTrainer(model_dir, TorchTrainerConfig(lr=1e-2))
    trainer.train_step(_batch(_group(np.random.default_rng(5))))
    trainer.offload()
    with pytest.raises(RuntimeError, match="onload"):
        trainer.train_step(_batch(_group(np.random.default_rng(6))))
    trainer.onload()

    async def serve():
        engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=str(model_dir), device="cpu"))
        await engine.start()
        try:
            await engine.update_weights(dict(trainer.named_parameters()), trainer.version)
            params = SamplingParams(max_new_tokens=3, temperature=0.0)
            return await engine.generate([5, 6, 7, 8], params), engine.weight_version
        finally:
            await engine.aclose()

    result, version = asyncio.run(serve())
    assert version == 1 and result.weight_version == 1
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8, *result.output_ids[:-1]]])
        logp = torch.log_softmax(trainer.model(input_ids=ids).logits[0].float(), -1)
    direct = [float(logp[3 + i, t]) for i, t in enumerate(result.output_ids)]
    assert np.allclose(direct, result.output_logprobs, atol=1e-4)


def test_non_finite_steps_are_skipped_then_stop_the_run(model_dir):
    """A NaN loss (here: the final norm's output poisoned by a hook, as a diverged run's
    would be) skips the optimizer step: weights, optimizer state and version stay. The
    second in a row (max_nonfinite_steps=2) raises, naming the figures; a finite step in
    between resets the count."""
    from gyre_env.trainers.steps import NonFiniteStepError

    batch = _batch(_group(np.random.default_rng(5)), kind="sft")
    trainer = TorchTrainer(model_dir, TorchTrainerConfig(lr=1e-3, max_nonfinite_steps=2))
    trainer.train_step(batch)
    before = {n: p.detach().clone() for n, p in trainer.named_parameters()}
    state = trainer.optimizer.state_dict()["state"]
    steps = {k: float(v["step"]) for k, v in state.items()}
    hook = trainer.model.model.norm.register_forward_hook(lambda m, i, out: out * float("nan"))
    m = trainer.train_step(batch)
    assert m["skipped"] == 1.0 and np.isnan(m["loss"])
    assert trainer.version == 1
    for n, p in trainer.named_parameters():
        assert torch.equal(p, before[n]), n
    after = trainer.optimizer.state_dict()["state"]
    assert {k: float(v["step"]) for k, v in after.items()} == steps
    hook.remove()
    assert trainer.train_step(batch)["skipped"] == 0.0 and trainer.version == 2
    hook = trainer.model.model.norm.register_forward_hook(lambda m, i, out: out * float("nan"))
    trainer.train_step(batch)  # one in a row: skipped
    with pytest.raises(NonFiniteStepError, match="2 non-finite steps in a row.*lr"):
        trainer.train_step(batch)
    hook.remove()
    with pytest.raises(ValueError, match="max_nonfinite_steps"):
        TorchTrainerConfig(max_nonfinite_steps=0)


def test_a_switch_moves_the_trainer_state_through_host_buffers_kept_for_the_next(model_dir):
    """The move a CUDA offload and onload make (``_move``), run here device cpu -> host ->
    cpu with unpinned buffers: the state comes back equal, the parameters stay the objects
    the optimizer holds, the next step equals a trainer's that never moved, and the second
    offload copies into the buffers the first allocated (pinned on a GPU: at the first
    switch only, where ``tensor.to("cpu")`` allocated pageable memory every time)."""
    rng = np.random.default_rng(2)
    batches = [_batch(_group(rng)) for _ in range(3)]
    cfg = TorchTrainerConfig(lr=1e-3, warmup_steps=1)
    moved, still = (TorchTrainer(model_dir, cfg, LossConfig(kl_coef=0.05)) for _ in range(2))
    for t in (moved, still):
        t.train_step(batches[0])
    params = list(moved.model.parameters())
    for round_trip in range(2):
        moved._move(offload=True)
        stash = moved._stash
        host = {k: b.data_ptr() for k, b in stash._host.items()}
        if round_trip == 0:
            allocated, first_host = stash.allocated_bytes, host
            assert allocated == stash.moved_bytes == moved.last_move_bytes > 0
            kinds = {k.split(".")[0] for k in host}
            assert kinds == {"model", "reference", "optim"}  # weights, KL reference, Adam
        else:  # the same buffers again, nothing allocated
            assert stash.allocated_bytes == allocated and host == first_host
        assert all(p.data.data_ptr() in host.values() for p in moved.model.parameters())
        moved._move(offload=False)
        assert list(moved.model.parameters()) == params  # the optimizer's objects
        assert all(p.data.data_ptr() not in host.values() for p in params)
        moved.train_step(batches[1 + round_trip])
        still.train_step(batches[1 + round_trip])
        for (n, x), (_, y) in zip(moved.named_parameters(), still.named_parameters(), strict=True):
            assert torch.equal(x, y), n


def test_a_cosine_schedule_falls_to_its_floor_and_a_resumed_trainer_follows_it(model_dir):
    """``reset_optimizer(cosine_steps=, min_lr=)``: warm-up, then a cosine down to
    ``min_lr``, kept in the trainer's state, so that a trainer loaded from it mid-way
    follows the same rates; a state saved before schedules were kept runs constant."""
    from gyre_env.trainers.steps import lr_factor

    trees = _group(np.random.default_rng(5))
    cfg = TorchTrainerConfig(lr=1e-3, warmup_steps=2)
    a = TorchTrainer(model_dir, cfg)
    a.reset_optimizer(1e-2, cosine_steps=6, min_lr=1e-3)

    def lrs(trainer, n):
        return [trainer.train_step(_batch(trees, kind="sft"))["lr"] for _ in range(n)]

    first = lrs(a, 3)
    saved = a.state_dict()
    b = TorchTrainer(model_dir, cfg)  # its own optimizer: constant at cfg.lr
    b.load_state_dict(saved)
    rest = lrs(a, 5)
    assert lrs(b, 5) == pytest.approx(rest, rel=1e-12)
    want = [1e-2 * lr_factor(s, warmup=2, cosine_steps=6, floor=0.1) for s in range(8)]
    assert first + rest == pytest.approx(want, rel=1e-9)
    assert want[0] == pytest.approx(5e-3) and want[6:] == pytest.approx([1e-3, 1e-3])
    assert all(x > y for x, y in zip(want[1:6], want[2:7], strict=True))  # falls all the way
    old = {k: v for k, v in saved.items() if k != "schedule"}
    c = TorchTrainer(model_dir, cfg)
    c.load_state_dict(old)
    assert lrs(c, 3)[1:] == pytest.approx([1e-2, 1e-2])  # (the first: the rate saved)
    with pytest.raises(ValueError, match="min_lr"):
        a.reset_optimizer(1e-3, cosine_steps=4, min_lr=2e-3)
