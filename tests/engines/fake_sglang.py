"""A FAKE SGLang server: the request/response shapes of SGLang's native HTTP API, no model.

SGLang needs a GPU and cannot run on the CI machines, so SGLangEngine is tested against
this stand-in. It mirrors ``sglang/srt/entrypoints/http_server.py`` as of late 2025:
``/generate`` (``input_ids``, ``sampling_params``, ``return_logprob``, ``stream`` as SSE
``data:`` lines ending with ``data: [DONE]``; ``meta_info`` with ``output_token_logprobs``
``[logprob, id, None]``, ``completion_tokens``, ``finish_reason`` dicts, ``weight_version``
strings defaulting to ``"default"``), ``/pause_generation`` with ``mode``,
``/continue_generation``, ``/release_memory_occupation``, ``/resume_memory_occupation``,
``/update_weights_from_disk|tensor|distributed`` (``{"success", "message"}``, 400 on
failure), ``/init_weights_update_group``, ``/get_weight_version``, ``/get_model_info``,
``/v1/models`` and ``/health``. "Generation" is a deterministic function of the prompt.

Weight updates really move the bytes: ``/update_weights_from_tensor`` decodes the payload,
``/update_weights_from_disk`` reads the folder's safetensors, and
``/init_weights_update_group`` joins the caller's torch.distributed group (TCPStore +
PrefixStore(group_name) + gloo, as SGLang's ``init_custom_process_group``) as rank
``rank_offset``, so ``/update_weights_from_distributed`` receives each named tensor by
broadcast. What arrived is kept in ``state.received`` for tests to compare.

Test hooks (not SGLang's): ``POST /fake/fail_next`` makes the next ``/generate`` answer 500;
``POST /fake/ignore_updates`` makes updates answer success without loading (a failure mode
seen in the field); ``GET /fake/state`` returns what the fake received. Run as a program it serves the app
(``--model-path --host --port``), like ``python -m sglang.launch_server``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

VOCAB = 1000


@dataclass
class FakeState:
    context_length: int = 64
    incremental: bool = False
    """Mimic ``--incremental-streaming-output`` (deltas instead of cumulative lists)."""
    token_delay_s: float = 0.0
    weight_version: str = "default"
    paused: bool = False
    released: bool = False
    fail_next: bool = False
    ignore_updates: bool = False
    group: object = None
    """The torch.distributed group joined by ``/init_weights_update_group``."""
    resume: asyncio.Event | None = None
    received: dict = field(
        default_factory=lambda: {
            "pause_modes": [],
            "tensors": [],
            "distributed": [],
            "groups": [],
            "disk": [],
            "distributed_tensors": [],
        }
    )


def fake_tokens(prompt: list[int], n: int) -> list[tuple[int, float]]:
    """The fake's 'model': token i after ``prompt`` and its logprob."""
    base = sum(prompt)
    return [((base + 7 * i) % VOCAB, -0.01 * (i + 1)) for i in range(n)]


def make_app(state: FakeState | None = None) -> FastAPI:
    state = state or FakeState()
    app = FastAPI()
    app.state.fake = state

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake", "max_model_len": state.context_length}]}

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": state.weight_version}

    @app.get("/get_model_info")
    async def get_model_info():
        return {"model_path": "fake", "is_generation": True, "weight_version": state.weight_version}

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        if state.fail_next:
            state.fail_next = False
            return Response("Internal Server Error", status_code=500)
        if state.released:
            return error(400, "memory is released")
        ids, sp = body["input_ids"], body.get("sampling_params", {})
        if len(ids) >= state.context_length:
            return error(
                400,
                f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({state.context_length} tokens).",
            )
        steps = _plan(ids, sp)
        if body.get("stream"):
            return StreamingResponse(_stream(steps, body), media_type="text/event-stream")
        for _ in steps:
            await _gate()
        return _output(steps, len(steps), body, 0)

    def _plan(ids, sp) -> list[tuple[int, float, dict | None]]:
        max_new = int(sp.get("max_new_tokens", 128))
        stops = set(sp.get("stop_token_ids") or [])
        steps = []
        for token, logprob in fake_tokens(ids, max_new):
            steps.append((token, logprob, None))
            if token in stops:
                return steps[:-1] + [(token, logprob, {"type": "stop", "matched": token})]
        last = steps[-1]
        return steps[:-1] + [(last[0], last[1], {"type": "length", "length": max_new})]

    async def _gate():
        if state.token_delay_s:
            await asyncio.sleep(state.token_delay_s)
        while state.paused:
            await state.resume.wait()

    async def _stream(steps, body):
        for n in range(1, len(steps) + 1):
            await _gate()
            if state.paused is False and state.received.get("abort_now"):
                state.received["abort_now"] = False
                reason = {"type": "abort", "message": "Abort in running batch"}
                out = _output(steps, n - 1, body, n - 1 if state.incremental else 0, reason)
                yield b"data: " + json.dumps(out).encode() + b"\n\n"
                break
            out = _output(steps, n, body, n - 1 if state.incremental else 0)
            yield b"data: " + json.dumps(out).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def _output(steps, n, body, start, reason=None):
        done = steps[:n]
        entries = [[lp, tok, None] for tok, lp, _ in done[start:]]
        meta = {
            "id": "fake-rid",
            "finish_reason": reason or (done[-1][2] if done else None),
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": n,
            "cached_tokens": 0,
            "weight_version": state.weight_version,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = entries
        return {"text": "", "output_ids": [t for t, _, _ in done[start:]], "meta_info": meta}

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await request.json() if await request.body() else {}
        mode = body.get("mode", "abort")
        state.received["pause_modes"].append(mode)
        if mode == "abort":
            state.received["abort_now"] = True
        else:
            state.paused = True
            state.resume = asyncio.Event()
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        state.paused = False
        if state.resume is not None:
            state.resume.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/release_memory_occupation")
    async def release(request: Request):
        state.released = True
        return None

    @app.post("/resume_memory_occupation")
    async def resume(request: Request):
        state.released = False
        return None

    @app.post("/update_weights_from_disk")
    async def from_disk(request: Request):
        body = await request.json()
        if not Path(body.get("model_path", "")).is_dir():
            msg = (
                f"Failed to get weights iterator: {body.get('model_path')} (repository not found)."
            )
            return JSONResponse({"success": False, "message": msg, "num_paused_requests": 0}, 400)
        files = sorted(Path(body["model_path"]).glob("*.safetensors"))
        if files:
            from safetensors.torch import load_file

            loaded = {}
            for f in files:
                loaded.update(load_file(str(f)))
            state.received["disk"].append({"path": body["model_path"], "named": loaded})
        return _updated(body, {"num_paused_requests": 0})

    @app.post("/update_weights_from_tensor")
    async def from_tensor(request: Request):
        import torch

        body = await request.json()
        payloads = body["serialized_named_tensors"]
        named = torch.load(io.BytesIO(base64.b64decode(payloads[0])), weights_only=True)
        state.received["tensors"].append({"ranks": len(payloads), "named": named})
        return _updated(body)

    @app.post("/update_weights_from_distributed")
    async def from_distributed(request: Request):
        body = await request.json()
        if not state.received["groups"]:
            return JSONResponse({"success": False, "message": "no weight update group"}, 400)
        state.received["distributed"].append(body)
        if state.group is not None:
            try:
                named = await asyncio.to_thread(_receive_broadcast, state.group, body)
            except RuntimeError as e:
                return JSONResponse({"success": False, "message": str(e)}, 400)
            state.received["distributed_tensors"].append(named)
        return _updated(body)

    @app.post("/init_weights_update_group")
    async def init_group(request: Request):
        body = await request.json()
        state.received["groups"].append(body)
        if body.get("backend") == "gloo":
            try:
                state.group = await asyncio.to_thread(_join_group, body)
            except RuntimeError as e:
                return JSONResponse({"success": False, "message": str(e)}, 400)
        return {"success": True, "message": "Succeeded to initialize custom process group."}

    def _updated(body, extra=None):
        if state.ignore_updates:
            return {"success": True, "message": "Succeeded to update model weights."}
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            state.weight_version = body["weight_version"]
            message += f" Weight version updated to {state.weight_version}."
        return {"success": True, "message": message, **(extra or {})}

    @app.post("/fake/ignore_updates")
    async def ignore_updates():
        state.ignore_updates = True
        return {}

    @app.post("/fake/fail_next")
    async def fail_next():
        state.fail_next = True
        return {}

    @app.get("/fake/state")
    async def fake_state():
        return {
            "weight_version": state.weight_version,
            "paused": state.paused,
            "released": state.released,
        }

    return app


def _join_group(body: dict):
    """Join the trainer's group as SGLang does (rank ``rank_offset``; one rank: no TP)."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=30)
    store = dist.TCPStore(
        body["master_address"], int(body["master_port"]), None, False, timeout=timeout
    )
    prefixed = dist.PrefixStore(body["group_name"], store)
    return dist.ProcessGroupGloo(
        prefixed, int(body["rank_offset"]), int(body["world_size"]), timeout
    )


def _receive_broadcast(group, body: dict) -> dict:
    """Receive each named tensor broadcast from rank 0, in the request's order."""
    import torch
    import torch.distributed as dist

    named = {}
    for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True):
        tensor = torch.empty(shape, dtype=getattr(torch, dtype))
        group.broadcast([tensor], dist.BroadcastOptions()).wait()
        named[name] = tensor
    return named


def test_serializer(named_tensors: list) -> str:
    """Stands in for SGLang's MultiprocessingSerializer: torch.save, base64."""
    import torch

    buf = io.BytesIO()
    torch.save(dict(named_tensors), buf)
    return base64.b64encode(buf.getvalue()).decode()


test_serializer.__test__ = False  # not a pytest test


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--context-length", type=int, default=64)
    args = parser.parse_args()
    uvicorn.run(
        make_app(FakeState(context_length=args.context_length)),
        host=args.host,
        port=args.port,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
