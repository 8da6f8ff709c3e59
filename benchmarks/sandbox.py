"""Sandbox latency and throughput, measured in one run: prints medians and ratios.

- reset: a sandbox from the warm pool (``SandboxPool.acquire``) vs a cold container start;
- step: one ``true`` through the persistent shell vs a fresh ``docker exec`` per command;
- bubblewrap and local, for reference;
- N Docker sandboxes stepping concurrently: steps/s and failures.

Targets (issue 2, 2-core machine): warm reset <= 20 ms p50; persistent-shell step <= 2 ms
p50 and >= 30x faster than ``docker exec``; 32 concurrent sandboxes with zero failures.

    python benchmarks/sandbox.py [--image gyre-base:latest] [--concurrent 32]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from gyre_env.sandbox import SandboxConfig, SandboxPool, make_sandbox


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _row(name: str, samples: list[float]) -> float:
    p50, p99 = _quantiles(samples)
    print(f"  {name:<44} p50 {_ms(p50)}   p99 {_ms(p99)}   (n={len(samples)})")
    return p50


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _steps(sandbox, n: int) -> list[float]:
    """Wall time of ``n`` calls of ``exec("true")`` (each checked)."""
    samples = []
    for _ in range(n):
        took, result = _timed(lambda: sandbox.exec("true"))
        if result.exit_code != 0:
            raise RuntimeError(f"`true` failed in {sandbox.id}: {result.output}")
        samples.append(took)
    return samples


def bench_reset(config: SandboxConfig, n: int) -> tuple[float, float]:
    """Cold Docker start vs acquire from a warm pool; returns (cold p50, warm p50)."""
    cold = []
    for _ in range(n):
        took, sandbox = _timed(lambda: make_sandbox(config, backend="docker"))
        cold.append(took)
        sandbox.close()
    warm = []
    with SandboxPool(lambda: make_sandbox(config, backend="docker"), size=2) as pool:
        for _ in range(n):
            if not pool.wait_ready(120):
                raise RuntimeError(f"the pool did not fill ({pool.failures} failures)")
            took, sandbox = _timed(pool.acquire)
            warm.append(took)
            sandbox.close()
        if pool.cold_starts:
            raise RuntimeError(f"{pool.cold_starts} acquires were cold: warm figures invalid")
    print("reset (Docker)")
    cold_p50 = _row("cold start (container + shell)", cold)
    warm_p50 = _row("warm pool acquire", warm)
    print(f"  warm reset is {cold_p50 / warm_p50:.0f}x faster than a cold start")
    return cold_p50, warm_p50


def bench_step(config: SandboxConfig, n: int, n_exec: int) -> tuple[float, float]:
    """Persistent shell vs ``docker exec`` per command; returns (shell p50, exec p50)."""
    from gyre_env.sandbox.docker import docker_exec_once

    with make_sandbox(config, backend="docker") as sandbox:
        _steps(sandbox, 10)  # warm-up
        shell = _steps(sandbox, n)
        per_exec = []
        for _ in range(n_exec):
            result = docker_exec_once(sandbox, "true")
            if result.exit_code != 0:
                raise RuntimeError(f"docker exec failed: {result.output}")
            per_exec.append(result.duration_s)
    print("step: `true` (Docker)")
    shell_p50 = _row("persistent shell", shell)
    exec_p50 = _row("docker exec per command (CLI)", per_exec)
    print(f"  persistent shell is {exec_p50 / shell_p50:.0f}x faster than docker exec")
    return shell_p50, exec_p50


def bench_reference(backend: str, n: int) -> None:
    config = SandboxConfig()
    starts = []
    for _ in range(5):
        took, sandbox = _timed(lambda: make_sandbox(config, backend=backend))
        starts.append(took)
        sandbox.close()
    with make_sandbox(config, backend=backend) as sandbox:
        _steps(sandbox, 10)
        steps = _steps(sandbox, n)
    print(f"reference: {backend}")
    _row("start", starts)
    _row("step `true`", steps)


def bench_concurrent(config: SandboxConfig, count: int, seconds: float) -> tuple[float, int]:
    """``count`` Docker sandboxes stepping at once for ``seconds``; (steps/s, failures)."""
    with ThreadPoolExecutor(4) as starters:
        sandboxes = list(
            starters.map(lambda _: make_sandbox(config, backend="docker"), range(count))
        )
    failures, latencies, lock = [], [], threading.Lock()
    stop = threading.Event()

    def episode(i: int) -> int:
        sandbox, done = sandboxes[i], 0
        while not stop.is_set():
            start = time.perf_counter()
            try:
                result = sandbox.exec(f"echo {i}-{done}")
                ok = result.exit_code == 0 and result.stdout == f"{i}-{done}\n"
            except Exception as e:  # a failure to count, not to stop the benchmark
                ok, result = False, e
            took = time.perf_counter() - start
            with lock:
                latencies.append(took)
                if not ok:
                    failures.append(f"{sandbox.id}: {result}")
            done += 1
        return done

    try:
        with ThreadPoolExecutor(count) as threads:
            futures = [threads.submit(episode, i) for i in range(count)]
            time.sleep(seconds)
            stop.set()
            total = sum(f.result() for f in futures)
    finally:
        for sandbox in sandboxes:
            sandbox.close()
    rate = total / seconds
    print(f"concurrent: {count} Docker sandboxes stepping for {seconds:.0f} s")
    _row("step latency under load", latencies)
    print(f"  {total} steps, {rate:.0f} steps/s, {len(failures)} failures")
    for line in failures[:5]:
        print(f"    {line}")
    return rate, len(failures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="gyre-base:latest", help="Docker image to start")
    parser.add_argument("--resets", type=int, default=15, help="cold starts and warm acquires")
    parser.add_argument("--steps", type=int, default=300, help="`true` steps per backend")
    parser.add_argument("--execs", type=int, default=30, help="`docker exec` baseline calls")
    parser.add_argument("--concurrent", type=int, default=32, help="sandboxes stepping at once")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the concurrent run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the local backend's warning is expected here
    config = SandboxConfig(image=args.image)
    print(f"image {args.image}")
    cold, warm = bench_reset(config, args.resets)
    shell, per_exec = bench_step(config, args.steps, args.execs)
    for backend in ("bwrap", "local"):
        bench_reference(backend, args.steps)
    rate, failures = bench_concurrent(config, args.concurrent, args.seconds)
    print("targets")
    checks = [
        (f"warm reset p50 {warm * 1000:.2f} ms <= 20 ms", warm <= 0.020),
        (f"shell step p50 {shell * 1000:.2f} ms <= 2 ms", shell <= 0.002),
        (f"shell vs docker exec {per_exec / shell:.0f}x >= 30x", per_exec / shell >= 30),
        (f"{args.concurrent} concurrent: {failures} failures == 0", failures == 0),
    ]
    for text, ok in checks:
        print(f"  [{'met' if ok else 'MISSED'}] {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
