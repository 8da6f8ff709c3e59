"""Check SGLangEngine against a REAL SGLang server on a GPU machine; prints PASS/FAIL per check.

    # launch a server on the built-in tiny model (needs `pip install sglang` and a GPU)
    python benchmarks/gpu/sglang_check.py
    # or a model of your own, or attach to a running server
    python benchmarks/gpu/sglang_check.py --model-path /models/Qwen2.5-0.5B-Instruct
    python benchmarks/gpu/sglang_check.py --url http://127.0.0.1:30000 --model-path /models/X

    # gyre train with SGLang rollouts: a launched server on a random-init model, 2 iterations
    python benchmarks/gpu/sglang_check.py --train --out /tmp/sglang-train

Checks: health and context length; generate with logprobs (greedy twice: same ids);
logprobs against a transformers forward pass of the same folder (bf16 tolerance);
streaming == non-streaming; pause (in place) holds a running stream and rejects new
requests until continue; update_weights_from_disk moves the weight version (and, with
the same folder, keeps greedy outputs); release/resume memory. Exit status 1 if any FAIL.
``--train`` runs ``gyre train --preset cpu-demo`` with ``rollout.engine = "sglang"``:
the run launches ``python -m sglang.launch_server`` on the built-in Qwen2 (random init,
hidden 256, 4 layers, built locally: nothing is downloaded) on GPU 0 beside the torch
trainer, 2 RL iterations, weights pushed after each step (``--weight-sync``, default
``tensor`` through CUDA IPC); it checks that the run ends, that every call record was
served by the SGLang server with ids and logprobs of equal length, and that the second
iteration's calls carry the version pushed after the first's step.
The CI tests run the same client against a fake of the API (tests/engines/fake_sglang.py).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
import traceback

from gyre_env.engines.base import EnginePausedError, SamplingParams
from gyre_env.engines.sglang import SGLangEngine

TINY_LAUNCH_ARGS = [
    "--attention-backend",
    "torch_native",
    "--disable-cuda-graph",
    "--mem-fraction-static",
    "0.3",
]
"""The tiny model's 16-wide heads are outside the fused kernels' sizes; SDPA handles them."""


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[str, str, str]] = []

    async def run(self, name: str, fn) -> None:
        start = time.perf_counter()
        try:
            note = await fn()
            status = "SKIP" if isinstance(note, str) and note.startswith("skip") else "PASS"
        except Exception as e:  # noqa: BLE001 - every failure is reported, the rest still run
            status, note = "FAIL", f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        line = f"{status} {name} ({time.perf_counter() - start:.1f}s){': ' + note if note else ''}"
        print(line, flush=True)
        self.results.append((name, status, note or ""))

    @property
    def failed(self) -> bool:
        return any(status == "FAIL" for _, status, _ in self.results)


def _prompt(vocab: int, n: int = 48) -> list[int]:
    return [(31 * i + 7) % vocab for i in range(n)]


async def check_generate(engine: SGLangEngine, prompt: list[int]) -> str:
    params = SamplingParams(max_new_tokens=32, temperature=0.0)
    a = await engine.generate(prompt, params)
    b = await engine.generate(prompt, params)
    assert a.output_ids, "no tokens generated"
    assert len(a.output_ids) == len(a.output_logprobs), "ids and logprobs differ in length"
    assert all(math.isfinite(x) and x <= 1e-3 for x in a.output_logprobs), a.output_logprobs
    assert a.output_ids == b.output_ids, "greedy decoding is not repeatable"
    return f"{len(a.output_ids)} tokens, finish={a.finish_reason}, version={a.weight_version}"


async def check_logprobs_vs_transformers(
    engine: SGLangEngine, prompt: list[int], model_path: str | None
) -> str:
    if not model_path:
        return "skip: no --model-path to load with transformers"
    try:
        import torch
    except ImportError:
        return "skip: torch not importable"
    if not torch.cuda.is_available():
        return "skip: no CUDA for the reference forward pass"
    import transformers

    result = await engine.generate(prompt, SamplingParams(max_new_tokens=16, temperature=0.0))
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
        .cuda()
        .eval()
    )
    with torch.no_grad():
        logits = model(torch.tensor([prompt + result.output_ids], device="cuda")).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    ref = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(result.output_ids)]
    worst = max(abs(x - y) for x, y in zip(ref, result.output_logprobs, strict=True))
    del model
    torch.cuda.empty_cache()
    assert worst < 0.1, f"max |logprob difference| {worst:.4f} (>= 0.1)"
    return f"max |difference| {worst:.4f} over {len(ref)} tokens"


async def check_stream(engine: SGLangEngine, prompt: list[int]) -> str:
    params = SamplingParams(max_new_tokens=32, temperature=0.0)
    chunks = [c async for c in engine.stream(prompt, params)]
    whole = await engine.generate(prompt, params)
    assert [i for c in chunks for i in c.ids] == whole.output_ids, "stream != non-stream ids"
    assert chunks[-1].finish_reason == whole.finish_reason
    return f"{len(chunks)} chunks"


async def check_pause(engine: SGLangEngine, prompt: list[int], max_new_tokens: int) -> str:
    received: list[int] = []
    done = asyncio.Event()

    async def consume() -> None:
        async for chunk in engine.stream(
            prompt, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=1)
        ):
            received.extend(chunk.ids)
        done.set()

    task = asyncio.create_task(consume())
    while len(received) < 8 and not done.is_set():
        await asyncio.sleep(0.01)
    if done.is_set():
        await task
        return "skip: the stream ended before it could be paused"
    await engine.pause()
    try:
        await asyncio.sleep(0.5)
        held = len(received)
        await asyncio.sleep(1.0)
        assert len(received) == held, f"{len(received) - held} tokens arrived while paused"
        try:
            await engine.generate(prompt, SamplingParams(max_new_tokens=2))
            raise AssertionError("a new request was accepted while paused")
        except EnginePausedError:
            pass
    finally:
        await engine.resume()
    await asyncio.wait_for(task, timeout=300)
    return f"held at {held} tokens, finished with {len(received)}"


async def check_update_from_disk(
    engine: SGLangEngine, prompt: list[int], model_path: str | None
) -> str:
    if not model_path:
        return "skip: no --model-path to reload"
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    before = await engine.generate(prompt, params)
    version = await engine.refresh_weight_version() + 1
    await engine.update_weights(model_path, version)
    assert await engine.refresh_weight_version() == version, "server weight version did not move"
    after = await engine.generate(prompt, params)
    assert after.weight_version == version, f"result carries version {after.weight_version}"
    assert after.output_ids == before.output_ids, "same weights reloaded, different greedy output"
    return f"version {version}"


async def check_weightsync(
    engine: SGLangEngine, prompt: list[int], model_path: str | None, mode: str
) -> str:
    """gyre_env.weightsync's SGLangPublisher: the model's own weights re-sent (``tensor``
    over CUDA IPC, ``distributed`` over NCCL, ``disk``) keep greedy output, move the version."""
    if not model_path:
        return "skip: no --model-path to read weights from"
    import tempfile
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    from gyre_env.weightsync import SGLangPublisher, SGLangSyncConfig

    cuda = torch.cuda.is_available()
    if mode != "disk" and not cuda:
        return f"skip: {mode} mode sends CUDA tensors and this machine has no CUDA"
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        return f"skip: no *.safetensors weights in {model_path}"
    named = {}
    for f in files:
        named.update(load_file(str(f), device="cuda" if mode != "disk" else "cpu"))
    extra = {"backend": "nccl", "master_port": 29671} if mode == "distributed" else {}
    if mode == "disk":
        extra = {"export_dir": tempfile.mkdtemp(prefix="gyre-ws-"), "base_model_path": model_path}
    publisher = SGLangPublisher([engine], SGLangSyncConfig(mode=mode, timeout_s=300, **extra))
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    before = await engine.generate(prompt, params)
    version = await engine.refresh_weight_version() + 1
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    await publisher.apublish(named, version)
    seconds = time.perf_counter() - start
    after = await engine.generate(prompt, params)
    assert after.weight_version == version, f"result carries version {after.weight_version}"
    assert after.output_ids == before.output_ids, "same weights re-sent, different greedy output"
    nbytes = sum(t.numel() * t.element_size() for t in named.values())
    return f"version {version}, {nbytes / seconds / 1e9:.2f} GB/s"


async def check_memory(engine: SGLangEngine, prompt: list[int]) -> str:
    await engine.release_memory()
    await engine.resume_memory()
    result = await engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert result.output_ids, "no tokens after resume_memory"
    return ""


async def run_checks(args: argparse.Namespace) -> bool:
    model_path = args.model_path
    launch_args = list(args.launch_args)
    if args.url is None and model_path is None:
        from gyre_env.engines.tiny import tiny_model_path

        model_path = str(tiny_model_path())
        launch_args = launch_args or TINY_LAUNCH_ARGS
    engine = SGLangEngine(
        url=args.url, model_path=model_path, port=args.port, launch_args=launch_args
    )
    checks = Checks()
    try:
        await checks.run("start_and_health", lambda: _start(engine))
        if checks.failed:
            return False
        prompt = _prompt(args.vocab_size)
        await checks.run("generate_logprobs", lambda: check_generate(engine, prompt))
        await checks.run(
            "logprobs_vs_transformers",
            lambda: check_logprobs_vs_transformers(engine, prompt, model_path),
        )
        await checks.run("stream", lambda: check_stream(engine, prompt))
        await checks.run("pause_continue", lambda: check_pause(engine, prompt, args.pause_tokens))
        await checks.run(
            "update_weights_from_disk", lambda: check_update_from_disk(engine, prompt, model_path)
        )
        for mode in ("tensor", "distributed", "disk"):
            await checks.run(
                f"weightsync_{mode}",
                lambda mode=mode: check_weightsync(engine, prompt, model_path, mode),
            )
        await checks.run("release_resume_memory", lambda: check_memory(engine, prompt))
    finally:
        engine.close()
    return not checks.failed


async def _start(engine: SGLangEngine) -> str:
    await engine.start()
    health = await engine.health()
    assert health["alive"], health
    return f"context {engine.context_length}, weight version {engine.weight_version}"


def train_check(args: argparse.Namespace) -> bool:
    """``gyre train`` with SGLang rollouts on this GPU (see the module docstring)."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    settings = [
        "rollout.engine='sglang'", "rollout.sglang.launch=true",
        f"rollout.sglang.port={args.port}", f"rollout.sglang.weight_sync='{args.weight_sync}'",
        "rollout.sglang.mem_fraction=0.4",
        "rollout.sglang.launch_args=['--disable-cuda-graph']",
        "sft.trajectories=0", "schedule.eval_random=false", "tasks.heldout_count=4",
        "rollout.tasks_per_iteration=2", "rollout.group_size=4", "schedule.optimizer_steps=1",
        "algorithm.skip_zero_variance=false",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "gyre_env.cli", "train", "--preset", "cpu-demo",
           "--iterations", "2", "--out", str(out), "--no-progress"]  # fmt: skip
    for item in settings:
        cmd += ["--set", item]
    checks = Checks()

    async def run_train() -> str:
        start = time.perf_counter()
        proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
        assert proc.returncode == 0, f"gyre train exited with {proc.returncode}"
        return f"{time.perf_counter() - start:.0f}s"

    async def check_records() -> str:
        from gyre_env.trajectory.store import TrajectoryStore

        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert sum(r["kind"] == "iteration" for r in rows) == 2, "not 2 iterations"
        with TrajectoryStore(out / "store.db", readonly=True) as store:
            runs = {e.session: e.run for e in store.episodes()}
            records = list(store.records(list(runs)))
        assert records, "no call records"
        assert {r.replica for r in records} == {"sglang0"}, {r.replica for r in records}
        assert all(len(r.output_ids) == len(r.output_logprobs) for r in records)
        second = {r.weight_version for r in records if runs[r.session] == "rl.0001.r0"}
        assert second == {1}, f"iteration 1 served by versions {second}"
        return f"{len(records)} records, versions {sorted({r.weight_version for r in records})}"

    async def both() -> None:
        await checks.run("gyre_train_sglang", run_train)
        if not checks.failed:
            await checks.run("records_and_versions", check_records)

    asyncio.run(both())
    return not checks.failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="attach to this server instead of launching")
    parser.add_argument("--model-path", default=None, help="model folder (default: the tiny model)")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--vocab-size", type=int, default=1000, help="prompt ids are drawn below this"
    )
    parser.add_argument(
        "--pause-tokens", type=int, default=2000, help="length of the paused stream"
    )
    parser.add_argument(
        "--launch-args", nargs=argparse.REMAINDER, default=[], help="extra server flags (last)"
    )
    parser.add_argument("--train", action="store_true", help="gyre train on SGLang instead")
    parser.add_argument("--out", default="/tmp/gyre-sglang-train", help="--train: run folder")
    parser.add_argument(
        "--weight-sync", default="tensor", choices=("tensor", "distributed", "disk"),
        help="--train: rollout.sglang.weight_sync",
    )  # fmt: skip
    args = parser.parse_args(argv)
    ok = train_check(args) if args.train else asyncio.run(run_checks(args))
    print("ALL PASSED" if ok else "SOME CHECKS FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
