"""KV migration vs re-prefill, per request, at 1k/8k/32k context tokens.

A request decodes on engine A; the cell leaves ROLLOUT and the request moves to engine B
(``gyre_env.scheduler.migration.migrate``): either with its KV (export, pack, copy over the
transport, unpack, join B's batch) or re-prefilled on B from its token ids. The figure is
the time from the start of the move to the request's next token arriving at its caller,
median of ``--repeats``. Model: the built-in tiny Qwen2 (random init, 2 layers, hidden 64,
128k context) on CPU; transport: ``copy`` (in-process) or ``mooncake`` (two Mooncake
transfer engines over TCP loopback in this process).

    python benchmarks/kv_migration.py [--tokens 1024 8192 32768] [--repeats 3] [--transport mooncake]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time


async def _move_once(a, b, prompt, keep_kv: bool, transport) -> tuple[float, int]:
    from gyre_env.engines.base import SamplingParams
    from gyre_env.scheduler.migration import migrate

    await a.resume()
    params = SamplingParams(max_new_tokens=256, temperature=0.0)
    stream = a.stream(prompt, params)
    received = len((await anext(stream)).ids) + len((await anext(stream)).ids)
    t0 = time.perf_counter()
    report = await migrate(a, [b], keep_kv=keep_kv, window_s=600.0, transport=transport)
    while received <= report.produced[0]:  # tokens sampled on A before the move
        received += len((await anext(stream)).ids)
    seconds = time.perf_counter() - t0
    await stream.aclose()
    assert report.requests == 1 and report.with_kv == int(keep_kv)
    return seconds, report.kv_bytes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transport", choices=["copy", "mooncake"], default="copy")
    args = parser.parse_args(argv)

    import numpy as np

    from gyre_env.engines.embedded import EmbeddedEngine
    from gyre_env.scheduler.migration import CopyTransport, MooncakeTransport

    transport = MooncakeTransport() if args.transport == "mooncake" else CopyTransport()

    # no prefix cache: every repeat moves the same prompt, and B would otherwise answer a
    # re-prefill from the KV of the last repeat (it did, up to its 16k-token cache)
    a = EmbeddedEngine(name="a", max_batch_size=4, prefix_cache_tokens=0)
    b = EmbeddedEngine(name="b", max_batch_size=4, prefix_cache_tokens=0)
    rng = np.random.default_rng(0)
    print(f"model {a.model_path.name} on {a.device}; transport: {transport.name}")
    print(f"{'tokens':>7} {'KV MB':>7} {'migrate ms':>11} {'re-prefill ms':>14} {'ratio':>6}")
    try:
        for n in args.tokens:
            prompt = rng.integers(10, a.vocab_size, n).tolist()
            runs = {True: [], False: []}
            nbytes = 0
            for _ in range(args.repeats):
                for keep in (True, False):
                    seconds, sent = asyncio.run(_move_once(a, b, prompt, keep, transport))
                    runs[keep].append(seconds)
                    nbytes = max(nbytes, sent)
            mig, pre = statistics.median(runs[True]), statistics.median(runs[False])
            print(
                f"{n:>7} {nbytes / 1e6:>7.1f} {mig * 1e3:>11.1f} {pre * 1e3:>14.1f} "
                f"{pre / mig:>5.1f}x"
            )
    finally:
        a.close()
        b.close()


if __name__ == "__main__":
    main()
