"""Check the Megatron-core backend's CUDA path on one GPU; prints PASS/FAIL per check
and tokens/s against the torch backend.

    python benchmarks/gpu/megatron_check.py                  # random-init ~1.5B Qwen2
    python benchmarks/gpu/megatron_check.py --size tiny      # a quick run of the script
    python benchmarks/gpu/megatron_check.py --model /models/Qwen2.5-1.5B

The CUDA path: Transformer Engine's layer spec when TE imports (megatron's local spec
otherwise, said in the output), bf16 weights, megatron-core's distributed optimizer
(``MegatronTrainerConfig(optimizer="megatron", distributed_optimizer=True)``), TP=1.
Checks: forward logprobs of a packed tree against the HF model (bf16 tolerance); a train
step against the torch backend's on the same batch (loss, bf16 tolerance); the weights
moved and ``named_parameters`` are the HF names; offload frees GPU memory and onload
brings the trainer back; then tokens/s of both backends on the same batch (median of
``--repeats`` steps after a warm-up). Exit status 1 if any FAIL. The CPU path of the same
code is tested in CI (tests/trainers/test_megatron*.py, fp32, <= 1e-4).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback

SIZES = {  # Qwen2.5-1.5B's shape (about 1.54B parameters with tied embeddings), and tiny
    "1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
    ),
}  # fmt: skip


def random_model(size: str, folder: str) -> str:
    """A random-init bf16 Qwen2 of ``size`` saved as an HF folder (nothing downloaded)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        **SIZES[size], max_position_embeddings=32768, tie_word_embeddings=True,
        rope_theta=1_000_000.0, attention_dropout=0.0, use_sliding_window=False,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
    return folder


def batch(vocab: int, groups: int):
    from gyre_env.trainers.protocol import TrainBatch

    from gyre_env.trajectory.packing import pack
    from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
    from gyre_env.trajectory.synthetic import grpo_group
    from gyre_env.trajectory.tree import build_trees

    trees = []
    for g in range(groups):
        records, episodes = grpo_group(
            group_size=8, prompt_len=1024, turns=3, turn_tokens=128, vocab=vocab, seed=g,
            group=f"g{g}",
        )  # fmt: skip
        for k, e in enumerate(episodes):
            e.reward = float(k % 3 == 0)
        trees += build_trees(records, episodes)
    units, _ = bounded_samples(trees, SampleConfig(token_budget=8192))
    return TrainBatch(units=[pack(u) for u in units])


class Checks:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def run(self, name: str, fn) -> None:
        try:
            status, note = "PASS", fn() or ""
        except Exception as e:  # noqa: BLE001 - every failure is reported, the rest still run
            status, note = "FAIL", f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        self.rows.append((status, name, note))
        print(f"{status:4} {name}: {note}", flush=True)


def _steps(trainer, b, repeats: int) -> float:
    import torch

    trainer.train_step(b)  # warm-up (allocator, kernels)
    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.train_step(b)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return b.num_tokens / statistics.median(seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="1.5b")
    p.add_argument("--model", help="an HF Qwen2 folder instead of a random-init one")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    import torch
    from gyre_env.trainers.hf_tree import attention_for, tree_logprobs
    from gyre_env.trainers.megatron import MegatronTrainer, MegatronTrainerConfig
    from gyre_env.trainers.megatron.forward import attention_mask_for
    from gyre_env.trainers.megatron.forward import tree_logprobs as megatron_logprobs
    from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig

    if not torch.cuda.is_available():
        print("FAIL no CUDA device: this check is for a GPU machine")
        return 1
    model = args.model or random_model(args.size, tempfile.mkdtemp(prefix="gyre-megatron-"))
    common = dict(lr=1e-5, device="cuda", dtype="bfloat16")
    meg = MegatronTrainer(
        model, MegatronTrainerConfig(**common, optimizer="megatron", distributed_optimizer=True)
    )
    print(f"layer spec: {'Transformer Engine' if meg.use_te else 'megatron local (no TE)'}")
    b = batch(meg.hf_config.vocab_size, args.groups)
    print(f"batch: {len(b.units)} packed units, {b.num_tokens} tokens; model {model}")
    ref = TorchTrainer(model, TorchTrainerConfig(**common))
    checks = Checks()

    def forward():
        packed = b.units[0]
        t = packed.tensors("cuda")
        with torch.no_grad():
            want = tree_logprobs(ref.model, t, attention_for(packed, device="cuda"))[0]
            got = megatron_logprobs(meg.model, t, attention_mask_for(packed, device="cuda"))[0]
        diff = (want - got).abs()
        assert float(diff.mean()) < 0.05, f"mean |diff| {float(diff.mean()):.3f}"
        return f"logprobs vs HF: mean |diff| {float(diff.mean()):.4f}, max {float(diff.max()):.3f}"

    def train_step():
        before = {k: v.clone() for k, v in meg.named_parameters()}
        lr_, lm = ref.train_step(b)["loss"], meg.train_step(b)
        assert abs(lr_ - lm["loss"]) < 0.05 * max(1.0, abs(lr_)), (lr_, lm["loss"])
        after = dict(meg.named_parameters())
        assert set(after) == set(dict(ref.named_parameters()))
        moved = max(float((after[k].float() - v.float()).abs().max()) for k, v in before.items())
        assert moved > 0, "the distributed optimizer did not change the weights"
        return f"loss torch {lr_:.4f} megatron {lm['loss']:.4f}; grad_norm {lm['grad_norm']:.3f}"

    def offload():
        used = torch.cuda.memory_allocated()
        meg.offload()
        freed = used - torch.cuda.memory_allocated()
        meg.onload()
        meg.train_step(b)
        assert freed > 0.5 * sum(p.numel() * 2 for p in meg.model.parameters()), freed
        return f"freed {freed / 2**30:.2f} GiB, trains again after onload"

    def throughput():
        t_torch, t_meg = _steps(ref, b, args.repeats), _steps(meg, b, args.repeats)
        return f"tokens/s torch {t_torch:.0f}, megatron {t_meg:.0f}: ratio {t_meg / t_torch:.2f}x"

    for name, fn in [
        ("forward", forward),
        ("train step (bf16, distributed optimizer)", train_step),
        ("offload/onload", offload),
        ("throughput", throughput),
    ]:
        checks.run(name, fn)
    failed = [r for r in checks.rows if r[0] == "FAIL"]
    print(f"{len(checks.rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
