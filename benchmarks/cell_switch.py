"""One cell's role-switch phases on this machine: ROLLOUT -> TRAINING -> ROLLOUT round trips
with requests in flight, each phase timed (``gyre_env.scheduler.cell``), with a real
optimizer step and publish between the two switches.

Two cells of the built-in tiny Qwen2 (or ``--model DIR``): cell 0 switches while it
serves ``--requests`` greedy streams (they move to cell 1 with their KV), trains one step,
publishes, and comes back serving the new version. Prints the median of each phase.

    python benchmarks/cell_switch.py [--rounds 5] [--requests 8] [--model DIR]

On a GPU machine (the issue's figure: one round trip for a ~1.5B model, target <= 2 s
against the published 8.52 s + 3.46 s), a random-init Qwen2.5-1.5B shape built there,
both cells on the one GPU, the trainer's master weights in bf16:

    python benchmarks/cell_switch.py --size 1.5b --dtype bfloat16 --target-s 2

``--size`` builds the model (``benchmarks/gpu/megatron_check.py``'s shapes; nothing is
downloaded); ``--target-s`` adds a PASS/FAIL line for the median round trip (both
switches, not the train step between them) and exit status 1 on FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path


async def _round(a, b, prompts, units) -> tuple:
    from gyre_env.trainers.protocol import TrainBatch

    from gyre_env.engines.base import SamplingParams

    params = SamplingParams(max_new_tokens=64, temperature=0.0)
    streams = [a.engine.stream(p, params) for p in prompts]
    for s in streams:
        await anext(s)
    there = await a.to_training(serving=[a, b])
    t0 = time.perf_counter()
    a.trainer.train_step(TrainBatch(units=units, kind="rl"))
    a.board.publish(a.trainer.version, dict(a.trainer.named_parameters()))
    train_s = time.perf_counter() - t0
    back = await a.to_rollout()
    for s in streams:
        async for _ in s:
            pass
    await b.sync_engine()
    return there, back, train_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--model", help="a Hugging Face model folder (default: the tiny model)")
    parser.add_argument("--size", choices=("tiny", "1.5b"), help="build a random-init Qwen2")
    parser.add_argument("--dtype", default="float32", help="the trainer's parameter dtype")
    parser.add_argument("--target-s", type=float, help="PASS/FAIL for the round trip")
    args = parser.parse_args(argv)
    if args.size and args.model:
        parser.error("--size builds a model: give --size or --model, not both")
    with tempfile.TemporaryDirectory(prefix="gyre-switch-") as tmp:
        if args.size:
            sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
            from megatron_check import random_model

            args.model = random_model(args.size, tmp)
        return _measure(args)


def _measure(args) -> int:
    import numpy as np
    from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig

    from gyre_env.engines.embedded import EmbeddedEngine
    from gyre_env.engines.tiny import tiny_model_path
    from gyre_env.proxy.records import CallRecord
    from gyre_env.scheduler.cell import Cell
    from gyre_env.scheduler.versions import WeightBoard
    from gyre_env.trajectory.packing import pack
    from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
    from gyre_env.trajectory.tree import EpisodeInfo, build_trees

    model = args.model or str(tiny_model_path())
    board = WeightBoard()
    optim = TorchTrainerConfig(dtype=args.dtype)
    cells = [
        Cell(i, EmbeddedEngine(model_path=model, name=f"c{i}"), TorchTrainer(model, optim),
             board=board)
        for i in range(2)
    ]  # fmt: skip
    rng = np.random.default_rng(0)
    vocab = cells[0].engine.vocab_size
    prompts = [rng.integers(10, vocab, 200 + 50 * i).tolist() for i in range(args.requests)]
    recs = [
        CallRecord(session=f"s{k}", call_index=0, branch="main", parent=None, role="main",
                   prompt_ids=prompts[0], output_ids=rng.integers(10, vocab, 32).tolist(),
                   output_logprobs=[-1.0] * 32, weight_version=0)
        for k in range(4)
    ]  # fmt: skip
    infos = [EpisodeInfo(session=f"s{k}", group="g", reward=k / 4) for k in range(4)]
    units = [pack(u) for u in bounded_samples(build_trees(recs, infos), SampleConfig())[0]]
    rows: dict[str, dict[str, list[float]]] = {"TRAINING": {}, "ROLLOUT": {}}
    rates: dict[str, list[float]] = {}  # GB/s of the phases that moved trainer state
    trains, trips = [], []
    try:
        for _ in range(args.rounds):
            there, back, train_s = asyncio.run(_round(cells[0], cells[1], prompts, units))
            trains.append(train_s)
            trips.append(there.total_s + back.total_s)
            for rec in (there, back):
                for phase, s in {**rec.phases, "total": rec.total_s}.items():
                    rows[rec.to.name].setdefault(phase, []).append(s)
                for phase, moved in rec.phase_bytes.items():
                    rates.setdefault(phase, []).append(moved / 1e9 / rec.phases[phase])
        device = f"{cells[0].engine.device}, trainer {args.dtype}"
        print(f"model {model} ({device}); {args.requests} requests in flight; median of "
              f"{args.rounds} rounds")  # fmt: skip
        for to, phases in rows.items():
            parts = "  ".join(f"{p} {statistics.median(v) * 1e3:.1f}" for p, v in phases.items())
            print(f"-> {to:<8} ms: {parts}")
        for phase, r in rates.items():  # hold against the pinned copy floor (55 GB/s on an H200)
            print(f"{phase}: trainer state at {statistics.median(r):.1f} GB/s")
        print(f"train step + publish: {statistics.median(trains) * 1e3:.1f} ms")
        trip = statistics.median(trips)
        print(f"round trip (both switches): {trip * 1e3:.1f} ms")
        if args.target_s is not None:
            verdict = "PASS" if trip <= args.target_s else "FAIL"
            print(f"{verdict} round trip {trip:.2f} s <= {args.target_s:g} s")
            return 0 if verdict == "PASS" else 1
        return 0
    finally:
        for c in cells:
            c.engine.close()


if __name__ == "__main__":
    sys.exit(main())
