"""NL2Repo env costs, as medians in one run (prints figures and ratios, never pass/fail).

1. ``env.step`` overhead of a no-op tool (``bash true``) against a raw ``sandbox.exec``,
   with and without the potential Φ (sparse mode skips it);
2. interim scoring (Φ) time after one file changed, for workspaces of 10, 100 and 1,000
   Python files, incremental against a full recheck;
3. the whole built-in suite's gold preflight: ``gyre tasks check`` (``gyre_env.scoring.preflight``:
   gold, visible and empty runs in sandboxes) and the sandboxed grader alone on every gold;
4. one step of 8 envs: ``SyncVectorEnv`` against the thread vector env.

    python benchmarks/env_step.py [--backend docker|bwrap|local] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
from gyre_env.envs.nl2repo.env import NL2RepoEnv

import gyre_env  # noqa: F401  (registers the env ids)
from gyre_env.sandbox import SandboxConfig, make_sandbox
from gyre_env.scoring import GradingConfig, PotentialConfig, PotentialScorer, grade_workspace
from gyre_env.tasks import load_suite

TASK = "micro-lru-cache"


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def bench_step(backend: str, repeats: int) -> None:
    box = make_sandbox(SandboxConfig(), backend)
    raw = median_ms(lambda: box.exec("true"), repeats)
    box.close()
    print(f"\n[1] env.step(bash 'true') vs sandbox.exec('true'), backend={backend}")
    print(f"    raw sandbox.exec            {raw:8.1f} ms")
    for mode in ("sparse", "potential"):
        env = NL2RepoEnv(sandbox_backend=backend, reward_mode=mode, max_steps=10_000)
        env.reset(seed=0, options={"task_id": TASK})
        env.step({"name": "bash", "arguments": {"command": "true"}})  # first Φ: full scan
        ms = median_ms(
            lambda env=env: env.step({"name": "bash", "arguments": '{"command": "true"}'}), repeats
        )
        print(f"    env.step, reward={mode:9s} {ms:8.1f} ms   ({ms / raw:.2f}x raw)")
        env.close()


def bench_potential(backend: str, repeats: int) -> None:
    task = {t.id: t for t in load_suite("builtin")}[TASK]
    print("\n[2] Φ after one changed file (median ms)")
    print("    files   incremental   full recheck   ratio")
    for n in (10, 100, 1000):
        box = make_sandbox(SandboxConfig(), backend)
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(n):
                body = f"import os\n\n\ndef f{i}(x):\n    return os.path.join(x, '{i}')\n"
                Path(tmp, f"pkg{i % 10}", f"m{i}.py").parent.mkdir(exist_ok=True)
                Path(tmp, f"pkg{i % 10}", f"m{i}.py").write_text(body)
            box.put_dir(tmp, ".")
        row = []
        for incremental in (True, False):
            scorer = PotentialScorer.for_sandbox(
                box, task, PotentialConfig(incremental=incremental)
            )
            scorer.update()
            counter = iter(range(10**6))

            def change_and_score(box=box, scorer=scorer, counter=counter):
                box.exec(f"echo 'x = {next(counter)}' >> pkg0/m0.py")
                return scorer.update()

            edit = median_ms(lambda box=box: box.exec("echo 'y = 1' >> pkg0/m0.py"), repeats)
            row.append(median_ms(change_and_score, repeats) - edit)
        box.close()
        print(f"    {n:5d}   {row[0]:8.1f}      {row[1]:9.1f}      {row[1] / row[0]:5.1f}x")


def bench_preflight(backend: str) -> None:
    from gyre_env.scoring.preflight import check_tasks

    tasks = load_suite("builtin")
    print(f"\n[3] whole-suite gold preflight ({len(tasks)} tasks)")
    start = time.perf_counter()
    checks = check_tasks(tasks, backend=backend)
    bad = [c.task.id for c in checks if not c.ok]
    print(
        f"    tasks check (gold+visible+empty, threads) {time.perf_counter() - start:7.1f} s"
        f"   failing: {bad or 'none'}"
    )
    for workers in (1, 4):
        start = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            results = list(
                pool.map(
                    lambda t: grade_workspace(t, t.gold_dir, GradingConfig(backend=backend)), tasks
                )
            )
        wrong = [t.id for t, r in zip(tasks, results, strict=True) if r.score != 1.0]
        print(
            f"    sandboxed grader on gold, {workers} thread(s)     "
            f"{time.perf_counter() - start:7.1f} s   not 1.0: {wrong or 'none'} ({backend})"
        )


def bench_vector(backend: str, repeats: int) -> None:
    print("\n[4] one step of 8 envs (median ms)")
    actions = {
        "bash 'sleep 0.5'": {"name": "bash", "arguments": {"command": "sleep 0.5"}},
        "write_file + Φ": {"name": "write_file", "arguments": {"path": "a.py", "content": "x=1\n"}},
    }
    kwargs = dict(sandbox_backend=backend, max_steps=10_000)
    for label, action in actions.items():
        row = {}
        for mode in ("sync", "vector_entry_point"):
            envs = gym.make_vec(
                "Gyre/NL2Repo-v0",
                num_envs=8,
                vectorization_mode=mode,
                **{**kwargs, "task_ids": [TASK]},
            )
            envs.reset(seed=0)
            envs.step((action,) * 8)
            row[mode] = median_ms(
                lambda envs=envs, action=action: envs.step((action,) * 8), max(3, repeats // 3)
            )
            envs.close()
        print(
            f"    {label:18s} sync {row['sync']:8.1f}   threaded {row['vector_entry_point']:8.1f}"
            f"   speed-up {row['sync'] / row['vector_entry_point']:.1f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["step", "phi", "preflight", "vector"]
    )
    args = parser.parse_args()
    from gyre_env.sandbox import choose_backend

    backend = choose_backend(args.backend)
    print(f"backend={backend}  cpus={os.cpu_count()}  load={os.getloadavg()[0]:.1f}")
    if "step" not in args.skip:
        bench_step(backend, args.repeats)
    if "phi" not in args.skip:
        bench_potential(backend, args.repeats)
    if "preflight" not in args.skip:
        bench_preflight(backend)
    if "vector" not in args.skip:
        bench_vector(backend, args.repeats)


if __name__ == "__main__":
    main()
