"""A cell's role switch on real pieces (the tiny model's embedded engines, the torch
trainer): timed phases, in-flight requests continuing exactly on the cell that keeps
serving (with their KV, or re-prefilled past the migration window), and the cell serving
the newest published weights when it comes back."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gyre_env.engines.base import SamplingParams
from gyre_env.engines.embedded import EmbeddedEngine
from gyre_env.scheduler.cell import Cell, SwitchConfig
from gyre_env.scheduler.migration import RDMA_TRANSFER_FAILED
from gyre_env.scheduler.policy import Role, SwitchCosts
from gyre_env.scheduler.versions import WeightBoard

GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0)


@pytest.fixture
def cells(tiny_path):
    from gyre_env.trainers.torch_backend import TorchTrainer

    board, costs = WeightBoard(), SwitchCosts()
    made = []

    def make(**config):
        for i in range(2):
            engine = EmbeddedEngine(model_path=str(tiny_path), max_batch_size=8, name=f"c{i}")
            trainer = TorchTrainer(tiny_path)
            made.append(
                Cell(i, engine, trainer, board=board, costs=costs, config=SwitchConfig(**config))
            )
        return made

    yield make
    for cell in made:
        cell.engine.close()


async def _stream(engine, prompt, seen):
    ids = []
    async for chunk in engine.stream(prompt, GREEDY):
        ids.extend(chunk.ids)
        seen.append(chunk.weight_version)
    return ids


async def _switch_under_load(a, b, prompts, hold):
    """Switch ``a`` to training while ``prompts`` stream from it; ``hold`` (the
    ``hold_in_flight`` fixture) keeps them in flight until the switch takes them."""
    held, until_held = hold
    seen: list = []
    with held(a.engine, after_steps=16) as holding:
        tasks = [asyncio.create_task(_stream(a.engine, p, seen)) for p in prompts]
        await until_held(holding)
        record = await a.to_training(serving=[a, b])
        return record, await asyncio.gather(*tasks)


def test_switch_round_trip_moves_requests_and_serves_new_weights(
    cells, prompts, make_units, hold_in_flight
):
    from gyre_env.trainers.protocol import TrainBatch

    a, b = cells()
    alone = [asyncio.run(b.engine.generate(p, GREEDY)).output_ids for p in prompts]
    record, results = asyncio.run(_switch_under_load(a, b, prompts, hold_in_flight))
    assert results == alone, "every request continued exactly on the other cell"
    assert list(record.phases) == ["stop_admitting", "migrate", "release", "onload"]
    assert record.migration.requests > 0 and record.migration.with_kv > 0
    assert record.migration.targets == {"c1": record.migration.requests}
    assert a.role is Role.TRAINING and asyncio.run(a.engine.health())["status"] == "released"

    metrics = a.trainer.train_step(TrainBatch(units=make_units(), kind="rl"))
    assert metrics["grad_norm"] > 0
    a.board.publish(a.trainer.version, dict(a.trainer.named_parameters()))
    back = asyncio.run(a.to_rollout())
    assert list(back.phases) == ["offload", "resume", "load_weights", "admit"]
    assert a.role is Role.ROLLOUT and a.weight_version == back.weight_version == 1
    served = asyncio.run(a.engine.generate(prompts[0], GREEDY))
    asyncio.run(b.sync_engine())
    assert served.weight_version == 1
    assert served.output_ids == asyncio.run(b.engine.generate(prompts[0], GREEDY)).output_ids
    assert served.output_ids != alone[0], "the trained weights are served"
    assert a.costs.mean(Role.TRAINING) != SwitchCosts().mean(Role.TRAINING)
    assert a.stats.mean(Role.ROLLOUT, "resume") == back.phases["resume"]
    # on CPU the trainer's state stays put: no phase reports bytes moved
    assert record.phase_bytes == {} and back.phase_bytes == {}


def test_a_phase_that_moved_trainer_state_reports_its_bytes():
    """On CUDA the trainer's offload / onload move its state through host buffers and say
    how many bytes (``last_move_bytes``): the switch record keeps them per phase, for the
    copy rate against the machine's floor (``benchmarks/cell_switch.py``)."""
    from types import SimpleNamespace

    from gyre_env.scheduler.cell import SwitchRecord
    from gyre_env.scheduler.driver import switch_values

    record = SwitchRecord(0, Role.ROLLOUT, 0.0, phases={"offload": 0.2, "resume": 0.1})
    Cell._moved(
        SimpleNamespace(trainer=SimpleNamespace(last_move_bytes=11 * 10**9)), record, "offload"
    )
    Cell._moved(SimpleNamespace(trainer=object()), record, "resume")  # a trainer that says nothing
    assert record.phase_bytes == {"offload": 11 * 10**9}
    assert (
        "offload=200.0ms/11.00GB" in record.summary() and "resume=100.0ms/" not in record.summary()
    )
    assert switch_values(record, 0.0)["phase_bytes"] == {"offload": 11 * 10**9}


def test_migration_past_its_window_reprefills_and_reports(cells, prompts, caplog, hold_in_flight):
    failures = []
    a, b = cells(migration_window_s=0.0)
    a.on_migration_failed = failures.append
    alone = [asyncio.run(b.engine.generate(p, GREEDY)).output_ids for p in prompts]
    with caplog.at_level(logging.WARNING):
        record, results = asyncio.run(_switch_under_load(a, b, prompts, hold_in_flight))
    assert results == alone, "re-prefilled requests continue exactly"
    m = record.migration
    assert m.failed and m.with_kv == 0 and m.reprefilled == m.requests > 0
    assert failures == [m]
    assert RDMA_TRANSFER_FAILED in caplog.text


def test_a_cell_with_no_other_server_drains_before_releasing(cells, prompts, hold_in_flight):
    a, b = cells()
    b.role = Role.TRAINING  # b does not serve: a has nowhere to move its requests
    alone = [asyncio.run(a.engine.generate(p, GREEDY)).output_ids for p in prompts[:3]]
    record, results = asyncio.run(_switch_under_load(a, b, prompts[:3], hold_in_flight))
    assert results == alone and "migrate" not in record.phases
    with pytest.raises(RuntimeError, match="already in TRAINING"):
        asyncio.run(a.to_training())
