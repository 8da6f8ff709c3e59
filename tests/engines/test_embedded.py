"""EmbeddedEngine on the tiny model: exactness of batching, logprobs, limits, control calls.

Everything here is real: the tiny transformers model on CPU, the engine's worker thread
and its KV-cache batching. Nothing is faked.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from gyre_env.engines.base import (
    ContextLengthError,
    Engine,
    EnginePausedError,
    SamplingParams,
)
from gyre_env.engines.embedded import EmbeddedEngine

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


def _forward_logprobs(model, prompt, output, temperature=1.0):
    """Log-probabilities of ``output`` after ``prompt`` from one plain forward pass."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]


def _forward_logprobs_of(folder, prompt, output):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype="float32")
    return _forward_logprobs(model.eval(), prompt, output)


def test_implements_the_engine_protocol(engine, tokenizer):
    assert isinstance(engine, Engine)
    assert engine.context_length == 131072
    assert engine.eos_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_greedy_is_deterministic(engine, prompts):
    a = asyncio.run(engine.generate(prompts[0], GREEDY))
    b = asyncio.run(engine.generate(prompts[0], GREEDY))
    # b reuses a's prompt KV (prefix cache): its last prompt token is computed alone, so
    # its logprobs equal a's up to float rounding, not bit for bit
    assert a.output_ids == b.output_ids
    assert b.output_logprobs == pytest.approx(a.output_logprobs, abs=1e-5)
    assert len(a.output_ids) == 24 and a.finish_reason == "length"
    assert a.weight_version == 0 and a.prefill_s > 0 and a.decode_s > 0


def test_concurrent_batched_greedy_equals_sequential(engine, prompts):
    params = [SamplingParams(max_new_tokens=8 + 3 * i, temperature=0.0) for i in range(8)]
    alone = [asyncio.run(engine.generate(p, sp)) for p, sp in zip(prompts, params, strict=True)]

    async def together():
        return await asyncio.gather(
            *(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True))
        )

    batched = asyncio.run(together())
    for a, b in zip(alone, batched, strict=True):
        assert a.output_ids == b.output_ids
        assert b.output_logprobs == pytest.approx(a.output_logprobs, abs=1e-4)


def test_requests_joining_a_running_batch_match_running_alone(engine, prompts):
    long = SamplingParams(max_new_tokens=40, temperature=0)

    async def staggered():
        first = []

        async def run_first():
            async for chunk in engine.stream(prompts[7], long):
                first.extend(chunk.ids)

        task = asyncio.create_task(run_first())
        while len(first) < 3:  # the first is mid-decode when the others join
            await asyncio.sleep(0.001)
        rest = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts[:3]))
        await task
        return first, rest

    first, rest = asyncio.run(staggered())
    assert first == asyncio.run(engine.generate(prompts[7], long)).output_ids
    for p, r in zip(prompts[:3], rest, strict=True):
        assert r.output_ids == asyncio.run(engine.generate(p, GREEDY)).output_ids


def test_chunked_prefill_equals_one_shot(tiny_path, prompts):
    long_prompt = [t for p in prompts for t in p]  # a few hundred tokens
    engine = EmbeddedEngine(model_path=str(tiny_path), prefill_chunk_tokens=37)
    try:
        chunked = asyncio.run(engine.generate(long_prompt, GREEDY))
    finally:
        engine.close()
    ref = _forward_logprobs_of(tiny_path, long_prompt, chunked.output_ids)
    assert chunked.output_logprobs == pytest.approx(ref, abs=1e-4)


def test_sliding_window_models_are_served_one_at_a_time(tmp_path):
    """A model whose cache cannot be left-padded and merged still serves concurrent requests."""
    import torch
    import transformers

    config = transformers.MistralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=8,
        max_position_embeddings=256,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    transformers.MistralForCausalLM(config).save_pretrained(tmp_path)
    engine = EmbeddedEngine(model_path=str(tmp_path))
    try:
        assert asyncio.run(engine.health())["max_batch_size"] == 1
        prompts = [[1 + i, 5, 9, 2 * i + 3] * (i + 2) for i in range(3)]
        alone = [asyncio.run(engine.generate(p, GREEDY)).output_ids for p in prompts]

        async def together():
            return await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))

        assert [r.output_ids for r in asyncio.run(together())] == alone
        ref = _forward_logprobs(engine._model, prompts[2], alone[2])
        result = asyncio.run(engine.generate(prompts[2], GREEDY))
        assert result.output_logprobs == pytest.approx(ref, abs=1e-4)
    finally:
        engine.close()


def test_logprobs_match_a_direct_forward_pass(engine, prompts):
    greedy = asyncio.run(engine.generate(prompts[2], GREEDY))
    ref = _forward_logprobs(engine._model, prompts[2], greedy.output_ids)
    assert greedy.output_logprobs == pytest.approx(ref, abs=1e-4)
    hot = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, top_k=50, seed=3)
    sampled = asyncio.run(engine.generate(prompts[2], hot))
    ref = _forward_logprobs(engine._model, prompts[2], sampled.output_ids, temperature=0.7)
    assert sampled.output_logprobs == pytest.approx(ref, abs=1e-4)


def test_seeded_sampling_is_reproducible(engine, prompts):
    def sample(seed, **kw):
        sp = SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed, **kw)
        return asyncio.run(engine.generate(prompts[1], sp)).output_ids

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    greedy = asyncio.run(
        engine.generate(prompts[1], SamplingParams(max_new_tokens=16, temperature=0))
    )
    assert sample(9, top_k=1) == greedy.output_ids
    assert sample(9, top_p=1e-6) == greedy.output_ids


def test_min_p_never_samples_the_tail_and_keeps_the_unfiltered_logprob():
    """Probabilities 0.5, 0.3, 0.15, 0.05 at min_p 0.2 (floor 0.1): the last token is never
    sampled, the others are; each logprob is the token's under the tempered distribution
    before the filter (the behaviour logprob convention), not the renormalised one."""
    import math

    import torch

    from gyre_env.engines.sampling import make_generator, sample_rows

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().unsqueeze(0)

    def draw(min_p, n=3000):
        p = SamplingParams(temperature=1.0, min_p=min_p, seed=5)
        gen = make_generator(p, "cpu")
        seen = {}
        for _ in range(n):
            ids, lps = sample_rows(logits, [p], [gen])
            seen[ids[0]] = lps[0]
        return seen

    filtered, free = draw(0.2), draw(0.0)
    assert sorted(filtered) == [0, 1, 2] and sorted(free) == [0, 1, 2, 3]
    for token, lp in filtered.items():
        assert lp == pytest.approx(math.log(float(probs[token])), abs=1e-5)
    # the filter is relative to the most likely token after temperature: at T=3 the
    # distribution flattens (0.05 -> 0.16 of the top), so the same min_p keeps all four
    hot = SamplingParams(temperature=3.0, min_p=0.2, seed=5)
    gen = make_generator(hot, "cpu")
    assert {sample_rows(logits, [hot], [gen])[0][0] for _ in range(3000)} == {0, 1, 2, 3}
    # near 1 only the most likely token is left
    sharp = SamplingParams(temperature=1.0, min_p=0.99, seed=5)
    gen = make_generator(sharp, "cpu")
    assert {sample_rows(logits, [sharp], [gen])[0][0] for _ in range(200)} == {0}


def test_stop_ids_end_generation_and_are_kept(engine, prompts):
    full = asyncio.run(engine.generate(prompts[4], GREEDY)).output_ids
    stop = full[5]
    first = full.index(stop)
    params = SamplingParams(max_new_tokens=24, temperature=0, stop_token_ids=[stop])
    result = asyncio.run(engine.generate(prompts[4], params))
    assert result.output_ids == full[: first + 1]
    assert result.finish_reason == "stop"


def test_context_length_limits_output_and_rejects_overflow(tiny_path, prompts):
    engine = EmbeddedEngine(model_path=str(tiny_path), context_length=len(prompts[0]) + 3)
    try:
        result = asyncio.run(engine.generate(prompts[0], GREEDY))
        assert len(result.output_ids) == 3 and result.finish_reason == "length"
        with pytest.raises(ContextLengthError, match="context of"):
            asyncio.run(engine.generate(prompts[0] + [1, 2, 3], GREEDY))
    finally:
        engine.close()


def test_streaming_concatenates_to_the_non_streamed_result(engine, prompts):
    async def collect():
        return [c async for c in engine.stream(prompts[3], GREEDY)]

    chunks = asyncio.run(collect())
    whole = asyncio.run(engine.generate(prompts[3], GREEDY))
    assert [i for c in chunks for i in c.ids] == whole.output_ids
    assert [lp for c in chunks for lp in c.logprobs] == whole.output_logprobs
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]


def test_abandoned_stream_frees_its_row(engine, prompts):
    async def abandon():
        stream = engine.stream(prompts[0], SamplingParams(max_new_tokens=5000, temperature=0))
        async for _ in stream:
            break
        await stream.aclose()
        for _ in range(100):
            health = await engine.health()
            if health["running"] == 0 and health["queued"] == 0:
                return health
            await asyncio.sleep(0.02)
        return health

    assert asyncio.run(abandon())["running"] == 0


def test_cancelled_generate_frees_its_row(engine, prompts):
    async def cancel():
        long = SamplingParams(max_new_tokens=5000, temperature=0)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.generate(prompts[1], long), timeout=0.2)
        for _ in range(100):
            health = await engine.health()
            if health["running"] == 0 and health["queued"] == 0:
                break
            await asyncio.sleep(0.02)
        return health

    assert asyncio.run(cancel())["running"] == 0


def test_bad_requests_name_the_problem(engine):
    with pytest.raises(ValueError, match="non-empty"):
        asyncio.run(engine.generate([], GREEDY))
    with pytest.raises(ValueError, match=r"prompt_ids\[1\]"):
        asyncio.run(engine.generate([1, 10**9], GREEDY))
    with pytest.raises(ValueError, match="temperature"):
        asyncio.run(engine.generate([1], SamplingParams(temperature=-1)))
    with pytest.raises(ValueError, match="top_p"):
        asyncio.run(engine.generate([1], SamplingParams(top_p=0)))
    for bad in (1.0, -0.1, "0.1"):
        with pytest.raises(ValueError, match=r"min_p must be in \[0, 1\)"):
            asyncio.run(engine.generate([1], SamplingParams(min_p=bad)))
    with pytest.raises(ValueError, match="max_new_tokens"):
        asyncio.run(engine.generate([1], SamplingParams(max_new_tokens=0)))


def test_a_failing_prefill_fails_only_its_request(tiny_path, prompts):
    """Fault injection: the model raises on one prompt length (as an OOM on a long prompt would)."""
    from gyre_env.engines.base import EngineError

    engine = EmbeddedEngine(model_path=str(tiny_path))
    real_model = engine._model

    class Faulty:
        config = real_model.config

        def __call__(self, **kwargs):
            if kwargs["input_ids"].shape[1] == 7:
                raise RuntimeError("out of memory (injected)")
            return real_model(**kwargs)

    try:
        expected = asyncio.run(engine.generate(prompts[0], GREEDY)).output_ids
        engine._model = Faulty()

        async def scenario():
            good = asyncio.create_task(engine.generate(prompts[0], GREEDY))
            bad = asyncio.create_task(engine.generate(list(range(1, 8)), GREEDY))
            return await asyncio.gather(good, bad, return_exceptions=True)

        good, bad = asyncio.run(scenario())
        assert isinstance(bad, EngineError) and "failed in prefill" in str(bad)
        assert good.output_ids == expected
    finally:
        engine._model = real_model
        engine.close()


def test_pause_rejects_new_requests_and_lets_running_ones_finish(tiny_path, prompts):
    engine = EmbeddedEngine(model_path=str(tiny_path))

    async def scenario():
        running = asyncio.create_task(
            engine.generate(prompts[0], SamplingParams(max_new_tokens=60, temperature=0))
        )
        await asyncio.sleep(0.05)
        await engine.pause()
        assert (await engine.health())["status"] == "paused"
        with pytest.raises(EnginePausedError):
            await engine.generate(prompts[1], GREEDY)
        done = await running
        await engine.resume()
        after = await engine.generate(prompts[1], GREEDY)
        return done, after

    try:
        done, after = asyncio.run(scenario())
        assert len(done.output_ids) == 60 and len(after.output_ids) == 24
    finally:
        engine.close()


def _perturbed_state(engine, scale=0.5, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {  # a whole version (a partial one is refused): the projections perturbed
        name: tensor + scale * torch.randn(tensor.shape, generator=gen)
        if name.endswith("proj.weight")
        else tensor.clone()
        for name, tensor in engine._model.state_dict().items()
    }


def test_update_weights_changes_outputs_and_version(tiny_path, prompts, tmp_path):
    from gyre_env.engines.tiny import TinyModelConfig, build_tiny_model

    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        before = asyncio.run(engine.generate(prompts[0], GREEDY))
        asyncio.run(engine.update_weights(_perturbed_state(engine), version=1))
        after = asyncio.run(engine.generate(prompts[0], GREEDY))
        assert engine.weight_version == 1 and after.weight_version == 1
        assert after.output_ids != before.output_ids
        assert after.output_logprobs == pytest.approx(
            _forward_logprobs(engine._model, prompts[0], after.output_ids), abs=1e-4
        )
        other = build_tiny_model(tmp_path / "seed1", TinyModelConfig(seed=1))
        asyncio.run(engine.update_weights(str(other), version=2))
        fresh = EmbeddedEngine(model_path=str(other))
        try:
            expected = asyncio.run(fresh.generate(prompts[0], GREEDY)).output_ids
        finally:
            fresh.close()
        assert asyncio.run(engine.generate(prompts[0], GREEDY)).output_ids == expected
        assert asyncio.run(engine.health())["weight_version"] == 2
    finally:
        engine.close()


def test_bad_weight_updates_are_rejected_without_effect(tiny_path):
    import torch

    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        with pytest.raises(ValueError, match="unknown parameter names"):
            asyncio.run(engine.update_weights({"nope.weight": torch.zeros(1)}, version=5))
        name = "model.norm.weight"
        with pytest.raises(ValueError, match="has shape"):
            asyncio.run(engine.update_weights({name: torch.zeros(3)}, version=5))
        with pytest.raises(TypeError, match="state dict, a model folder"):
            asyncio.run(engine.update_weights(42, version=5))
        assert engine.weight_version == 0
    finally:
        engine.close()


def test_nan_weights_fail_requests_with_a_clear_error_and_the_engine_recovers(tiny_path, prompts):
    """NaN weights (pushed from a diverged step) make NaN logits: on CUDA, sampling them
    is a device-side assert that kills the process; the engine refuses them by name."""
    from gyre_env.engines.base import EngineError, SamplingParams

    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        good = _perturbed_state(engine, scale=0.0)
        nan = {k: v * float("nan") for k, v in good.items()}
        asyncio.run(engine.update_weights(nan, version=1))
        for params in (GREEDY, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0)):
            with pytest.raises(EngineError, match="NaN or \\+inf.*diverged"):
                asyncio.run(engine.generate(prompts[0], params))
        asyncio.run(engine.update_weights(good, version=2))
        assert asyncio.run(engine.generate(prompts[0], GREEDY)).weight_version == 2
    finally:
        engine.close()


def test_update_from_another_models_folder_is_refused(tiny_path, prompts, tmp_path):
    from gyre_env.engines.tiny import TinyModelConfig, build_tiny_model

    other = build_tiny_model(tmp_path / "small-vocab", TinyModelConfig(vocab_size=600))
    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        before = asyncio.run(engine.generate(prompts[0], GREEDY)).output_ids
        with pytest.raises(ValueError, match="start a new engine"):
            asyncio.run(engine.update_weights(str(other), version=1))
        with pytest.raises(FileNotFoundError, match="no config.json"):
            asyncio.run(engine.update_weights(str(tmp_path / "nothing"), version=1))
        assert engine.weight_version == 0
        assert asyncio.run(engine.generate(prompts[0], GREEDY)).output_ids == before
    finally:
        engine.close()


def test_update_waits_for_running_requests(tiny_path, prompts):
    engine = EmbeddedEngine(model_path=str(tiny_path))
    long = SamplingParams(max_new_tokens=80, temperature=0)
    try:
        old = asyncio.run(engine.generate(prompts[0], long))

        async def scenario():
            running = asyncio.create_task(engine.generate(prompts[0], long))
            await asyncio.sleep(0.05)
            await engine.update_weights(_perturbed_state(engine), version=7)
            return await running

        result = asyncio.run(scenario())
        assert result.weight_version == 0 and result.output_ids == old.output_ids
        assert asyncio.run(engine.generate(prompts[0], long)).weight_version == 7
    finally:
        engine.close()


def test_update_is_a_barrier_between_earlier_and_later_requests(tiny_path, prompts):
    engine = EmbeddedEngine(model_path=str(tiny_path), max_batch_size=1)  # the rest queue

    async def scenario():
        earlier = [asyncio.create_task(engine.generate(p, GREEDY)) for p in prompts[:3]]
        await asyncio.sleep(0)  # all three are accepted; two wait in the queue
        update = asyncio.create_task(engine.update_weights(_perturbed_state(engine), version=1))
        await asyncio.sleep(0)
        later = await engine.generate(prompts[3], GREEDY)
        await update
        return await asyncio.gather(*earlier), later

    try:
        earlier, later = asyncio.run(scenario())
        assert [r.weight_version for r in earlier] == [0, 0, 0]
        assert later.weight_version == 1
    finally:
        engine.close()


class _SlowState(dict):
    """A state dict whose swap takes a while: ``started`` is set when the worker begins it."""

    def __init__(self, state, delay_s: float):
        super().__init__(state)
        import threading

        self.started, self.delay_s = threading.Event(), delay_s

    def items(self):
        import time

        if not self.started.is_set():
            self.started.set()
            time.sleep(self.delay_s)  # the caller is cancelled meanwhile
        return super().items()


def test_a_cancelled_update_keeps_the_worker_and_lands_whole_or_not_at_all(tiny_path, prompts):
    import torch

    engine = EmbeddedEngine(model_path=str(tiny_path))
    long = SamplingParams(max_new_tokens=60, temperature=0)
    original = {k: v.clone() for k, v in engine._model.state_dict().items()}
    queued, running = _perturbed_state(engine, seed=1), _perturbed_state(engine, seed=2)

    async def scenario():
        busy = asyncio.create_task(engine.generate(prompts[0], long))
        await asyncio.sleep(0)  # accepted: the update below waits for it to finish
        # Cancelled while waiting behind the running request: it never runs.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.update_weights(queued, version=1), 0.002)
        first = await asyncio.wait_for(busy, 60)
        after_queued = engine.weight_version
        # Cancelled while the swap runs on the worker: it completes, whole.
        slow = _SlowState(running, delay_s=0.3)
        task = asyncio.create_task(engine.update_weights(slow, version=2))
        for _ in range(2000):  # at most ~10 s
            if slow.started.is_set():
                break
            await asyncio.sleep(0.005)
        assert slow.started.is_set(), "the worker never started the swap (is it alive?)"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        later = await asyncio.wait_for(engine.generate(prompts[0], long), 60)
        return first, after_queued, later

    try:
        first, after_queued, later = asyncio.run(scenario())
        assert first.weight_version == 0 and after_queued == 0
        assert asyncio.run(engine.health())["alive"]
        assert later.weight_version == 2 and engine.weight_version == 2
        served = engine._model.state_dict()
        for name, tensor in served.items():
            expected = running.get(name, original[name])
            assert torch.equal(tensor, expected), name  # all of version 2, none of 1
    finally:
        engine.close()


def test_release_and_resume_memory_keep_updated_weights(tiny_path, prompts):
    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        asyncio.run(engine.update_weights(_perturbed_state(engine), version=3))
        expected = asyncio.run(engine.generate(prompts[5], GREEDY)).output_ids
        model = weakref.ref(engine._model)
        weight = weakref.ref(next(engine._model.parameters()))
        gc.disable()  # the release frees the weights itself, not a later collection
        try:
            asyncio.run(engine.release_memory())
        finally:
            gc.enable()
        assert engine._model is None
        assert model() is None and weight() is None, "released weights are freed"
        assert asyncio.run(engine.health())["status"] == "released"
        with pytest.raises(EnginePausedError):
            asyncio.run(engine.generate(prompts[5], GREEDY))
        asyncio.run(engine.resume_memory())
        result = asyncio.run(engine.generate(prompts[5], GREEDY))
        assert result.output_ids == expected and result.weight_version == 3
    finally:
        engine.close()


def test_a_parked_release_keeps_the_weights_in_host_buffers_reused_at_the_next(tiny_path, prompts):
    """The release an engine makes on CUDA (``_park_on_release``), run here on CPU with
    unpinned buffers: the model's weights go to host buffers and come back from them on
    resume (no reload from ``model_path``: updated weights survive), the same model object
    serves again, and the second release copies into the first one's buffers."""
    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        engine._park_on_release = True
        asyncio.run(engine.update_weights(_perturbed_state(engine), version=3))
        expected = asyncio.run(engine.generate(prompts[5], GREEDY)).output_ids
        model = engine._model
        for trip in range(2):
            asyncio.run(engine.release_memory())
            assert engine._model is None and asyncio.run(engine.health())["status"] == "released"
            host = {k: b.data_ptr() for k, b in engine._stash._host.items()}
            assert {p.data_ptr() for p in model.parameters()} <= set(host.values())
            if trip == 0:
                first, allocated = host, engine._stash.allocated_bytes
            else:
                assert host == first and engine._stash.allocated_bytes == allocated
            asyncio.run(engine.resume_memory())
            assert engine._model is model
            result = asyncio.run(engine.generate(prompts[5], GREEDY))
            assert result.output_ids == expected and result.weight_version == 3
    finally:
        engine.close()


def test_release_frees_weights_a_reference_cycle_holds(tiny_path):
    """Weights that only a reference cycle still holds are freed by the release too (it
    collects when its weak reference to the model outlives dropping it)."""
    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        cycle: list = [engine._model]
        cycle.append(cycle)
        del cycle
        model = weakref.ref(engine._model)
        gc.disable()
        try:
            asyncio.run(engine.release_memory())
        finally:
            gc.enable()
        assert model() is None
    finally:
        engine.close()


def test_explicit_pause_survives_a_memory_round_trip(tiny_path):
    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        asyncio.run(engine.pause())
        asyncio.run(engine.release_memory())
        asyncio.run(engine.resume_memory())
        assert asyncio.run(engine.health())["status"] == "paused"
    finally:
        engine.close()


def test_close_fails_queued_requests(tiny_path, prompts):
    from gyre_env.engines.base import EngineError

    engine = EmbeddedEngine(model_path=str(tiny_path))

    async def scenario():
        task = asyncio.create_task(
            engine.generate(prompts[0], SamplingParams(max_new_tokens=5000, temperature=0))
        )
        await asyncio.sleep(0.05)
        await asyncio.to_thread(engine.close)
        return await task

    with pytest.raises(EngineError, match="closed"):
        asyncio.run(scenario())


def test_prefix_cache_reuses_a_shared_prompt_prefix_exactly(tiny_path, prompts):
    """A prompt that starts like an earlier one prefills only its new tokens, and its
    outputs and logprobs are those of a full prefill (and of one plain forward pass)."""
    base = prompts[7]
    longer = base + prompts[1]  # extends base: all of base is reused
    branch = base[:-5] + prompts[2][:9]  # shares all but base's last 5 tokens
    cold = EmbeddedEngine(model_path=str(tiny_path), prefix_cache_tokens=0)
    warm = EmbeddedEngine(model_path=str(tiny_path))
    try:
        for p in (base, longer, branch):
            want = asyncio.run(cold.generate(p, GREEDY))
            got = asyncio.run(warm.generate(p, GREEDY))
            assert got.output_ids == want.output_ids
            assert got.output_logprobs == pytest.approx(want.output_logprobs, abs=1e-4)
            assert got.output_logprobs == pytest.approx(
                _forward_logprobs(warm._model, p, got.output_ids), abs=1e-4
            )
        stats = asyncio.run(warm.health())["prefix_cache"]
        assert stats["hits"] == 2
        assert stats["tokens_reused"] == len(base) + len(base) - 5
        assert asyncio.run(cold.health())["prefix_cache"]["hits"] == 0
        # Batched with a shared prefix: the same as one at a time.
        many = [base + prompts[i][: 4 + i] for i in range(6)]
        alone = [asyncio.run(cold.generate(p, GREEDY)).output_ids for p in many]

        async def together():
            return await asyncio.gather(*(warm.generate(p, GREEDY) for p in many))

        assert [r.output_ids for r in asyncio.run(together())] == alone
    finally:
        cold.close()
        warm.close()


def test_new_weights_drop_the_prefix_cache(tiny_path, prompts):
    engine = EmbeddedEngine(model_path=str(tiny_path))
    try:
        asyncio.run(engine.generate(prompts[3], GREEDY))
        assert asyncio.run(engine.health())["prefix_cache"]["entries"] == 1
        asyncio.run(engine.update_weights(_perturbed_state(engine), version=1))
        assert asyncio.run(engine.health())["prefix_cache"]["entries"] == 0
        after = asyncio.run(engine.generate(prompts[3], GREEDY))
        assert after.output_logprobs == pytest.approx(
            _forward_logprobs(engine._model, prompts[3], after.output_ids), abs=1e-4
        )
        asyncio.run(engine.release_memory())
        assert asyncio.run(engine.health())["prefix_cache"]["entries"] == 0
    finally:
        engine.close()


def test_the_wait_for_a_batch_slot_is_reported_on_the_first_chunk(tiny_path, prompts):
    engine = EmbeddedEngine(model_path=str(tiny_path), max_batch_size=1)  # the rest queue
    params = SamplingParams(max_new_tokens=30, temperature=0)

    async def chunks(prompt):
        return [c async for c in engine.stream(prompt, params)]

    async def scenario():
        return await asyncio.gather(chunks(prompts[0]), chunks(prompts[1]))

    try:
        first, second = asyncio.run(scenario())
    finally:
        engine.close()
    for stream in (first, second):
        assert stream[0].queued_s is not None and stream[0].queued_s >= 0
        assert all(c.queued_s is None for c in stream[1:])
    # the second waited while the first generated its 30 tokens
    assert second[0].queued_s > first[0].queued_s
