"""The cpu-demo preset on a GPU with a larger random-init model: tokens/s, end to end.

    python benchmarks/gpu/train_gpu.py --out /tmp/train-gpu            # ~5 min on one H200
    python benchmarks/gpu/train_gpu.py --hidden 2048 --layers 24 --iterations 6

Two parts, each reported even if the other fails:

1. ``gyre train --preset cpu-demo`` (SFT, then RL through the LangGraph agent and the
   proxy, held-out evaluation at the end) with the built-in Qwen2 grown to the shape
   given (random init, built on the device: nothing is downloaded), trainer and engine on
   the GPU. Prints per-phase wall time, train and rollout tokens/s per iteration, reward
   and held-out pass rates from the run's ``metrics.jsonl``. Sandboxes are bubblewrap
   where ``bwrap`` exists, else the local (non-isolating) backend.
2. ``benchmarks/train_throughput.py`` on the same model: trainer tokens/s packed as token
   trees (flex_attention, compiled) vs flat per-path sequences, on the same batch.

The learning itself is shown on a CPU (``benchmarks/train_cpu.py``); this measures speed.
Needs gyre-env installed non-editable or editable with its ``train``, ``proxy`` and
``langgraph`` extras, over the machine's own CUDA torch (do not let pip replace it: install
gyre-env with ``--no-deps`` and the extras' packages, e.g. gymnasium, fastapi, uvicorn,
orjson, langgraph, langchain-openai and their dependencies, as wheels where the machine
has no index). Run it from outside the checkout, or ``gyre_env`` resolves to the source
folder, whose ``envs``/``agents``/``trainers`` are only mapped in by the install.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _model_sets(args) -> list[str]:
    return [
        f"model.hidden_size={args.hidden}",
        f"model.intermediate_size={args.intermediate}",
        f"model.num_layers={args.layers}",
        f"model.num_heads={args.heads}",
        f"model.num_kv_heads={args.kv_heads}",
    ]


def run_train(args, out: Path) -> None:
    backend = "bwrap" if shutil.which("bwrap") else "local"
    env_kwargs = (
        f'{{reward_mode = "sparse", sandbox_backend = "{backend}", '
        f"grading = {{ memoize = true, pytest_plugins = [] }} }}"
    )
    sets = [
        *_model_sets(args),
        f"tasks.env_kwargs={env_kwargs}",
        f"algorithm.optim.dtype={args.dtype!r}",
        f"sft.lr={args.sft_lr}",
        "schedule.checkpoint_every=1000",  # a 200M model's checkpoint is GBs: only the last
        *args.set,
    ]
    cmd = [sys.executable, "-m", "gyre_env.cli", "train", "--preset", "cpu-demo"]
    cmd += ["--out", str(out), "--iterations", str(args.iterations), "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    print(f"sandbox backend: {backend}\n$ {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, timeout=args.train_timeout)
    wall = time.perf_counter() - start
    print(f"gyre train exit {proc.returncode}, wall {wall:.0f} s", flush=True)
    summarize(out / "metrics.jsonl")


def summarize(path: Path) -> None:
    if not path.exists():
        print(f"no {path}")
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    its = [r for r in rows if r["kind"] == "iteration"]
    keys = (
        "iteration", "reward_mean", "pass_rate", "train_tokens_per_s",
        "rollout_tokens_per_s", "time_rollout", "time_train", "time_sync",
    )  # fmt: skip
    print("\nper RL iteration:")
    print("  ".join(f"{k[:12]:>12}" for k in keys))
    for r in its:
        print("  ".join(f"{_fmt(r.get(k)):>12}" for k in keys))
    for k in ("train_tokens_per_s", "rollout_tokens_per_s"):
        vals = [r[k] for r in its[1:] if r.get(k)] or [r[k] for r in its if r.get(k)]
        if vals:
            print(f"{k}: median {statistics.median(vals):.0f} (iterations after the first)")
    sft = [r for r in rows if r["kind"] == "sft" and r.get("step_s")]
    if sft:
        tok_s = sum(r["tokens"] for r in sft) / sum(r["step_s"] for r in sft)
        print(f"SFT: {len(sft)} steps, {tok_s:.0f} train tokens/s")
    for r in rows:
        if r["kind"] == "phase":
            print(f"phase {r['phase']}: {r['seconds']:.1f} s")
        elif r["kind"] == "eval":
            print(
                f"held-out eval ({r['phase']}, iteration {r['iteration']}): pass rate "
                f"{r['pass_rate']:.3f} over {r['episodes']} episodes, {r['time_eval']:.0f} s"
            )


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.0f}"
    return "-" if v is None else str(v)


def run_throughput(args) -> None:
    from gyre_env.engines.tiny import TinyModelConfig, tiny_model_path

    model = tiny_model_path(
        TinyModelConfig(
            hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
            initializer_range=0.02,
        )
    )  # fmt: skip
    cmd = [sys.executable, str(HERE.parent / "train_throughput.py"), "--model", str(model)]
    cmd += ["--groups", str(args.groups), "--repeats", "3", "--dtype", args.dtype]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, timeout=args.throughput_timeout)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/train-gpu")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16", help="trainer parameter dtype")
    p.add_argument(
        "--sft-lr", type=float, default=3e-4, help="cpu-demo's 2e-3 diverges at 200M (NaN)"
    )
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--groups", type=int, default=16, help="throughput part: GRPO groups")
    p.add_argument("--train-timeout", type=float, default=330)
    p.add_argument("--throughput-timeout", type=float, default=150)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="to gyre train")
    p.add_argument("--skip", choices=("train", "throughput"), action="append", default=[])
    args = p.parse_args(argv)

    import torch

    print(
        f"torch {torch.__version__}, cuda {torch.cuda.is_available()}"
        + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""),
        flush=True,
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    out = Path(args.out)
    ok = True
    parts = {"train": lambda: run_train(args, out), "throughput": lambda: run_throughput(args)}
    for name, fn in parts.items():
        if name in args.skip:
            continue
        try:
            fn()
        except Exception:  # noqa: BLE001 - each part is reported on its own
            ok = False
            traceback.print_exc()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
