"""SGLangEngine against a FAKE SGLang server (tests/engines/fake_sglang.py).

SGLang needs a GPU, so these tests run the client against a small FastAPI app that mimics
SGLang's native HTTP API shapes, served by uvicorn on 127.0.0.1. What is real: the client,
its HTTP traffic, SSE parsing, error mapping and the subprocess launcher. What is faked:
the server. benchmarks/gpu/sglang_check.py runs the same client against a real server.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from gyre_env.engines.base import (
    ContextLengthError,
    Engine,
    EngineError,
    EnginePausedError,
    SamplingParams,
)
from gyre_env.engines.sglang import DistributedWeights, SGLangEngine

sys.path.insert(0, str(Path(__file__).parent))
from fake_sglang import FakeServer, FakeState, fake_tokens, test_serializer  # noqa: E402

PROMPT = [5, 17, 42, 99]


@pytest.fixture
def fake():
    server = FakeServer(FakeState())
    yield server
    server.stop()


def _engine(fake, **kw) -> SGLangEngine:
    engine = SGLangEngine(url=fake.url, tensor_serializer=test_serializer, **kw)
    asyncio.run(engine.start())
    return engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_attach_reads_context_and_version(fake):
    engine = _engine(fake)
    assert isinstance(engine, Engine)
    assert engine.context_length == 64 and engine.weight_version == 0  # "default" is not a number
    health = asyncio.run(engine.health())
    assert health["alive"] and health["status"] == "ok"


def test_generate_parses_ids_logprobs_and_finish(fake):
    engine = _engine(fake)
    result = asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=6, temperature=0)))
    expected = fake_tokens(PROMPT, 6)
    assert result.output_ids == [t for t, _ in expected]
    assert result.output_logprobs == pytest.approx([lp for _, lp in expected])
    assert result.finish_reason == "length"
    stop = expected[2][0]
    params = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=[stop])
    stopped = asyncio.run(engine.generate(PROMPT, params))
    assert stopped.output_ids == [t for t, _ in expected[:3]] and stopped.finish_reason == "stop"


@pytest.mark.parametrize("incremental", [False, True])
def test_stream_concatenates_to_generate(incremental):
    server = FakeServer(FakeState(incremental=incremental))
    try:
        engine = _engine(server)
        params = SamplingParams(max_new_tokens=9, temperature=0.5, seed=1)

        async def collect():
            return [c async for c in engine.stream(PROMPT, params)]

        chunks = asyncio.run(collect())
        whole = asyncio.run(engine.generate(PROMPT, params))
        assert [i for c in chunks for i in c.ids] == whole.output_ids
        assert [lp for c in chunks for lp in c.logprobs] == whole.output_logprobs
        assert [c.finish_reason for c in chunks][-1] == "length"
        assert all(c.finish_reason is None for c in chunks[:-1]) and len(chunks) == 9
    finally:
        server.stop()


def test_payload_uses_sglang_field_names(fake):
    engine = _engine(fake)
    payload = engine._payload(
        PROMPT,
        SamplingParams(max_new_tokens=3, top_k=5, min_p=0.05, seed=9, stop_token_ids=[2]),
        True,
    )
    assert (
        payload["input_ids"] == PROMPT and payload["return_logprob"] is True and payload["stream"]
    )
    sp = payload["sampling_params"]
    assert sp["max_new_tokens"] == 3 and sp["top_k"] == 5 and sp["stop_token_ids"] == [2]
    assert sp["sampling_seed"] == 9 and sp["min_p"] == 0.05


def test_context_overflow_is_a_context_length_error(fake):
    engine = _engine(fake)
    with pytest.raises(ContextLengthError):
        asyncio.run(engine.generate(list(range(64)), SamplingParams()))
    blind = _engine(fake, context_length=10_000)  # the server's own 400 is mapped too
    with pytest.raises(ContextLengthError, match="longer than the model's context length"):
        asyncio.run(blind.generate(list(range(80)), SamplingParams()))


def test_pause_holds_running_requests_until_continue(fake):
    fake.state.token_delay_s = 0.01
    engine = _engine(fake)

    async def scenario():
        chunks = []

        async def consume():
            async for c in engine.stream(PROMPT, SamplingParams(max_new_tokens=150)):
                chunks.append(c)

        task = asyncio.create_task(consume())
        while len(chunks) < 3:
            await asyncio.sleep(0.005)
        await engine.pause()
        with pytest.raises(EnginePausedError):
            await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))
        await asyncio.sleep(0.3)  # a token already on the wire may still land
        held = len(chunks)
        await asyncio.sleep(0.3)
        assert len(chunks) == held < 150  # nothing moves while paused
        await engine.resume()
        await task
        return chunks

    chunks = asyncio.run(scenario())
    assert sum(len(c.ids) for c in chunks) == 150 and chunks[-1].finish_reason == "length"
    assert fake.state.received["pause_modes"] == ["in_place"]


def test_pause_mode_abort_ends_running_streams(fake):
    fake.state.token_delay_s = 0.01
    engine = _engine(fake, pause_mode="abort")

    async def scenario():
        stream = engine.stream(PROMPT, SamplingParams(max_new_tokens=500))
        first = await stream.__anext__()
        await engine.pause()
        rest = [c async for c in stream]
        return [first, *rest]

    chunks = asyncio.run(scenario())
    assert chunks[-1].finish_reason == "abort" and sum(len(c.ids) for c in chunks) < 500


def test_weight_updates_from_disk_tensor_and_distributed(fake, tmp_path):
    import torch

    engine = _engine(fake, tp_size=2)
    asyncio.run(engine.update_weights(str(tmp_path), version=3))
    assert engine.weight_version == 3 and fake.state.weight_version == "3"
    result = asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=2)))
    assert result.weight_version == 3

    with pytest.raises(EngineError, match="repository not found"):
        asyncio.run(engine.update_weights(str(tmp_path / "missing"), version=4))
    assert engine.weight_version == 3

    weights = {"lm_head.weight": torch.arange(6.0).reshape(2, 3)}
    asyncio.run(engine.update_weights(weights, version=5))
    got = fake.state.received["tensors"][-1]
    assert got["ranks"] == 2 and torch.equal(
        got["named"]["lm_head.weight"], weights["lm_head.weight"]
    )

    meta = DistributedWeights(names=["w"], dtypes=["bfloat16"], shapes=[[2, 3]])
    with pytest.raises(EngineError, match="no weight update group"):
        asyncio.run(engine.update_weights(meta, version=6))
    asyncio.run(
        engine.init_weights_update_group(
            master_address="127.0.0.1", master_port=29500, rank_offset=1, world_size=2
        )
    )
    asyncio.run(engine.update_weights(meta, version=6))
    assert fake.state.received["distributed"][-1]["names"] == ["w"]

    fake.state.weight_version = "11"  # someone else updated the server
    assert asyncio.run(engine.refresh_weight_version()) == 11
    with pytest.raises(TypeError, match="model folder path"):
        asyncio.run(engine.update_weights(3.5, version=12))


def test_release_and_resume_memory(fake):
    engine = _engine(fake)
    asyncio.run(engine.release_memory())
    assert fake.state.released and asyncio.run(engine.health())["status"] == "released"
    with pytest.raises(EnginePausedError):
        asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=2)))
    asyncio.run(engine.resume_memory())
    assert not fake.state.released
    assert (
        len(asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=2))).output_ids) == 2
    )


def test_server_errors_become_engine_errors(fake):
    engine = _engine(fake)
    asyncio.run(_post(fake.url + "/fake/fail_next"))
    with pytest.raises(EngineError, match="HTTP 500"):
        asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=2)))
    asyncio.run(_post(fake.url + "/fake/fail_next"))

    async def stream_once():
        return [c async for c in engine.stream(PROMPT, SamplingParams(max_new_tokens=2))]

    with pytest.raises(EngineError, match="HTTP 500"):
        asyncio.run(stream_once())
    assert asyncio.run(engine.health())["running"] == 0


def test_connection_refused_is_an_engine_error():
    engine = SGLangEngine(url=f"http://127.0.0.1:{_free_port()}", context_length=100)
    with pytest.raises(EngineError, match="failed"):
        asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=2)))
    health = asyncio.run(engine.health())
    assert health["alive"] is False and health["status"] == "down"


def test_launches_a_server_subprocess_and_stops_it(tmp_path):
    fake_program = str(Path(__file__).with_name("fake_sglang.py"))
    port = _free_port()
    engine = SGLangEngine(
        model_path=str(tmp_path), port=port, launch_command=[sys.executable, fake_program]
    )
    try:
        asyncio.run(engine.start())
        result = asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=3)))
        assert result.output_ids == [t for t, _ in fake_tokens(PROMPT, 3)]
        proc = engine._process
    finally:
        engine.close()
    assert proc.poll() is not None


def test_a_launch_that_dies_reports_its_log(tmp_path):
    engine = SGLangEngine(
        model_path=str(tmp_path),
        port=_free_port(),
        launch_command=[sys.executable, "-c", "import sys; print('no GPU found'); sys.exit(3)"],
    )
    with pytest.raises(EngineError, match="(?s)exited with code 3.*no GPU found"):
        asyncio.run(engine.start())


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="url .* or model_path"):
        SGLangEngine()
    with pytest.raises(ValueError, match="pause_mode"):
        SGLangEngine(url="http://x", pause_mode="later")


async def _post(url: str) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        (await client.post(url)).raise_for_status()


def test_gpu_check_script_passes_against_the_fake(tmp_path, capsys):
    """Keeps benchmarks/gpu/sglang_check.py working; on a GPU it runs against real SGLang."""
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "gpu" / "sglang_check.py"
    spec = importlib.util.spec_from_file_location("sglang_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fake = FakeServer(FakeState(incremental=True, token_delay_s=0.005))
    try:
        code = module.main(
            ["--url", fake.url, "--model-path", str(tmp_path), "--pause-tokens", "300"]
        )
    finally:
        fake.stop()
    out = capsys.readouterr().out
    for name in [
        "generate_logprobs",
        "stream",
        "pause_continue",
        "update_weights_from_disk",
        "release_resume_memory",
    ]:
        assert f"PASS {name}" in out, out
    assert "SKIP logprobs_vs_transformers" in out and code == 0
