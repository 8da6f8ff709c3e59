"""Megatron-core backend vs torch backend on CPU: tokens/s of ``train_step`` on the same
packed batch, the same model and the same optimizer settings.

    python benchmarks/megatron_cpu.py                 # cpu-demo shape, 4 groups of 8
    python benchmarks/megatron_cpu.py --groups 2 --repeats 2

Both trainers start from the same weights and train the same packed trees (synthetic
nano-shaped GRPO groups) for ``--repeats`` steps; the first step of each is a warm-up and
is not timed; the two take turns step by step. Prints tokens/s of each, the ratio, and the largest loss difference seen
(the two should agree to ~1e-6 in fp32: tests/trainers/test_megatron.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings


def _batch(groups: int, group_size: int, vocab: int):
    from gyre_env.trainers.protocol import TrainBatch

    from gyre_env.trajectory.packing import pack
    from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
    from gyre_env.trajectory.synthetic import grpo_group
    from gyre_env.trajectory.tree import build_trees

    trees = []
    for g in range(groups):  # ~520-token shared prompt, two turns of 40 tokens per attempt
        records, episodes = grpo_group(
            group_size=group_size, prompt_len=520, turns=2, turn_tokens=40,
            vocab=vocab, seed=g, group=f"g{g}",
        )  # fmt: skip
        for k, e in enumerate(episodes):
            e.reward = float(k % 3 == 0)
        trees += build_trees(records, episodes)
    units, _ = bounded_samples(trees, SampleConfig(token_budget=4096))
    return TrainBatch(units=[pack(u) for u in units])


def _time(trainers: dict, batch, repeats: int) -> tuple[dict, dict]:
    """Step seconds and losses per trainer; the trainers take turns step by step, so a
    load change on a shared machine hits both alike. The first step of each is a
    warm-up (caches, allocators) and not timed."""
    seconds = {name: [] for name in trainers}
    losses = {name: [] for name in trainers}
    for rep in range(repeats + 1):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            m = trainer.train_step(batch)
            if rep:
                seconds[name].append(time.perf_counter() - start)
            losses[name].append(m["loss"])
    return seconds, losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="timed steps per backend")
    p.add_argument("--model", help="a HF model folder (default: cpu-demo tiny model)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

    from gyre_env.trainers.megatron import MegatronTrainer, MegatronTrainerConfig
    from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig
    from transformers import AutoConfig

    from gyre_env.engines.tiny import TinyModelConfig, tiny_model_path

    model = args.model or tiny_model_path(
        TinyModelConfig(
            hidden_size=256, intermediate_size=512, num_layers=4, initializer_range=0.02
        )
    )
    batch = _batch(args.groups, args.group_size, AutoConfig.from_pretrained(model).vocab_size)
    common = dict(lr=1e-4, device="cpu", num_threads=args.threads)
    trainers = {
        "torch": TorchTrainer(model, TorchTrainerConfig(**common)),
        "megatron": MegatronTrainer(model, MegatronTrainerConfig(**common)),
    }
    print(
        f"{len(batch.units)} packed units, {batch.num_tokens} tokens per step; model {model}",
        file=sys.stderr,
    )
    seconds, losses = _time(trainers, batch, args.repeats)
    rate = {}
    for name, times in seconds.items():
        rate[name] = batch.num_tokens / statistics.median(times)
        print(f"{name:>9}: median step {statistics.median(times):.2f}s, {rate[name]:.0f} tok/s")
    diff = max(abs(a - b) for a, b in zip(losses["torch"], losses["megatron"], strict=True))
    print(f"megatron / torch tokens/s: {rate['megatron'] / rate['torch']:.2f}x")
    print(f"max |loss torch - loss megatron| over {args.repeats + 1} steps: {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
