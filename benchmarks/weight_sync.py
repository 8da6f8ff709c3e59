"""Weight-sync bandwidth per transport, as ratios to floors measured in the same run.

For each parameter set (``--params``, millions; fp32 and bf16) it times:
- floor ``copy``: ``dst.copy_(src)`` into preallocated tensors (memory bandwidth);
- floor ``socket``: the same bytes through a loopback TCP socket (one process, two threads);
- ``inprocess``: InProcessPublisher into an engine whose ``update_weights`` copies into its
  own parameters exactly as EmbeddedEngine's swap does (no model forward involved);
- ``gloo``: DistPublisher -> DistReceiver in another process (staged there);
- ``mooncake``: MooncakeReceiver here reading a MooncakePublisher in another process.
Targets: inprocess >= 0.7 x copy; gloo and mooncake >= 0.5 x socket. Prints, never asserts.

    python benchmarks/weight_sync.py --params 10 100 500
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import socket
import sys
import threading
import time

import torch

from gyre_env.weightsync import (
    DistPublisher,
    DistReceiver,
    DistSyncConfig,
    InProcessPublisher,
    MooncakePublisher,
    MooncakeReceiver,
    MooncakeSyncConfig,
)


def make_params(millions: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``millions`` M parameters in 4M-element tensors (a layer's matrices, roughly)."""
    n, size = millions * 1_000_000, 4_000_000
    return {
        f"layer{i}.weight": torch.ones(min(size, n - i * size), dtype=dtype)
        for i in range(-(-n // size))
    }


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def floor_copy(params: dict, repeats: int) -> float:
    dst = {k: torch.empty_like(v) for k, v in params.items()}
    return best(lambda: [dst[k].copy_(v) for k, v in params.items()], repeats)


def floor_socket(nbytes: int, repeats: int) -> float:
    src = torch.ones(nbytes, dtype=torch.uint8).numpy()
    dst = torch.empty(nbytes, dtype=torch.uint8).numpy()
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def once() -> None:
        sender = threading.Thread(
            target=lambda: socket.create_connection(("127.0.0.1", port)).sendall(src)
        )
        sender.start()
        conn, _ = server.accept()
        view, got = memoryview(dst), 0
        while got < nbytes:
            got += conn.recv_into(view[got:], min(nbytes - got, 1 << 22))
        conn.close()
        sender.join()

    return best(once, repeats)


class CopyEngine:
    """Engine stand-in: ``update_weights`` copies into its own tensors (EmbeddedEngine's swap)."""

    def __init__(self, params: dict):
        self.name, self.weight_version = "copy-engine", 0
        self.own = {k: torch.empty_like(v) for k, v in params.items()}

    async def update_weights(self, state, version):
        await asyncio.to_thread(lambda: [self.own[k].copy_(v) for k, v in state.items()])
        self.weight_version = version


def bench_inprocess(params: dict, repeats: int) -> float:
    publisher = InProcessPublisher([CopyEngine(params)])
    version = iter(range(1, 1000))
    return best(lambda: publisher.publish(params, next(version)), repeats)


def _gloo_receiver(port: int, rank: int, world: int, count: int) -> None:
    torch.set_num_threads(1)
    receiver = DistReceiver(DistSyncConfig(port=port, world_size=world, timeout_s=300), rank)
    after = None
    for _ in range(count):
        while asyncio.run(receiver.latest_version()) in (None, after):
            time.sleep(0.001)
        after, _ = asyncio.run(receiver.receive(after))


def bench_gloo(params: dict, repeats: int, port: int, receivers: int = 1) -> float:
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_gloo_receiver, args=(port, r, receivers + 1, repeats))
        for r in range(1, receivers + 1)
    ]
    publisher = DistPublisher(DistSyncConfig(port=port, world_size=receivers + 1, timeout_s=300))
    for p in procs:
        p.start()
    version = iter(range(1, 1000))
    try:
        return best(lambda: publisher.publish(params, next(version)), repeats)
    finally:
        for p in procs:
            p.join(timeout=60)


def _mooncake_publisher(port: int, millions: int, dtype: str, ready) -> None:
    publisher = MooncakePublisher(MooncakeSyncConfig(board_port=port, timeout_s=300))
    publisher.publish(make_params(millions, getattr(torch, dtype)), 1)
    ready.set()
    time.sleep(600)


def bench_mooncake(millions: int, dtype: torch.dtype, repeats: int, port: int) -> float:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    name = str(dtype).removeprefix("torch.")
    proc = ctx.Process(target=_mooncake_publisher, args=(port, millions, name, ready), daemon=True)
    proc.start()
    try:
        ready.wait(300)
        receiver = MooncakeReceiver(MooncakeSyncConfig(board_port=port, timeout_s=300))
        return best(lambda: asyncio.run(receiver.receive(None)), repeats)
    finally:
        proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, nargs="+", default=[10, 100, 500], help="millions")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=29750)
    parser.add_argument("--e2e-params", type=int, default=100, help="0 skips the 2-engine latency")
    args = parser.parse_args()
    port = iter(range(args.port, args.port + 1000))
    print(f"{'params':>7} {'dtype':>9} {'copy':>6} {'socket':>6} | {'inproc':>6} {'x copy':>6} | "
          f"{'gloo':>6} {'x sock':>6} | {'mooncake':>8} {'x sock':>6}   (GB/s)")  # fmt: skip
    for millions in args.params:
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            params = make_params(millions, dtype)
            nbytes = sum(t.numel() * t.element_size() for t in params.values())
            copy = gbps(nbytes, floor_copy(params, args.repeats))
            sock = gbps(nbytes, floor_socket(nbytes, args.repeats))
            inproc = gbps(nbytes, bench_inprocess(params, args.repeats))
            gloo = gbps(nbytes, bench_gloo(params, args.repeats, next(port)))
            moon = gbps(nbytes, bench_mooncake(millions, dtype, args.repeats, next(port)))
            print(f"{millions:>6}M {dtype_name:>9} {copy:6.2f} {sock:6.2f} | {inproc:6.2f} "
                  f"{inproc / copy:6.2f} | {gloo:6.2f} {gloo / sock:6.2f} | {moon:8.2f} "
                  f"{moon / sock:6.2f}", flush=True)  # fmt: skip
    if args.e2e_params:
        params = make_params(args.e2e_params, torch.bfloat16)
        seconds = bench_gloo(params, 1, next(port), receivers=2)
        print(f"end to end, {args.e2e_params}M bf16 params, 2 engine processes over gloo: "
              f"publish -> both staged {seconds:.2f}s")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
