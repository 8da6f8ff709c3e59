"""Trainer tokens/s, packed token trees vs flat per-path sequences, on the same batch.

    python benchmarks/train_throughput.py                    # synthetic nano-shaped groups
    python benchmarks/train_throughput.py --store runs/demo/store.db --run rl.0000.r0

The same GRPO groups are trained by ``TorchTrainer.train_step`` twice per repeat: once
packed as trees (a shared prefix computed once) and once laid out flat (every path its own
sequence with its whole prefix, as trainers without tree packing do). Both give the same
loss and gradient (checked here); the ratio of wall time is the figure. "Useful tokens/s"
counts the flat layout's tokens for both, i.e. the work a flat trainer would have done.
Default model: the cpu-demo shape of the built-in tiny Qwen2 (hidden 256, 4 layers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def _groups(args, vocab: int):
    from gyre_env.trajectory.synthetic import grpo_group
    from gyre_env.trajectory.tree import build_trees

    if args.store:
        from gyre_env.trajectory.store import TrajectoryStore

        with TrajectoryStore(args.store, readonly=True) as store:
            return store.trees(run=args.run) if args.run else store.trees()
    trees = []
    for g in range(args.groups):  # nano-shaped: ~520-token shared prompt, 8 attempts, 2 turns
        records, episodes = grpo_group(
            group_size=args.group_size, prompt_len=520, turns=2, turn_tokens=40,
            vocab=vocab, seed=g, group=f"g{g}",
        )  # fmt: skip
        for k, e in enumerate(episodes):
            e.reward = float(k % 3 == 0)
        trees += build_trees(records, episodes)
    return trees


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--store", help="a trajectory store to take groups from")
    p.add_argument("--run", help="with --store: only this run tag")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", help="a HF model folder (default: cpu-demo tiny model)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)

    import torch
    from gyre_env.trainers.protocol import TrainBatch
    from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig

    from gyre_env.engines.tiny import TinyModelConfig, tiny_model_path
    from gyre_env.trajectory.packing import pack
    from gyre_env.trajectory.sampling import SampleConfig, bounded_samples

    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or tiny_model_path(
        TinyModelConfig(
            hidden_size=256, intermediate_size=512, num_layers=4, initializer_range=0.02
        )
    )
    from transformers import AutoConfig

    trees = _groups(args, AutoConfig.from_pretrained(model).vocab_size)
    units, _ = bounded_samples(trees, SampleConfig(token_budget=4096))
    layouts = {"tree": [pack(u) for u in units], "flat": [pack(u, flat=True) for u in units]}
    flat_tokens = sum(len(u) for u in layouts["flat"])
    print(
        f"{len(trees)} groups, {len(units)} units; tokens tree {sum(len(u) for u in layouts['tree'])}"
        f", flat {flat_tokens}; model {model}; device {args.device}; torch threads "
        f"{torch.get_num_threads()}",
        file=sys.stderr,
    )
    times: dict[str, list[float]] = {"tree": [], "flat": []}
    losses: dict[str, float] = {}
    for rep in range(args.repeats):
        for name, packed in layouts.items():
            trainer = TorchTrainer(
                model, TorchTrainerConfig(lr=1e-4, device=args.device, dtype=args.dtype)
            )
            start = time.perf_counter()
            m = trainer.train_step(TrainBatch(units=packed))
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
            losses[name] = m["loss"]
            print(f"  repeat {rep} {name}: {times[name][-1]:.2f}s", file=sys.stderr, flush=True)
    best = {k: min(v) for k, v in times.items()}
    print("layout  tokens  step s (best/median)  useful tok/s")
    for name, packed in layouts.items():
        tokens = sum(len(u) for u in packed)
        med = statistics.median(times[name])
        print(
            f"{name:>6} {tokens:>7}  {best[name]:6.2f} / {med:6.2f}  {flat_tokens / best[name]:>12.0f}"
        )
    print(
        f"tree/flat step time {best['tree'] / best['flat']:.2f}x; speed-up {best['flat'] / best['tree']:.2f}x"
    )
    print(f"|loss tree - loss flat| = {abs(losses['tree'] - losses['flat']):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
