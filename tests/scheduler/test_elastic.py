"""The elastic driver on real cells (two embedded engines behind the proxy, two torch
trainers) with agents whose tool calls wait: Gyre's waterlevel policy object, the very one
the simulator drives, switches cells at runtime and optimizer steps happen on whichever
cells are training; the peers' policies run on the same driver."""

from __future__ import annotations

import pytest

from gyre_env.scheduler.elastic import ElasticConfig, ElasticDriver
from gyre_env.scheduler.local import LocalCells, LocalCellsConfig
from gyre_env.scheduler.peers import StaticSplitPolicy
from gyre_env.scheduler.policy import Role, WaterlevelPolicy
from gyre_env.scheduler.workloads import RecordBook, ToolLoopConfig, ToolLoopWorkload


def _run(tiny_path, tokenizer, policy, steps=3, delay=0.3):
    book = RecordBook()
    roles = policy.initial_roles(2) if hasattr(policy, "initial_roles") else None
    with LocalCells(
        tiny_path,
        tokenizer,
        LocalCellsConfig(cells=2, max_batch_size=8, switch_prior_s=0.05),
        sink=book,
    ).open(roles) as pool:
        workload = ToolLoopWorkload(
            pool.proxy.openai_base_url,
            book,
            ToolLoopConfig(group_size=2, turns=2, tool_delay_s=delay),
        )
        driver = ElasticDriver(
            pool.cells, policy, workload, call=pool.proxy.call, router=pool.proxy.core.router,
            config=ElasticConfig(steps=steps, groups_per_step=1, agent_slots=3, timeout_s=120),
            clock=book.clock, costs=pool.costs,
        )  # fmt: skip
        return driver.run(), pool


def test_waterlevel_switches_cells_at_runtime(tiny_path, tokenizer):
    result, pool = _run(tiny_path, tokenizer, WaterlevelPolicy())
    assert [s["step"] for s in result.steps] == [1, 2, 3]
    to = [r.to for r in result.switches]
    assert Role.TRAINING in to, "a cell moved to training while agents waited on tools"
    states = {(cell, state) for cell, state, _, _ in result.timeline}
    assert any(state == "training" for _, state in states) and any(
        state == "switching" for _, state in states
    )
    assert all(r.phases for r in result.switches)
    assert sum(result.staleness.values()) > 0
    assert pool.board.version == 3
    assert 0.0 < result.busy_fraction(0) <= 1.0


@pytest.mark.slow
def test_a_static_split_trains_on_its_training_cell(tiny_path, tokenizer):
    result, _ = _run(tiny_path, tokenizer, StaticSplitPolicy(rollout_cells=1), steps=2)
    assert len(result.steps) == 2 and not result.switches
    assert all(s["cells"] == [1] for s in result.steps), "cell 1 trains, the core steps"
