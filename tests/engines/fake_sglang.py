"""A FAKE SGLang server: SGLang's native HTTP API, request and response shapes as of
SGLang v0.5.6 (the ``sglang>=0.5.6,<0.6`` of Gyre's ``sglang`` extra), read from
``python/sglang/srt/entrypoints/http_server.py`` and ``python/sglang/srt/managers/io_struct.py``
of SGLang's repository: ``PauseGenerationReqInput.mode`` (``abort`` | ``retract`` |
``in_place``, default ``abort``) is what sets 0.5.6 apart from 0.5.5, whose
``/pause_generation`` took no body.

SGLang needs a GPU and cannot run on the CI machines, so SGLangEngine and ``gyre train``
with ``rollout.engine = "sglang"`` are tested against this stand-in. The shapes:
``/generate`` (``input_ids``, ``sampling_params``, ``return_logprob``, ``stream`` as SSE
``data:`` lines ending with ``data: [DONE]``; ``meta_info`` with ``output_token_logprobs``
``[logprob, id, None]``, ``completion_tokens``, ``finish_reason`` dicts such as
``{"type": "length", "length": n}``, ``weight_version`` strings defaulting to
``"default"``), ``/pause_generation`` with ``PauseGenerationReqInput.mode`` (``abort``:
running requests end with ``{"type": "abort"}`` and what they produced, and new ones
wait, as everything does while paused, until ``/continue_generation``; ``in_place``:
running requests hold), ``/release_memory_occupation`` and ``/resume_memory_occupation``
(``tags``), ``/update_weights_from_disk|tensor|distributed`` (``{"success", "message"}``,
400 on failure; ``weight_version`` moves only on success), ``/init_weights_update_group``,
``/get_weight_version``, ``/get_model_info`` (``model_path``, ``tokenizer_path``,
``is_generation``, ``preferred_sampling_params``, ``weight_version``), ``/flush_cache``,
``/v1/models`` (``max_model_len``) and ``/health``.

Two ways to "generate":
- no model (``FakeState()``): a deterministic function of the prompt (``fake_tokens``);
- ``FakeState(model_path=...)``: real tokens and logprobs of that Hugging Face folder,
  sampled by Gyre's embedded engine in this process, so that a test of exactness checks
  real numbers. Weight updates then really load into that engine (disk: the folder;
  tensor: each bucket over the current weights; distributed: the broadcast tensors),
  release/resume really free and restore it, and every answered request is kept in
  ``state.received["generated"]`` (``input_ids``, ``output_ids``, ``logprobs``,
  ``weight_version``, ``finish``). Deviation: ``in_place`` holds a request's output, not
  the engine's decoding.

Weight updates always move the bytes: ``/update_weights_from_tensor`` decodes the payload
(``test_serializer``'s format; SGLang's passes CUDA IPC handles), ``/update_weights_from_disk``
reads the folder's safetensors, and ``/init_weights_update_group`` joins the caller's
torch.distributed group (TCPStore + PrefixStore(group_name) + gloo, as SGLang's
``init_custom_process_group``) as rank ``rank_offset``, so ``/update_weights_from_distributed``
receives each named tensor by broadcast. What arrived is kept in ``state.received``.

Test hooks (not SGLang's): ``POST /fake/fail_next`` makes the next ``/generate`` answer
500; ``POST /fake/ignore_updates`` makes updates answer success without loading (a failure
mode seen in the field); ``POST /fake/fail_updates`` makes the next N updates answer 400;
``GET /fake/state`` returns what the fake received. Run as a program it serves the app
(``--model-path --host --port``, plus ``--serve-model`` for the real-model mode), like
``python -m sglang.launch_server``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
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
    fail_updates: int = 0
    """The next this many weight updates answer 400 (``success: false``)."""
    model_path: str | None = None
    """Serve this Hugging Face folder's real tokens and logprobs (Gyre's embedded engine)."""
    engine: object = None
    weights: dict | None = None
    """Model mode: the weights being served (tensor buckets land over them)."""
    abort_epoch: int = 0
    """Bumped by ``/pause_generation`` ``mode: abort``: running requests end."""
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
            "generated": [],
        }
    )

    def start_model(self, max_batch_size: int = 8) -> None:
        """Model mode: load ``model_path`` into an embedded engine (``context_length`` its)."""
        from safetensors.torch import load_file

        from gyre_env.engines.embedded import EmbeddedEngine

        self.engine = EmbeddedEngine(
            model_path=self.model_path, name="fake-sglang", max_batch_size=max_batch_size,
            context_length=self.context_length,
        )  # fmt: skip
        self.weights = {}
        for f in sorted(Path(self.model_path).glob("*.safetensors")):
            self.weights.update(load_file(str(f)))

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def fake_tokens(prompt: list[int], n: int) -> list[tuple[int, float]]:
    """The fake's 'model' without a model: token i after ``prompt`` and its logprob."""
    base = sum(prompt)
    return [((base + 7 * i) % VOCAB, -0.01 * (i + 1)) for i in range(n)]


def _params(sp: dict):
    """SGLang ``sampling_params`` -> Gyre's ``SamplingParams`` (model mode)."""
    from gyre_env.engines.base import SamplingParams

    return SamplingParams(
        max_new_tokens=int(sp.get("max_new_tokens", 128)),
        temperature=float(sp.get("temperature", 1.0)),
        top_p=float(sp.get("top_p", 1.0)),
        top_k=int(sp.get("top_k", -1)),
        min_p=float(sp.get("min_p", 0.0)),
        stop_token_ids=list(sp.get("stop_token_ids") or []),
        seed=sp.get("sampling_seed"),
    )


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
        return {
            "model_path": state.model_path or "fake",
            "tokenizer_path": state.model_path or "fake",
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": state.weight_version,
        }

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return Response("Cache flushed.\n", status_code=200)

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        if state.fail_next:
            state.fail_next = False
            return Response("Internal Server Error", status_code=500)
        await _gate()  # a paused server holds new requests until continued
        if state.released:
            return error(400, "memory is released")
        ids, sp = body["input_ids"], body.get("sampling_params", {})
        if len(ids) >= state.context_length:
            return error(
                400,
                f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({state.context_length} tokens).",
            )
        steps = _model_steps(ids, sp) if state.engine is not None else _planned(ids, sp)
        if body.get("stream"):
            return StreamingResponse(_stream(steps, body), media_type="text/event-stream")
        last: tuple = ([], None)
        async for last in _run(steps, ids):  # noqa: B007 - the last step is the answer
            pass
        done, reason = last
        return _output(done, len(done), body, 0, reason)

    async def _planned(ids, sp):
        """(token, logprob, finish reason or None) of the deterministic fake."""
        max_new = int(sp.get("max_new_tokens", 128))
        stops = set(sp.get("stop_token_ids") or [])
        plan = fake_tokens(ids, max_new)
        for i, (token, logprob) in enumerate(plan):
            await _delay()
            if token in stops:
                yield token, logprob, {"type": "stop", "matched": token}
                return
            last = i == len(plan) - 1
            yield token, logprob, {"type": "length", "length": max_new} if last else None

    async def _model_steps(ids, sp):
        """(token, logprob, finish reason or None) sampled by the embedded engine."""
        params = _params(sp)
        pending = None
        stream = state.engine.stream(ids, params)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                for token, logprob in zip(chunk.ids, chunk.logprobs, strict=True):
                    if pending is not None:
                        yield (*pending, None)
                    pending = (token, logprob)
                    await _delay()
                if chunk.finish_reason is not None:
                    if chunk.finish_reason == "stop":
                        reason = {"type": "stop", "matched": pending[0]}
                    else:
                        reason = {"type": "length", "length": params.max_new_tokens}
                    yield (*pending, reason)
                    return

    async def _run(steps, ids):
        """(tokens so far, finish reason) after each token; an abort ends the request."""
        epoch, done = state.abort_epoch, []
        async with contextlib.aclosing(steps):
            async for token, logprob, reason in steps:
                if state.abort_epoch != epoch:
                    reason = {"type": "abort", "message": "Abort in running batch"}
                    yield done, _log(ids, done, reason)
                    return
                await _gate(epoch)
                if state.abort_epoch != epoch:
                    reason = {"type": "abort", "message": "Abort in running batch"}
                    yield done, _log(ids, done, reason)
                    return
                done = [*done, (token, logprob)]
                yield done, _log(ids, done, reason) if reason else None
                if reason:
                    return

    def _log(ids, done, reason):
        if state.engine is not None:
            state.received["generated"].append(
                {
                    "input_ids": list(ids),
                    "output_ids": [t for t, _ in done],
                    "logprobs": [lp for _, lp in done],
                    "weight_version": state.weight_version,
                    "finish": reason["type"],
                }
            )
        return reason

    async def _delay():
        if state.token_delay_s:
            await asyncio.sleep(state.token_delay_s)

    async def _gate(epoch: int | None = None):
        while state.paused and (epoch is None or state.abort_epoch == epoch):
            await state.resume.wait()

    async def _stream(steps, body):
        sent = 0
        async for done, reason in _run(steps, body["input_ids"]):
            start = sent if state.incremental else 0
            sent = len(done)
            out = _output(done, len(done), body, start, reason)
            yield b"data: " + json.dumps(out).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def _output(done, n, body, start, reason=None):
        done = done[:n]
        entries = [[lp, tok, None] for tok, lp in done[start:]]
        meta = {
            "id": "fake-rid",
            "finish_reason": reason,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": n,
            "cached_tokens": 0,
            "weight_version": state.weight_version,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = entries
        return {"text": "", "output_ids": [t for t, _ in done[start:]], "meta_info": meta}

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await request.json() if await request.body() else {}
        mode = body.get("mode", "abort")
        state.received["pause_modes"].append(mode)
        if mode == "abort":
            state.abort_epoch += 1
        if not state.paused:
            state.paused = True
            state.resume = asyncio.Event()
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        state.paused = False
        if state.resume is not None:
            state.resume.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release(request: Request):
        if state.engine is not None and not state.released:
            await state.engine.release_memory()
        state.released = True
        return None

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume(request: Request):
        if state.engine is not None and state.released:
            await state.engine.resume_memory()
            await state.engine.resume()
        state.released = False
        return None

    def _refused():
        if state.fail_updates:
            state.fail_updates -= 1
            return JSONResponse(
                {"success": False, "message": "Failed to update weights: fake failure"}, 400
            )
        return None

    async def _load(named: dict, body: dict) -> None:
        """Model mode: ``named`` over the served weights, into the engine."""
        if state.engine is None or state.ignore_updates:
            return
        state.weights.update(named)
        version = str(body.get("weight_version") or "")
        number = int(version) if version.isdigit() else state.engine.weight_version + 1
        await state.engine.update_weights(dict(state.weights), number)

    @app.post("/update_weights_from_disk")
    async def from_disk(request: Request):
        body = await request.json()
        if (refused := _refused()) is not None:
            return refused
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
            await _load(loaded, body)
        return _updated(body, {"num_paused_requests": 0})

    @app.post("/update_weights_from_tensor")
    async def from_tensor(request: Request):
        import torch

        body = await request.json()
        if (refused := _refused()) is not None:
            return refused
        payloads = body["serialized_named_tensors"]
        named = torch.load(io.BytesIO(base64.b64decode(payloads[0])), weights_only=True)
        state.received["tensors"].append({"ranks": len(payloads), "named": named})
        await _load(named, body)
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
            await _load(named, body)
        if (refused := _refused()) is not None:
            return refused
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

    @app.post("/fake/fail_updates")
    async def fail_updates(request: Request):
        state.fail_updates = int((await request.json()).get("count", 1))
        return {}

    @app.get("/fake/state")
    async def fake_state():
        return {
            "weight_version": state.weight_version,
            "paused": state.paused,
            "released": state.released,
        }

    return app


class FakeServer:
    """The app served by uvicorn on 127.0.0.1 in a thread of the test process; ``url``."""

    def __init__(self, state: FakeState):
        import threading
        import time

        import uvicorn

        self.state = state
        config = uvicorn.Config(
            make_app(state), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.state.close()


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
    parser.add_argument("--serve-model", action="store_true", help="real tokens of the model")
    args, _ = parser.parse_known_args()  # SGLang's other flags are accepted and ignored
    state = FakeState(context_length=args.context_length)
    if args.serve_model:
        state.model_path = args.model_path
        state.start_model()
    try:
        uvicorn.run(make_app(state), host=args.host, port=args.port, log_level="warning")
    finally:
        state.close()


if __name__ == "__main__":
    main()
