"""The Megatron-core backend on CPU, fp32, one process: HF <-> Megatron weights bit-exact,
forward logprobs equal the HF model's, packed-tree logprobs equal the per-path ones
(dense mask and block-sparse kernel), three training steps equal the torch backend's,
exact resume, and the lazy import that names the extra."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

if os.environ.get("CI"):
    import megatron.core  # noqa: F401  CI installs the extra: a missing one must fail
else:
    pytest.importorskip("megatron.core", reason="pip install 'gyre-env[megatron]'")

from gyre_env.trainers.hf_tree import attention_for, tiny_qwen2  # noqa: E402
from gyre_env.trainers.hf_tree import tree_logprobs as hf_tree_logprobs  # noqa: E402
from gyre_env.trainers.losses import LossConfig  # noqa: E402
from test_torch_trainer import _batch, _group  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def megatron_world():
    """megatron's parallel state (a one-process gloo group) for this module, undone after
    so the rest of the pytest process runs without it."""
    from gyre_env.trainers.megatron.cpu_shim import apply_cpu_shim, remove_cpu_shim
    from gyre_env.trainers.megatron.model import init_parallel, shutdown_parallel

    apply_cpu_shim()
    init_parallel(1)
    yield
    shutdown_parallel()
    remove_cpu_shim()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    tiny_qwen2(vocab_size=64, hidden_size=32, seed=3).save_pretrained(folder)
    return folder


def _megatron_copy(hf_model):
    from gyre_env.trainers.megatron.convert import load_hf_into
    from gyre_env.trainers.megatron.model import build_gpt_model

    gpt = build_gpt_model(hf_model.config)
    load_hf_into(gpt, hf_model.state_dict(), hf_model.config)
    return gpt


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_hf_megatron_round_trip_is_bit_exact_also_through_tp_shards(megatron_world, tied):
    from gyre_env.trainers.megatron.convert import (
        full_megatron_state,
        hf_to_megatron,
        megatron_to_hf,
        shard,
        unshard,
    )

    hf = tiny_qwen2(vocab_size=64, hidden_size=32, num_heads=4, num_kv_heads=2, seed=5)
    hf.config.tie_word_embeddings = tied
    if tied:
        hf.tie_weights()
    served = hf.state_dict()
    back = megatron_to_hf(full_megatron_state(_megatron_copy(hf)), hf.config)
    assert set(back) == set(served)
    assert all(torch.equal(back[k], served[k]) for k in served)
    full = hf_to_megatron(served, hf.config)
    for tp in (2, 4):  # the shares a TP group holds give back the same bits
        regathered = {
            k: unshard(k, [shard(k, v, r, tp) for r in range(tp)]) for k, v in full.items()
        }
        assert all(torch.equal(regathered[k], full[k]) for k in full)
    fc1 = shard(
        "decoder.layers.0.mlp.linear_fc1.weight",
        full["decoder.layers.0.mlp.linear_fc1.weight"],
        1,
        2,
    )
    gate, up = (
        served["model.layers.0.mlp.gate_proj.weight"],
        served["model.layers.0.mlp.up_proj.weight"],
    )
    assert torch.equal(fc1, torch.cat([gate.chunk(2)[1], up.chunk(2)[1]]))  # [gate_r; up_r]


def _tree_batch(seed=0, flat=False):
    return _batch(_group(np.random.default_rng(seed)), flat=flat)


def test_forward_logprobs_equal_the_hf_models(megatron_world):
    from gyre_env.trainers.megatron.forward import attention_mask_for, tree_logprobs

    hf = tiny_qwen2(vocab_size=64, hidden_size=32, seed=3)
    gpt = _megatron_copy(hf)
    worst = 0.0
    for packed in _tree_batch().units + _tree_batch(flat=True).units:
        t = packed.tensors()
        with torch.no_grad():
            want, want_ent = hf_tree_logprobs(hf, t, attention_for(packed), with_entropy=True)
            got, got_ent = tree_logprobs(gpt, t, attention_mask_for(packed), with_entropy=True)
        worst = max(worst, float((want - got).abs().max()), float((want_ent - got_ent).abs().max()))
    print(f"forward logprobs vs HF: max abs diff {worst:.3e}")
    assert worst <= TOL
    with torch.no_grad():  # the comparison can fail: one changed weight shows
        gpt.decoder.layers[0].self_attention.linear_qkv.bias[0] += 0.5
    packed = _tree_batch().units[0]
    t = packed.tensors()
    want = hf_tree_logprobs(hf, t, attention_for(packed))[0]
    assert float((want - tree_logprobs(gpt, t, attention_mask_for(packed))[0]).abs().max()) > TOL


def _by_token(packed, lp):
    """Loss-token logprob keyed by (tree, node, depth): the same token in both layouts."""
    sel = packed.loss_mask
    keys = zip(packed.tree_index[sel], packed.node_ids[sel], packed.position_ids[sel], strict=True)
    return {tuple(map(int, k)): float(v) for k, v in zip(keys, lp, strict=True)}


def test_packed_tree_logprobs_equal_the_per_path_ones(megatron_world):
    """Each sampled token's logprob from the packed tree (dense mask, the block-sparse
    kernel with a small block, flex_attention's BlockMask) equals the one from its own
    path laid out flat."""
    from gyre_env.trainers.megatron.forward import (
        TreeLayoutMask,
        attention_mask_for,
        tree_logprobs,
    )

    gpt = _megatron_copy(tiny_qwen2(vocab_size=64, hidden_size=32, seed=3))
    (tree,), flat_units = _tree_batch().units, _tree_batch(flat=True).units
    assert len(tree) < sum(len(u) for u in flat_units)  # the tree shares prefixes
    flat = {}
    for u in flat_units:
        flat.update(_by_token(u, tree_logprobs(gpt, u.tensors(), attention_mask_for(u))[0]))
    masks = {
        "dense": attention_mask_for(tree, dense_max_tokens=4096, block=16),
        "block-sparse kernel": attention_mask_for(tree, dense_max_tokens=8, block=16),
        # what a tree past the dense limit gets on CUDA (attention_mask_for with a cuda
        # device): flex_attention over its BlockMask. Eager here, forward only: flex has
        # no CPU backward, and the compiled CUDA kernel is checked by the GPU script
        "flex_attention": TreeLayoutMask(tree.block_mask(16)),
    }
    for name, mask in masks.items():
        with torch.no_grad() if name == "flex_attention" else contextlib.nullcontext():
            got = _by_token(tree, tree_logprobs(gpt, tree.tensors(), mask)[0])
        assert set(got) == set(flat)
        worst = max(abs(got[k] - flat[k]) for k in got)
        print(f"packed tree vs per-path ({name}): max abs diff {worst:.3e}")
        assert worst <= TOL
    assert isinstance(masks["block-sparse kernel"], TreeLayoutMask)
    # Transformer Engine's core attention takes only a dense mask
    assert not isinstance(
        attention_mask_for(tree, dense_max_tokens=8, sparse=False), TreeLayoutMask
    )


def test_a_bare_cuda_device_gets_an_index_for_set_device():
    """``torch.cuda.set_device(torch.device("cuda"))`` raises "Expected a torch.device with
    a specified index": the backend's first CUDA call failed on an H200 for want of one."""
    from gyre_env.trainers.megatron.trainer import indexed_cuda_device

    assert indexed_cuda_device(torch.device("cuda"), env={}) == torch.device("cuda", 0)
    assert indexed_cuda_device(torch.device("cuda"), env={"LOCAL_RANK": "3"}).index == 3
    assert indexed_cuda_device(torch.device("cuda:1"), env={"LOCAL_RANK": "3"}).index == 1
    assert indexed_cuda_device(torch.device("cpu")) == torch.device("cpu")


def test_the_fused_softmax_is_asked_for_only_when_its_kernel_imports(monkeypatch):
    """Without apex or Transformer Engine the wheel has no ``scaled_masked_softmax_cuda``;
    asking megatron for the fused softmax then fails at the first bf16 forward."""
    import importlib.util

    from gyre_env.trainers.megatron import model

    real = importlib.util.find_spec
    cfg = tiny_qwen2(vocab_size=64, hidden_size=32, seed=3).config
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if "softmax" in n else real(n, *a)
    )
    assert not model.fused_softmax_available()
    assert model.transformer_config(cfg, cuda=True).masked_softmax_fusion is False
    assert model.transformer_config(cfg, cuda=False).masked_softmax_fusion is False


def _trainers(model_dir, loss, **kw):
    from gyre_env.trainers.megatron import MegatronTrainer, MegatronTrainerConfig
    from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig

    common = dict(lr=3e-3, warmup_steps=2, device="cpu", **kw)
    return (
        TorchTrainer(model_dir, TorchTrainerConfig(**common), loss),
        MegatronTrainer(model_dir, MegatronTrainerConfig(**common), loss),
    )


@pytest.mark.parametrize(
    "loss",
    [LossConfig(policy_loss="decoupled", kl_coef=0.1, entropy_coef=0.01), None],
    ids=["decoupled-kl-entropy", "sft"],
)
def test_three_train_steps_equal_the_torch_backend(megatron_world, model_dir, loss):
    from gyre_env.trainers.protocol import TrainBatch, Trainer

    rng = np.random.default_rng(1)
    kind = "rl" if loss else "sft"
    batches = [_batch(_group(rng) + _group(rng), kind=kind, budget=250) for _ in range(3)]
    assert all(len(b.units) >= 2 for b in batches)  # several microbatches per step
    ref, meg = _trainers(model_dir, loss or LossConfig(), grad_clip=0.01)  # clip is active
    assert isinstance(meg, Trainer)
    worst_loss = 0.0
    for b in batches:
        mr, mm = ref.train_step(b), meg.train_step(TrainBatch(units=b.units, kind=kind))
        worst_loss = max(worst_loss, abs(mr["loss"] - mm["loss"]))
        assert mm["grad_norm"] == pytest.approx(mr["grad_norm"], rel=1e-4)
    want, got = dict(ref.named_parameters()), dict(meg.named_parameters())
    assert set(want) == set(got)
    worst_w = max(float((want[k] - got[k]).abs().max()) for k in want)
    moved = max(float((got[k] - v).abs().max()) for k, v in _served(model_dir).items())
    print(f"3 steps ({kind}) vs torch: loss {worst_loss:.3e}, weights {worst_w:.3e}")
    assert worst_loss <= TOL and worst_w <= TOL
    assert moved > 10 * TOL and meg.version == 3  # the steps did change the weights


def test_a_cosine_schedule_takes_the_torch_backends_rates(megatron_world, model_dir):
    rng = np.random.default_rng(3)
    batches = [_batch(_group(rng), kind="sft") for _ in range(4)]
    ref, meg = _trainers(model_dir, LossConfig())
    for t in (ref, meg):
        t.reset_optimizer(3e-3, cosine_steps=3, min_lr=3e-4)
    got = [(ref.train_step(b)["lr"], meg.train_step(b)["lr"]) for b in batches]
    assert [m for _, m in got] == pytest.approx([r for r, _ in got], rel=1e-12)
    assert got[-1][1] == pytest.approx(3e-4) and got[1][1] > got[2][1] > got[3][1]
    again = _trainers(model_dir, LossConfig())[1]
    again.load_state_dict(meg.state_dict())  # the schedule travels with the state
    assert again.train_step(batches[0])["lr"] == pytest.approx(3e-4)


@pytest.mark.parametrize(
    "loss", [LossConfig(policy_loss="decoupled", entropy_coef=0.01, kl_coef=0.1), None]
)
def test_a_core_cell_and_a_satellite_step_as_one_train_step(megatron_world, model_dir, loss):
    """The elastic core cell on the Megatron backend: the core and a satellite each take
    a share of the batch into their grad buffers, the core sums them and steps: the
    weights equal one ``train_step`` over the whole batch (and the torch core's). With a
    KL term, every cell's trainer freezes its reference when built (``with_reference``)."""
    from gyre_env.trainers.megatron import MegatronTrainer, MegatronTrainerConfig

    from gyre_env.scheduler.core_cell import CoreStep, with_reference

    rng = np.random.default_rng(5)
    kind = "rl" if loss else "sft"
    loss = loss or LossConfig()
    common = dict(lr=3e-3, warmup_steps=2, device="cpu", grad_clip=0.01)
    whole = MegatronTrainer(model_dir, MegatronTrainerConfig(**common), loss)
    core = with_reference(MegatronTrainer(model_dir, MegatronTrainerConfig(**common), loss))
    satellite = with_reference(MegatronTrainer(model_dir, MegatronTrainerConfig(**common), loss))
    torch_core, torch_sat = (
        with_reference(_trainers(model_dir, loss, grad_clip=0.01)[0]) for _ in range(2)
    )
    step, torch_step = CoreStep(core), CoreStep(torch_core)
    for _ in range(2):
        b = _batch(_group(rng) + _group(rng), kind=kind, budget=250)
        assert len(b.units) >= 2  # a share each
        want = whole.train_step(b)
        got = step.step(b.units, [satellite], kind)
        torch_step.step(b.units, [torch_sat], kind)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        satellite.load_named_parameters(dict(core.named_parameters()))  # pulls the version
        torch_sat.load_named_parameters(dict(torch_core.named_parameters()))
    want, got = dict(whole.named_parameters()), dict(core.named_parameters())
    worst = max(float((want[k] - got[k]).abs().max()) for k in want)
    torch_w = dict(torch_core.named_parameters())
    worst_torch = max(float((torch_w[k] - got[k]).abs().max()) for k in want)
    print(f"core + satellite vs one step: {worst:.3e}; vs the torch core: {worst_torch:.3e}")
    assert worst <= TOL and worst_torch <= TOL and step.version == 2
    assert not any(p.abs().sum() for p in satellite.grad_buffers()), "handed to the core"


def _served(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def test_resume_offload_and_save_pretrained(megatron_world, model_dir, tmp_path):
    from gyre_env.trainers.megatron import MegatronTrainer, MegatronTrainerConfig

    rng = np.random.default_rng(2)
    batches = [_batch(_group(rng)) for _ in range(3)]
    cfg = MegatronTrainerConfig(lr=1e-3, warmup_steps=2, device="cpu")
    loss = LossConfig(kl_coef=0.05)
    a = MegatronTrainer(model_dir, cfg, loss)
    for b in batches[:2]:
        a.train_step(b)
    saved = a.state_dict()
    b_ = MegatronTrainer(model_dir, cfg, loss)
    b_.load_state_dict(saved)
    a.offload()
    with pytest.raises(RuntimeError, match="onload"):
        a.train_step(batches[2])
    a.onload()
    la, lb = a.train_step(batches[2])["loss"], b_.train_step(batches[2])["loss"]
    assert abs(la - lb) <= 1e-6 and a.version == b_.version == 3
    for (n, x), (_, y) in zip(a.named_parameters(), b_.named_parameters(), strict=True):
        assert torch.equal(x, y), n
    # HF-named weights in, as an elastic cell holding a Megatron trainer syncs them.
    from gyre_env.scheduler.cell import Cell
    from gyre_env.scheduler.versions import WeightBoard

    fresh = MegatronTrainer(model_dir, cfg, loss)
    board = WeightBoard()
    cell = Cell(0, None, fresh, board=board)
    board.publish(a.version, dict(a.named_parameters()))
    assert cell.sync_trainer() == a.version
    for (n, x), (_, y) in zip(a.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(x, y), n
    folder = a.save_pretrained(tmp_path / "hf")
    saved_hf = _served(folder)
    assert all(torch.equal(saved_hf[k], v) for k, v in a.named_parameters())


def test_nan_steps_are_skipped_then_stop_the_run(megatron_world, model_dir):
    """As the torch backend: a NaN loss (the final norm's output poisoned) leaves weights,
    optimizer state and version; two in a row (max_nonfinite_steps=2) raise."""
    from gyre_env.trainers.megatron import MegatronTrainer, MegatronTrainerConfig
    from gyre_env.trainers.steps import NonFiniteStepError

    cfg = MegatronTrainerConfig(lr=1e-3, device="cpu", max_nonfinite_steps=2)
    trainer = MegatronTrainer(model_dir, cfg, LossConfig())
    batch = _tree_batch(seed=7)
    trainer.train_step(batch)
    before = {n: p.detach().clone() for n, p in trainer.named_parameters()}
    norm = trainer.model.decoder.final_layernorm
    hook = norm.register_forward_hook(lambda m, i, out: out * float("nan"))
    assert trainer.train_step(batch)["skipped"] == 1.0 and trainer.version == 1
    for n, p in trainer.named_parameters():
        assert torch.equal(p, before[n]), n
    with pytest.raises(NonFiniteStepError, match="2 non-finite steps in a row"):
        trainer.train_step(batch)
    hook.remove()
    assert trainer.train_step(batch)["skipped"] == 0.0 and trainer.version == 2


def test_import_is_lazy_and_a_missing_extra_names_the_install():
    code = (
        "import sys; sys.modules['megatron'] = None\n"
        "import gyre_env, gyre_env.trainers.megatron as m\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n    m.MegatronTrainer\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'gyre-env[megatron]'" in out.stdout


def test_train_config_selects_the_megatron_backend_and_its_optim_fields():
    from gyre_env.train.config import ConfigError, apply_overrides, load_config

    def config(*overrides):
        cfg = apply_overrides(
            load_config(None, preset="cpu-demo"), ["backend='megatron'", *overrides]
        )
        cfg.validate()
        return cfg

    optim = config("algorithm.optim.tensor_parallel=2").optim_config()
    assert type(optim).__name__ == "MegatronTrainerConfig" and optim.tensor_parallel == 2
    with pytest.raises(ConfigError, match="fsdp"):  # a torch-backend-only field
        config("algorithm.optim.fsdp=true")
