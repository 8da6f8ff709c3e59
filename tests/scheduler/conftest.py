"""Shared fixtures: chat prompts and small packed RL batches for the trainer (the tiny
model and its tokenizer: ``tiny_path`` / ``tokenizer`` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prompts(tokenizer):
    """Eight chat prompts of different lengths."""
    out = []
    for i in range(8):
        messages = [{"role": "user", "content": f"Task {i}: " + "fix the failing test. " * (i + 1)}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(ids["input_ids"])
    return out


@pytest.fixture(scope="session")
def make_units():
    return rl_units


def rl_units(seed: int = 0, episodes: int = 4, version: int = 0):
    """Packed units of one GRPO group of random token ids (rewards differ, so advantages
    are non-zero): a real batch for ``train_step`` or gradient computation."""
    import numpy as np

    from gyre_env.proxy.records import CallRecord
    from gyre_env.trajectory.packing import pack
    from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
    from gyre_env.trajectory.tree import EpisodeInfo, build_trees

    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 400, 30).tolist()
    records, infos = [], []
    for k in range(episodes):
        out = rng.integers(1, 400, 8).tolist()
        records.append(
            CallRecord(
                session=f"s{seed}-{k}",
                call_index=0,
                branch="main",
                parent=None,
                role="main",
                prompt_ids=prompt,
                output_ids=out,
                output_logprobs=[-1.0] * len(out),
                weight_version=version,
            )  # fmt: skip
        )
        infos.append(
            EpisodeInfo(session=f"s{seed}-{k}", group="g", outcome="success", reward=k / episodes)
        )
    units, _ = bounded_samples(build_trees(records, infos), SampleConfig(token_budget=4096))
    return [pack(u) for u in units]


@pytest.fixture(scope="session")
def two_ray_steps():
    """``run(pool, book, timeout_s)``: the elastic driver on a ``RayCells`` pool for two
    steps of a tool-loop workload; checks both steps ran, a cell switched to training and
    the core published version 2; returns the driver's result."""
    from gyre_env.scheduler.chat_workload import ToolLoopConfig, ToolLoopWorkload
    from gyre_env.scheduler.driver import ElasticConfig, ElasticDriver
    from gyre_env.scheduler.policy import Role, WaterlevelPolicy

    def run(pool, book, timeout_s: float = 120.0):
        workload = ToolLoopWorkload(
            pool.proxy.openai_base_url,
            book,
            ToolLoopConfig(group_size=2, turns=2, tool_delay_s=0.3),
        )
        driver = ElasticDriver(
            pool.cells, WaterlevelPolicy(), workload, call=pool.proxy.call,
            router=pool.proxy.core.router, clock=book.clock, costs=pool.costs, core=pool.core,
            config=ElasticConfig(steps=2, groups_per_step=1, agent_slots=3, timeout_s=timeout_s),
        )  # fmt: skip
        result = driver.run()
        assert [s["step"] for s in result.steps] == [1, 2]
        assert Role.TRAINING in [r.to for r in result.switches]
        assert pool.board.version == 2 and pool.group.call("version")[0] == 2
        return result

    return run
