"""Weight-sync bandwidth per transport, as ratios to floors measured in the same run.

For each parameter set (``--params``, millions, in 4M-element tensors; fp32 and bf16):
- floor ``copy``: ``dst.copy_(src)`` of every tensor into preallocated memory;
- floor ``socket``: the same bytes, tensor by tensor, through a connected loopback TCP
  socket into one preallocated flat buffer in another process, until it acknowledges
  (the copies gloo and Mooncake make: user -> kernel -> user, none more);
- ``inprocess``: InProcessPublisher into an engine whose worker thread copies into its
  own tensors, as EmbeddedEngine's swap does (no model forward involved);
- ``gloo``: DistPublisher -> DistReceiver in another process, until it confirms staging;
- ``mooncake``: MooncakeReceiver here reading a MooncakePublisher's region in another
  process over TCP.
Every round times all five in turn, the order rotating each round and a short pause
before each (a shared machine's load, and the CPU the previous case leaves busy, hit
them alike), after a warm-up round; the table shows medians. Targets: inprocess >= 0.7 x copy; gloo and
mooncake >= 0.5 x socket. Then the end-to-end latency: from "train step done" (the
trainer calls publish) until every one of 2 EmbeddedEngine processes serves the new
version of a ~100M-parameter model (its swap returned; checked by a generation that
carries the version). Prints, never asserts.

    python benchmarks/weight_sync.py --params 10 100 500 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing as mp
import queue
import socket
import statistics
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

TIMEOUT_S = 600
SETTLE_S = 0.02
"""Pause before each timed case: the previous case's peer processes finish their turn
(a receiver re-arming for the next version) before the next measurement starts."""


def make_params(millions: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``millions`` M parameters in 4M-element tensors (a layer's matrices, roughly)."""
    n, size = millions * 1_000_000, 4_000_000
    return {
        f"layer{i}.weight": torch.full((min(size, n - i * size),), 1.5, dtype=dtype)
        for i in range(-(-n // size))
    }


def nbytes_of(params: dict) -> int:
    return sum(t.numel() * t.element_size() for t in params.values())


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class CopyFloor:
    """``copy_`` of every tensor into views of one preallocated flat buffer."""

    def __init__(self, params: dict, flat: torch.Tensor):
        self.params, self.dst, at = params, {}, 0
        for k, v in params.items():
            n = v.numel() * v.element_size()
            self.dst[k] = flat[at : at + n].view(v.dtype)
            at += n

    def __call__(self) -> None:
        for k, v in self.params.items():
            self.dst[k].copy_(v)


def _socket_sink(port: int, nbytes: int) -> None:
    """The socket floor's other process: receive each round into one preallocated flat
    buffer, then acknowledge (as a receiver confirms a version)."""
    conn = socket.create_connection(("127.0.0.1", port))
    dst = memoryview(torch.zeros(nbytes, dtype=torch.uint8).numpy())
    while True:
        got = 0
        while got < nbytes:
            n = conn.recv_into(dst[got:], nbytes - got)
            if not n:
                return
            got += n
        conn.sendall(b"k")


class SocketFloor:
    """The same bytes, tensor by tensor, through a loopback TCP connection into a flat
    buffer in another process, until it acknowledges: the copies gloo and Mooncake make
    (user -> kernel -> user) and no more."""

    def __init__(self, params: dict):
        server = socket.create_server(("127.0.0.1", 0))
        self.sink = mp.get_context("spawn").Process(
            target=_socket_sink, args=(server.getsockname()[1], nbytes_of(params)), daemon=True
        )
        self.sink.start()
        server.settimeout(TIMEOUT_S)
        self.tx, _ = server.accept()
        server.close()
        self.src = [memoryview(t.reshape(-1).view(torch.uint8).numpy()) for t in params.values()]

    def __call__(self) -> None:
        for view in self.src:
            self.tx.sendall(view)
        if self.tx.recv(1) != b"k":
            raise RuntimeError("the socket floor's receiver went away")

    def close(self) -> None:
        self.tx.close()
        self.sink.join(timeout=30)


class CopyEngine:
    """Engine stand-in with EmbeddedEngine's swap: a persistent worker thread copies the
    state into the engine's own tensors while the caller awaits a future."""

    def __init__(self, own: dict):
        self.name, self.weight_version = "copy-engine", 0
        self.own = own  # the copy floor's destination (never timed at the same time)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._work, daemon=True).start()

    def _work(self) -> None:
        while True:
            state, future = self._jobs.get()
            if future.set_running_or_notify_cancel():
                with torch.no_grad():
                    for k, v in state.items():
                        self.own[k].copy_(v)
                future.set_result(None)

    async def update_weights(self, state, version):
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((state, future))
        await asyncio.wrap_future(future)
        self.weight_version = version


def _gloo_receiver(port: int, rank: int, world: int, count: int) -> None:
    torch.set_num_threads(1)
    receiver = DistReceiver(DistSyncConfig(port=port, world_size=world, timeout_s=TIMEOUT_S), rank)

    async def follow() -> None:
        while await receiver.latest_version() is None:
            await asyncio.sleep(0.005)
        after = None
        for _ in range(count):
            # blocks in the header broadcast until the next publish: no polling that
            # would take CPU from the other measurements on a 2-core machine
            after, _ = await receiver.receive(after)

    asyncio.run(follow())


def _mooncake_publisher(port: int, millions: int, dtype: str, ready) -> None:
    publisher = MooncakePublisher(MooncakeSyncConfig(board_port=port, timeout_s=TIMEOUT_S))
    publisher.publish(make_params(millions, getattr(torch, dtype)), 1)
    ready.set()  # the packed region is all that is read; the params can go
    time.sleep(3600)


class Transports:
    """The three transports set up once per parameter set, each timed by a call."""

    def __init__(self, params: dict, own: dict, millions: int, dtype: str, rounds: int, ports):
        ctx = mp.get_context("spawn")
        self.inproc = InProcessPublisher([CopyEngine(own)])
        gloo_port, moon_port = next(ports), next(ports)
        self.gloo_peer = ctx.Process(target=_gloo_receiver, args=(gloo_port, 1, 2, rounds))
        self.gloo = DistPublisher(DistSyncConfig(port=gloo_port, timeout_s=TIMEOUT_S))
        self.gloo_peer.start()
        ready = ctx.Event()
        args = (moon_port, millions, dtype, ready)
        self.moon_peer = ctx.Process(target=_mooncake_publisher, args=args, daemon=True)
        self.moon_peer.start()
        if not ready.wait(TIMEOUT_S):
            raise RuntimeError("the Mooncake publisher did not start")
        config = MooncakeSyncConfig(board_port=moon_port, timeout_s=TIMEOUT_S)
        self.moon = MooncakeReceiver(config)
        self.loop = asyncio.new_event_loop()
        self.params, self.versions = params, iter(range(1, 1 << 30))

    def inprocess(self) -> None:
        self.inproc.publish(self.params, next(self.versions))

    def gloo_publish(self) -> None:
        self.gloo.publish(self.params, next(self.versions))

    def mooncake_read(self) -> None:
        self.loop.run_until_complete(self.moon.receive(None))

    def close(self) -> None:
        self.gloo_peer.join(timeout=60)
        self.moon_peer.kill()
        self.moon.close()
        self.gloo.close()
        self.inproc.close()
        self.loop.close()


def measure(millions: int, dtype_name: str, repeats: int, ports) -> dict[str, float]:
    """Median GB/s of each floor and transport over ``repeats`` interleaved rounds."""
    params = make_params(millions, getattr(torch, dtype_name))
    nbytes = nbytes_of(params)
    copy = CopyFloor(params, torch.empty(nbytes, dtype=torch.uint8))
    sock = SocketFloor(params)
    repeats = min(10 * repeats, max(repeats, repeats * 100 // millions))  # small ones: more
    t = Transports(params, copy.dst, millions, dtype_name, repeats + 1, ports)
    cases = {
        "copy": copy,
        "socket": sock,
        "inproc": t.inprocess,
        "gloo": t.gloo_publish,
        "mooncake": t.mooncake_read,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    order = list(cases)
    try:
        for round_ in range(repeats + 1):  # round 0 warms pages, pools, connections
            for name in order:
                time.sleep(SETTLE_S)  # the previous case's peers go idle first
                seconds = timed(cases[name])
                if round_:
                    times[name].append(seconds)
            order = order[1:] + order[:1]  # each case follows each other one in turn
    finally:
        t.close()
        sock.close()
    return {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}


def row(millions: int, dtype: str, g: dict[str, float]) -> str:
    c, s = g["copy"], g["socket"]
    return (
        f"{millions:>6}M {dtype:>9} {c:6.2f} {s:6.2f} | {g['inproc']:6.2f} "
        f"{g['inproc'] / c:5.2f} | {g['gloo']:6.2f} {g['gloo'] / c:5.2f} {g['gloo'] / s:5.2f} | "
        f"{g['mooncake']:8.2f} {g['mooncake'] / c:5.2f} {g['mooncake'] / s:5.2f}"
    )


HEADER = (
    f"{'params':>7} {'dtype':>9} {'copy':>6} {'socket':>6} | {'inproc':>6} {'xcopy':>5} | "
    f"{'gloo':>6} {'xcopy':>5} {'xsock':>5} | {'mooncake':>8} {'xcopy':>5} {'xsock':>5}  (GB/s)"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, nargs="+", default=[10, 100, 500], help="millions")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed rounds (median); x100/M under 100M params"
    )
    parser.add_argument("--port", type=int, default=29750)
    parser.add_argument("--e2e-params", type=int, default=100, help="0 skips the 2-engine latency")
    parser.add_argument("--e2e-repeats", type=int, default=3)
    args = parser.parse_args()
    ports = iter(range(args.port, args.port + 1000))
    print(HEADER, flush=True)
    for millions in args.params:
        for dtype_name in args.dtypes:
            print(row(millions, dtype_name, measure(millions, dtype_name, args.repeats, ports)),
                  flush=True)  # fmt: skip
    if args.e2e_params:
        end_to_end(args.e2e_params, args.e2e_repeats, next(ports))


# ---- end to end: train step done -> every engine serves the new version -------------------


def e2e_model(millions: int, folder) -> str:
    """A Qwen2-shaped model of about ``millions`` M parameters (the tiny model's recipe)."""
    from gyre_env.engines.tiny import TinyModelConfig, build_tiny_model

    per_layer = 2 * 768 * 768 + 2 * 768 * 256 + 3 * 768 * 2048  # q,o; k,v (4 kv heads); MLP
    layers = max(1, round((millions * 1_000_000 - 4096 * 768) / per_layer))
    config = TinyModelConfig(
        hidden_size=768, intermediate_size=2048, num_layers=layers, num_heads=12,
        num_kv_heads=4, initializer_range=0.02,
    )  # fmt: skip
    return str(build_tiny_model(folder, config))


def _e2e_engine(folder: str, port: int, rank: int, world: int, told, out, count: int) -> None:
    from gyre_env.engines.base import SamplingParams
    from gyre_env.engines.embedded import EmbeddedEngine
    from gyre_env.weightsync import EngineFollower

    engine = EmbeddedEngine(model_path=folder, dtype="bfloat16", num_threads=1, name=f"e{rank}")
    config = DistSyncConfig(port=port, world_size=world, timeout_s=TIMEOUT_S)
    follower = EngineFollower(engine, DistReceiver(config, rank), config=config)
    one = SamplingParams(max_new_tokens=1, temperature=0.0)

    async def follow() -> None:
        out.put(("ready", rank, 0.0))
        while engine.weight_version < count:
            newest = await asyncio.to_thread(told.get)  # told a version exists (no polling)
            while engine.weight_version < newest:  # pull it and swap it in
                if await follower.notify(newest) is None:
                    await asyncio.sleep(0.0005)  # told before the board shows it
            served = time.time()  # from here on every new request samples `newest`
            result = await engine.generate([5, 17, 42], one)
            assert result.weight_version == newest, (result.weight_version, newest)
            out.put((newest, rank, served))

    asyncio.run(follow())
    engine.close()


def end_to_end(millions: int, repeats: int, port: int, engines: int = 2) -> None:
    import tempfile

    import transformers

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        folder = e2e_model(millions, tmp)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        named = [(n, p.detach()) for n, p in model.named_parameters()]
        count = sum(p.numel() for _, p in named)
        publisher = DistPublisher(
            DistSyncConfig(port=port, world_size=engines + 1, timeout_s=TIMEOUT_S)
        )
        out, told = ctx.Queue(), [ctx.Queue() for _ in range(engines)]
        procs = [
            ctx.Process(
                target=_e2e_engine,
                args=(folder, port, r, engines + 1, told[r - 1], out, repeats + 1),
            )
            for r in range(1, engines + 1)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            assert out.get(timeout=TIMEOUT_S)[0] == "ready"
        totals, staged = [], []
        for version in range(1, repeats + 2):  # version 1 forms the group: a warm-up
            with torch.no_grad():
                for _, p in named:  # the train step: new weights in place
                    p.mul_(1.0001)
            start = time.time()  # the train step is done
            for q in told:
                q.put(version)  # checkpoint-engine's pattern: tell the engines, they pull
            publisher.publish(named, version)  # returns once every engine has it staged
            staged.append(time.time() - start)
            served = [out.get(timeout=TIMEOUT_S) for _ in procs]
            assert all(v == version for v, _, _ in served), served
            totals.append(max(t for _, _, t in served) - start)
        first, totals, staged = totals[0], totals[1:], staged[1:]
        for p in procs:
            p.join(timeout=60)
        publisher.close()
    print(
        f"end to end, {count / 1e6:.0f}M bf16 params, {engines} EmbeddedEngine processes over "
        f"gloo: step done -> all staged {statistics.median(staged):.2f}s, -> all serving the "
        f"new version {statistics.median(totals):.2f}s (median of {repeats}; "
        f"each: {', '.join(f'{t:.2f}' for t in totals)}; the first version, which also "
        f"forms the group: {first:.2f}s)",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
