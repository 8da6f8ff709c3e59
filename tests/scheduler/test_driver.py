"""The elastic driver on real cells (two embedded engines behind the proxy, two torch
trainers) with agents whose tool calls wait: Gyre's waterlevel policy object, the very one
the simulator drives, switches cells at runtime and optimizer steps happen on whichever
cells are training; the peers' policies run on the same driver."""

from __future__ import annotations

import pytest

from gyre_env.scheduler.chat_workload import RecordBook, ToolLoopConfig, ToolLoopWorkload
from gyre_env.scheduler.driver import ElasticConfig, ElasticDriver
from gyre_env.scheduler.local_cells import LocalCells, LocalCellsConfig
from gyre_env.scheduler.peers import StaticSplitPolicy
from gyre_env.scheduler.policy import Role, WaterlevelPolicy


def _run(tiny_path, tokenizer, policy, steps=3, delay=0.3, metrics=None, profile_dir=None):
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
            config=ElasticConfig(
                steps=steps, groups_per_step=1, agent_slots=3, timeout_s=120,
                profile_dir=profile_dir,
            ),
            clock=book.clock, costs=pool.costs, metrics=metrics,
        )  # fmt: skip
        return driver.run(), pool


@pytest.fixture(scope="module")
def waterlevel_run(tiny_path, tokenizer, tmp_path_factory):
    """One waterlevel run recording into ``metrics.jsonl``, every switch profiled (shared
    by the tests below)."""
    from gyre_env.train.metrics import MetricsLogger

    out = tmp_path_factory.mktemp("elastic-run")
    with MetricsLogger(out, tensorboard=False) as metrics:
        result, pool = _run(
            tiny_path, tokenizer, WaterlevelPolicy(), metrics=metrics,
            profile_dir=str(out / "profiles"),
        )  # fmt: skip
    return result, pool, out


def test_waterlevel_switches_cells_at_runtime(waterlevel_run):
    result, pool, _ = waterlevel_run
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
    for cell in (0, 1):  # busy by role + switching + idle by reason: all of the cell's time
        f = result.cell_fractions(cell)
        reasons = sum(v for k, v in f.items() if "/idle:" in k)
        assert f["busy"] + f["switching"] + f["idle"] == pytest.approx(1.0)
        assert reasons == pytest.approx(f["idle"])


def test_report_of_an_elastic_run_has_the_cell_gantt(waterlevel_run):
    """The driver's records render into the report: a Gantt row per cell, a marker per
    switch, the busy/idle table with the idle reasons, and the steps' reward/staleness."""
    import re

    from gyre_env.train.metrics import METRICS_FILE
    from gyre_env.train.report import read_metrics, write_report

    result, _, out = waterlevel_run
    by_kind, bad = read_metrics(out / METRICS_FILE)
    assert not bad and len(by_kind["switch"]) == len(result.switches) > 0
    assert len(by_kind["cell"]) == 2 and len(by_kind["iteration"]) == 3
    assert len(by_kind["cell_state"]) == len(result.timeline)
    page = write_report(out).read_text()
    svg = page[page.index("<h2>Cell roles</h2>") :]
    assert svg.count("<svg") >= 1 and "cell 0</text>" in svg and "cell 1</text>" in svg
    for cell, state, *_ in result.timeline:  # every cell's states drawn in its own row
        assert f'id="cell{cell}-{state.replace(" ", "-")}"' in svg
    ids = re.findall(r'id="switch-(\d+)"', svg)
    assert sorted(map(int, ids)) == list(range(len(result.switches)))
    table = page[page.index("<h2>Cell busy and idle</h2>") :]
    assert "busy: rollout" in table and "idle: " in table and "cell 1</td>" in table
    assert "<h2>Switches</h2>" in page and "-&gt; TRAINING" in page
    assert "No staleness histogram was logged" not in page


@pytest.mark.slow
def test_a_static_split_trains_on_its_training_cell(tiny_path, tokenizer):
    result, _ = _run(tiny_path, tokenizer, StaticSplitPolicy(rollout_cells=1), steps=2)
    assert len(result.steps) == 2 and not result.switches
    assert all(s["cells"] == [1] for s in result.steps), "cell 1 trains, the core steps"


def test_profiling_writes_a_trace_per_switch(waterlevel_run):
    """On a CPU: a torch profiler trace per switch with its phases as ranges; no CUDA
    memory snapshot, and the record says why."""
    import json

    import torch

    result, _, out = waterlevel_run
    traces = sorted((out / "profiles").glob("*.pt.trace.json"))
    assert len(traces) == len(result.switches) > 0
    for record in result.switches:
        profile = record.profile
        events = json.loads(open(profile["trace"]).read())["traceEvents"]
        names = {e.get("name") for e in events}
        assert {f"switch.{p}" for p in record.phases} <= names, names
        if not torch.cuda.is_available():
            assert profile["memory_snapshot"] is None and "no CUDA" in profile["note"]


def test_overlapping_switches_share_one_profiler_session(tmp_path):
    import asyncio

    from gyre_env.scheduler.cell import SwitchRecord
    from gyre_env.scheduler.profile import SwitchProfiler

    profiler = SwitchProfiler(tmp_path)

    async def switch(cell, wait):
        await asyncio.sleep(wait)
        return SwitchRecord(cell, Role.TRAINING, 0.0)

    async def both():
        return await asyncio.gather(
            profiler.wrap(0, Role.TRAINING, switch(0, 0.01)),
            profiler.wrap(1, Role.TRAINING, switch(1, 0.05)),
        )

    records = asyncio.run(both())
    paths = [r.profile["trace"] for r in records]
    assert len(set(paths)) == 2 and all(open(p).read() == open(paths[0]).read() for p in paths)


def test_ray_without_the_extra_names_the_install(monkeypatch, capsys):
    """``--ray auto`` where Ray is not installed fails at once with the pip extra."""
    import sys

    from gyre_env.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    argv = ["train", "--preset", "cpu-demo", "--elastic", "--cells", "2", "--ray", "auto"]
    assert main(argv) == 2
    assert "pip install 'gyre-env[ray]'" in capsys.readouterr().err


def test_a_run_continues_from_its_state_and_core_checkpoint(tiny_path, tokenizer):
    """Stopped after step 2 of 4 (the state and the core trainer's checkpoint taken at its
    ``on_step``), a new pool continues it: steps 3 and 4 on the restored weights and
    optimizer state, its finished-but-untrained groups trained, new groups numbered after
    the first run's."""
    from gyre_env.scheduler.driver import DriverState

    def run(steps, start=None, saved=None):
        book, kept = RecordBook(), {}

        def on_step(driver):
            if len(driver.result.steps) == 2 and saved is None:
                kept["state"] = driver.state()
                kept["trainer"] = driver.cells[0].trainer.state_dict()
                kept["version"] = driver.core.version

        with LocalCells(
            tiny_path, tokenizer, LocalCellsConfig(cells=2, max_batch_size=8, switch_prior_s=0.05),
            sink=book,
        ).open() as pool:  # fmt: skip
            if saved is not None:
                pool.load_core(saved["trainer"], saved["version"])
                assert pool.cells[1].engine.weight_version == saved["version"]
            workload = ToolLoopWorkload(
                pool.proxy.openai_base_url, book,
                ToolLoopConfig(group_size=2, turns=2, tool_delay_s=0.2),
            )  # fmt: skip
            if start is not None:  # a group that had finished when the run stopped
                start.ready.append(workload.run_group(start.next_index))
                start.next_index += 1
            driver = ElasticDriver(
                pool.cells, WaterlevelPolicy(), workload, call=pool.proxy.call,
                router=pool.proxy.core.router, clock=book.clock, costs=pool.costs,
                config=ElasticConfig(steps=steps, groups_per_step=1, agent_slots=3, timeout_s=120),
                start=start, on_step=on_step,
            )  # fmt: skip
            result = driver.run()
            return result, kept, [g["index"] for g in workload.trace], pool.cells[0].trainer

    first, kept, first_groups, _ = run(2)
    state = kept["state"]
    assert isinstance(state, DriverState) and len(state.steps) == 2 and kept["version"] == 2
    assert state.next_index > max(first_groups)
    start = DriverState(
        steps=state.steps, groups_trained=state.groups_trained,
        groups_discarded=state.groups_discarded, ready=list(state.ready),
        next_index=state.next_index,
    )  # fmt: skip
    carried = state.next_index  # the group run by hand and handed over as ready
    ready = [g.index for g in state.ready] + [carried]  # finished, untrained: first, in order
    second, _, second_groups, trainer = run(4, start=start, saved=kept)
    assert [s["step"] for s in second.steps] == [1, 2, 3, 4]
    assert second.steps[:2] == state.steps
    # new groups are numbered after it (on a loaded machine the first run's ready groups
    # can feed steps 3 and 4 before any new group finishes)
    assert all(i > carried for i in set(second_groups) - {carried}), "a group's index came again"
    trained_again = [i for s in second.steps[2:] for i in s["group_index"]]
    n = min(len(trained_again), len(ready))
    assert trained_again[:n] == ready[:n], "the ready groups were not trained on first"
    # the optimizer went on from the checkpoint's state: 4 steps' worth of Adam moments
    steps_seen = {int(v["step"]) for v in trainer.optimizer.state_dict()["state"].values()}
    assert steps_seen == {4}
