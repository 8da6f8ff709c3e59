"""The proxy's own cost, side by side with a bare uvicorn endpoint, in one run.

    python benchmarks/proxy.py [--duration 5] [--contexts 1000 32000 128000] [--no-engine]

Each server runs in its own process on the same uvicorn settings. The proxy serves an
engine that answers instantly (``ScriptedEngine``, a fixed 10-token reply) and writes
records to a JSONL sink. Two baselines return a fixed chat completion (or the same SSE
events when streaming): ``bare``, a lean Starlette-style route that parses the body with
orjson and sends fixed bytes (the strict baseline), and ``fastapi``, the idiomatic FastAPI
route (``body: dict`` in, a dict out) that the issue's ~1,500 req/s figure describes. The load
generator is ``wrk`` (apt-get install wrk) with a Lua script giving every request its own
session path and its own user text, so each proxy call is a session's first call: it
renders its prompt and tokenizes the new user turn (the repeated system turn comes from
the renderer's piece cache, as it would across episodes). Figures printed:

- added latency at one connection, p50 and p99 (proxy minus bare);
- throughput at 16 and 128 connections, streaming and not, as a ratio of the bare one;
- added latency of one more turn in a session whose context is 1k / 32k / 128k tokens
  (sequential keep-alive client; the same body sent to both servers);
- the embedded engine's tokens/s for the tiny model at batch 1 and 8 (not with --no-engine).

Prints figures and ratios, not pass/fail. On a shared 2-core machine figures are noisy:
the load average is printed with them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPLY = "Hello! How can I help you today?"
BODY = {
    "model": "m",
    "max_tokens": 16,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello, what can you do?"},
    ],
}


# -- servers (run in child processes) ------------------------------------------------------
def serve_proxy(port: int, records: str) -> None:
    from gyre_env.engines.tiny import load_tokenizer
    from gyre_env.proxy.records import JsonlSink
    from gyre_env.proxy.scripted import ScriptedEngine
    from gyre_env.proxy.server import ProxyConfig, ProxyServer

    tok = load_tokenizer()
    reply = tok.backend_tokenizer.encode(REPLY + "<|im_end|>", add_special_tokens=False).ids
    engine = ScriptedEngine([reply], name="instant", context_length=262144, record_prompts=False)
    config = ProxyConfig(port=port, max_sessions=4096)
    ProxyServer(
        config, engines=[engine], tokenizer=tok, sink=JsonlSink(records, compact=True)
    ).serve()


def serve_fastapi(port: int) -> None:
    """The same fixed answer from an idiomatic FastAPI route (``body: dict`` in, dict out)."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    completion = json.loads(_fixed_completion())
    chunks = _fixed_chunks()

    async def events():
        for c in chunks:
            yield c

    @app.post("/v1/chat/completions")
    @app.post("/s/{session}/v1/chat/completions")
    async def chat(body: dict):
        if body.get("stream"):
            return StreamingResponse(events(), media_type="text/event-stream")
        return completion

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
    )


def _fixed_completion() -> str:
    message = {"role": "assistant", "content": REPLY}
    return json.dumps(
        {
            "id": "chatcmpl-bare",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
            ],
            "usage": {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40},
        }
    )


def _fixed_chunks() -> list[bytes]:
    head = {"id": "chatcmpl-bare", "object": "chat.completion.chunk", "created": 0, "model": "m"}

    def chunk(delta, finish=None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"

    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": REPLY}),
        chunk({}, "stop") + b"data: [DONE]\n\n",
    ]


def serve_bare(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse

    try:
        import orjson

        loads = orjson.loads
    except ImportError:  # pragma: no cover
        loads = json.loads

    app = FastAPI()
    completion = _fixed_completion().encode()
    chunks = _fixed_chunks()

    async def events():
        for c in chunks:
            yield c

    async def chat(request: Request):
        body = loads(await request.body())
        if body.get("stream"):
            return StreamingResponse(events(), media_type="text/event-stream")
        return Response(completion, media_type="application/json")

    app.add_route("/v1/chat/completions", chat, methods=["POST"])
    app.add_route("/s/{session}/v1/chat/completions", chat, methods=["POST"])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
    )


# -- measurement ----------------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(kind: str, port: int, tmp: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        __file__,
        "--serve",
        kind,
        "--port",
        str(port),
        "--records",
        str(tmp / "records.jsonl"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            _post(port, "/s/warm/v1/chat/completions", json.dumps(BODY).encode())
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{kind} server exited: {proc.stderr.read().decode()[-2000:]}"
                ) from None
            time.sleep(0.2)
    raise RuntimeError(f"{kind} server did not start")


_CONNS: dict[int, http.client.HTTPConnection] = {}


def _post(port: int, path: str, body: bytes) -> bytes:
    try:
        return _post_once(port, path, body)
    except (ConnectionError, http.client.RemoteDisconnected):  # an idle keep-alive was closed
        return _post_once(port, path, body)


def _post_once(port: int, path: str, body: bytes) -> bytes:
    conn = _CONNS.get(port)
    if conn is None:
        conn = _CONNS[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body, {"content-type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException):
        _CONNS.pop(port, None)
        conn.close()
        raise
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")
    return data


_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local head, tail = %s, %s
local n = 0
local prefix = tostring(math.random(1, 1000000000))
request = function()
  n = n + 1
  local path = "/s/b" .. prefix .. "-" .. n .. "/v1/chat/completions"
  return wrk.format(nil, path, nil, head .. prefix .. "-" .. n .. tail)
end
"""


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _lua_script(stream: bool) -> str:
    """Every request has its own session and its own user text (the system turn repeats)."""
    marker = "@@N@@"
    body = {**BODY, "stream": stream}
    body["messages"] = [
        *BODY["messages"][:-1],
        {"role": "user", "content": f"Hello, what can you do? ({marker})"},
    ]
    head, tail = json.dumps(body).split(marker)
    return _LUA % (_lua_string(head), _lua_string(tail))


def wrk(port: int, connections: int, duration: float, stream: bool, tmp: Path) -> dict:
    script = tmp / f"body-{int(stream)}.lua"
    script.write_text(_lua_script(stream))
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(duration))}s",
            "--latency",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {p: _ms(v) for p, v in re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M)}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"wrk saw {errors.group(1)} error responses:\n{out}")
    return {"rps": rps, "p50_ms": lat.get("50"), "p99_ms": lat.get("99")}


def _ms(value: str) -> float:
    num, unit = re.match(r"([\d.]+)(\w+)", value).groups()
    return float(num) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def _conversation(tok, tokens: int) -> list[dict]:
    """A system prompt and alternating turns of corpus text totalling about ``tokens``."""
    from importlib import resources

    words = (
        resources.files("gyre_env.engines").joinpath("tiny_corpus.txt").read_text("utf-8").split()
    )
    msgs = [{"role": "system", "content": "You are a coding agent."}]
    total, k = 0, 0
    while total < tokens - 400:
        text = " ".join(words[(k * 131 + j) % len(words)] for j in range(min(300, tokens // 4)))
        msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": text})
        total += len(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids) + 5
        k += 1
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": "Go on."})
    return msgs


def per_turn(
    proxy_port: int, bare_port: int, contexts: list[int], sessions: int, turns: int
) -> dict:
    from gyre_env.engines.tiny import load_tokenizer

    tok = load_tokenizer()
    out = {}
    for n in contexts:
        base = _conversation(tok, n)
        proxy_ms, bare_ms, prompt_tokens = [], [], []
        for s in range(sessions):
            path = f"/s/turn-{n}-{s}-{os.getpid()}/v1/chat/completions"
            msgs = list(base)
            reply = json.loads(
                _post(proxy_port, path, json.dumps({"model": "m", "messages": msgs}).encode())
            )
            for t in range(turns):
                msgs += [
                    reply["choices"][0]["message"],
                    {"role": "user", "content": f"Now step {t}."},
                ]
                body = json.dumps({"model": "m", "messages": msgs}).encode()
                t0 = time.perf_counter()
                raw = _post(proxy_port, path, body)
                proxy_ms.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                _post(bare_port, path, body)
                bare_ms.append((time.perf_counter() - t0) * 1e3)
                reply = json.loads(raw)
                prompt_tokens.append(reply["usage"]["prompt_tokens"])
        p, b = statistics.median(proxy_ms), statistics.median(bare_ms)
        out[n] = {
            "prompt_tokens": int(statistics.median(prompt_tokens)),
            "proxy_ms": p,
            "bare_ms": b,
            "added_ms": p - b,
            "proxy_min_ms": min(proxy_ms),
            "bare_min_ms": min(bare_ms),
            "added_min_ms": min(proxy_ms) - min(bare_ms),
            "samples": len(proxy_ms),
        }
    return out


def run(args: argparse.Namespace) -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    tmp = Path(tempfile.mkdtemp(prefix="gyre-proxy-bench-"))
    ports = {name: _free_port() for name in ("proxy", "bare", "fastapi")}
    procs = [_start(name, port, tmp) for name, port in ports.items()]
    proxy_port, bare_port = ports["proxy"], ports["bare"]
    try:
        print(f"load average before: {os.getloadavg()[0]:.2f} (2-core machines: expect noise)")
        print(
            "bare = lean Starlette route (orjson, fixed bytes); fastapi = idiomatic FastAPI route"
        )
        for port in ports.values():  # warm-up
            wrk(port, 4, 1, False, tmp)
        lat = {name: wrk(port, 1, args.duration, False, tmp) for name, port in ports.items()}
        print("\n== one connection, non-streaming (wrk) ==")
        for name, r in lat.items():
            print(
                f"{name:8s} p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  {r['rps']:,.0f} req/s"
            )
        for base in ("bare", "fastapi"):
            print(
                f"added vs {base:8s} p50 {lat['proxy']['p50_ms'] - lat[base]['p50_ms']:+.3f} ms  "
                f"p99 {lat['proxy']['p99_ms'] - lat[base]['p99_ms']:+.3f} ms  (target p50 <= 1 ms)"
            )
        print("\n== throughput (wrk, req/s; ratio = proxy / baseline, target >= 0.60) ==")
        for conns in (16, 128):
            for stream in (False, True):
                r = {
                    name: wrk(port, conns, args.duration, stream, tmp)["rps"]
                    for name, port in ports.items()
                }
                kind = "stream" if stream else "plain"
                print(
                    f"{conns:4d} conns {kind:6s}  proxy {r['proxy']:7,.0f}  bare {r['bare']:7,.0f} "
                    f"(ratio {r['proxy'] / r['bare']:.2f})  fastapi {r['fastapi']:7,.0f} "
                    f"(ratio {r['proxy'] / r['fastapi']:.2f})"
                )
        print("\n== one more turn at context N (median of sequential calls) ==")
        turns = per_turn(proxy_port, bare_port, args.contexts, args.sessions, args.turns)
        for r in turns.values():
            print(
                f"context {r['prompt_tokens']:7,d} tokens  median: proxy {r['proxy_ms']:6.2f} "
                f"bare {r['bare_ms']:6.2f} added {r['added_ms']:6.2f} ms   best: proxy "
                f"{r['proxy_min_ms']:6.2f} bare {r['bare_min_ms']:6.2f} added {r['added_min_ms']:6.2f} ms"
                f"   ({r['samples']} calls)"
            )
        first, last = turns[args.contexts[0]], turns[args.contexts[-1]]
        for stat, label in (("added_ms", "median"), ("added_min_ms", "best")):
            ratio = last[stat] / max(first[stat], 1e-3)
            print(
                f"added latency ({label}) {args.contexts[-1]} vs {args.contexts[0]}: {ratio:.2f}x  (target <= 2x)"
            )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.no_engine:
        from gyre_env.engines.throughput import measure_embedded_throughput

        print("\n== embedded engine (tiny model, greedy, 64 prompt + 64 new tokens) ==")
        print(measure_embedded_throughput(batch_sizes=(1, 8), repeats=2).summary())
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1000, 32000, 128000])
    parser.add_argument("--sessions", type=int, default=4, help="sessions per context size")
    parser.add_argument("--turns", type=int, default=10, help="timed turns per session")
    parser.add_argument("--no-engine", action="store_true", help="skip the embedded engine figures")
    parser.add_argument("--serve", choices=["proxy", "bare", "fastapi"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve == "proxy":
        serve_proxy(args.port, args.records)
    elif args.serve == "bare":
        serve_bare(args.port)
    elif args.serve == "fastapi":
        serve_fastapi(args.port)
    else:
        run(args)


if __name__ == "__main__":
    main()
