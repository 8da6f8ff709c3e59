"""What the elastic driver tells the policy: the cells in the running step (``in_step``)
and the groups finished without a learning signal (``groups_discarded``), on stand-in
cells (no engines, no trainers)."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

from gyre_env.scheduler.driver import ElasticDriver
from gyre_env.scheduler.policy import Role, SwitchCosts, staleness_admits


def _cell(i: int, role: Role):
    return SimpleNamespace(
        id=i, name=f"cell{i}", role=role, switching=False, last_switch=0.0, switch_started=0.0,
        weight_version=0,
        engine=SimpleNamespace(config=SimpleNamespace(max_batch_size=4)), costs=SwitchCosts(),
        trainer=None, board=SimpleNamespace(version=0), on_migration_failed=None,
    )  # fmt: skip


class _Groups:
    """Groups are their rewards; one without spread carries no signal."""

    def run_group(self, index):
        return [1.0, 1.0] if index % 2 else [0.0, 1.0]

    def units(self, groups):
        return []

    def tokens(self, group):
        return 10

    def has_signal(self, group):
        return len(set(group)) > 1


def _admitted(driver, n: int) -> None:
    """``n`` groups admitted (as ``_admit`` does, without the agents' thread pool)."""
    for _ in range(n):
        driver._pending.append(driver._started)
        driver._started += 1


def _driver(workload):
    cells = [_cell(0, Role.TRAINING), _cell(1, Role.TRAINING), _cell(2, Role.ROLLOUT)]
    replicas = [
        SimpleNamespace(name=c.name, inflight=0, paused_until=0.0, excluded=None) for c in cells
    ]
    router = SimpleNamespace(replicas=replicas, waiting=0)
    return ElasticDriver(cells, policy=None, workload=workload, call=None, router=router)


def test_the_driver_reports_the_cells_in_the_running_step():
    driver = _driver(_Groups())
    assert driver.observe().in_step == ()
    driver._step, driver._step_cells = concurrent.futures.Future(), {1}
    obs = driver.observe()
    assert obs.step_running and obs.in_step == (False, True, False)


def test_groups_without_signal_are_discarded_and_do_not_count_against_the_bound():
    driver = _driver(_Groups())
    _admitted(driver, 4)
    for index in range(4):
        driver._group(index)
    obs = driver.observe()
    assert obs.groups_ready == 2 and obs.groups_discarded == 2 and obs.groups_trained == 2
    # the two discarded groups free their places under the staleness bound
    assert staleness_admits(obs, 2) == 3 * obs.groups_per_step + 2 - 4 > 0
    # a workload without ``has_signal`` trains on every group
    plain = _driver(SimpleNamespace(run_group=lambda i: [1.0], tokens=lambda g: 1))
    _admitted(plain, 1)
    plain._group(0)
    assert plain.observe().groups_discarded == 0 and plain.observe().groups_ready == 1


def test_a_step_takes_the_stalest_ready_groups_first():
    """A group that started on an older trainer version goes stale first if left for the
    next step: the step takes ready groups by the version they started on, not by the
    order they finished in."""
    driver = _driver(SimpleNamespace(run_group=lambda i: [float(i), 1.0], tokens=lambda g: 1))
    _admitted(driver, 3)
    driver.core = SimpleNamespace(version=2)
    driver._group(1)
    driver._group(2)  # started (and finished) on version 2
    driver.core.version = 0
    driver._group(0)  # stands for a long group started on version 0 that finished last
    assert [g[0] for g in driver._ready] == [1.0, 2.0, 0.0]  # the order they finished in
    with driver._lock:
        take = driver._take(2)
    assert sorted(g[0] for g in take) == [0.0, 1.0]  # the stalest, then the first finished
    assert [g[0] for g in driver._ready] == [2.0] and len(driver._ready_v0) == 1


def test_calls_a_cell_holds_beyond_its_capacity_are_the_queue_not_served():
    """The router does not cap a replica at its batch: what a cell holds past it waits for
    a slot there, and the policy sees it as queue (high water), as the router's own."""
    driver = _driver(_Groups())
    driver.router.replicas[2].inflight, driver.router.waiting = 7, 1  # capacity 4
    obs = driver.observe()
    assert obs.in_flight == (0, 0, 4) and obs.queue == 3 + 1 and obs.waterlevel == 8


def test_groups_finishing_after_the_last_step_are_dropped():
    """The run ends with its last step: a group still running then is not trained on, not
    counted, and the workload is told to stop (``stop()``) instead of being waited for."""
    stopped = []
    workload = SimpleNamespace(
        run_group=lambda i: [0.0, 1.0], tokens=lambda g: 1, stop=lambda: stopped.append(1)
    )
    driver = _driver(workload)
    driver.config.steps = 0  # nothing to do: the run ends at once
    driver.policy = SimpleNamespace(decide=lambda obs: None)
    result = driver.run()
    assert stopped == [1] and result.wall_s >= 0.0
    _admitted(driver, 1)
    driver._group(0)
    assert driver.observe().groups_ready == 0 and result.groups_run == 0


def test_tool_delays_are_jittered_the_same_way_in_every_run():
    """``tool_jitter``: each call waits ``tool_delay_s`` x U(1 +- j), fixed by session and
    turn (every policy's run of a group waits the same); stopped, a group ends at once."""
    from gyre_env.scheduler.chat_workload import RecordBook, ToolLoopConfig, ToolLoopWorkload

    def workload(jitter):
        cfg = ToolLoopConfig(tool_delay_s=1.0, tool_jitter=jitter)
        return ToolLoopWorkload(lambda s: "http://unused", RecordBook(), cfg)

    a, b = workload(0.5), workload(0.5)
    delays = [a.tool_delay(f"g{i}.e0", t) for i in range(50) for t in range(3)]
    assert delays == [b.tool_delay(f"g{i}.e0", t) for i in range(50) for t in range(3)]
    assert all(0.5 <= d <= 1.5 for d in delays) and len(set(delays)) == len(delays)
    assert 0.9 < sum(delays) / len(delays) < 1.1
    assert workload(0.0).tool_delay("g0.e0", 0) == 1.0
    a.stop()  # no model call is made (the URL is never used)
    assert a.run_group(0).trees == []


def test_tool_loop_phases_shape_their_groups_in_order_and_repeat():
    """A changing load (``benchmarks/elastic.py --changing-load``): group ``i`` takes its
    phase's turns and tool scale, the phases cycling; a bad phase is refused by name."""
    import pytest

    from gyre_env.scheduler.chat_workload import (
        RecordBook,
        ToolLoopConfig,
        ToolLoopPhase,
        ToolLoopWorkload,
    )

    phases = [ToolLoopPhase(groups=2, turns=1, tool_scale=0.5), ToolLoopPhase(groups=1)]
    cfg = ToolLoopConfig(turns=4, tool_delay_s=2.0, phases=phases)
    assert [cfg.turns_of(i) for i in range(6)] == [1, 1, 4, 1, 1, 4]
    w = ToolLoopWorkload(lambda s: "http://unused", RecordBook(), cfg)
    assert [w.tool_delay(f"g{i}.e0", 0, i) for i in range(3)] == [1.0, 1.0, 2.0]
    assert w.tool_delay("g0.e0", 0) == 2.0  # no group named: the base delay
    assert ToolLoopConfig().phase_of(3) is None and ToolLoopConfig().turns_of(3) == 3
    with pytest.raises(ValueError, match="turns >= 1"):
        ToolLoopPhase(groups=1, turns=0)
    with pytest.raises(ValueError, match="tool_scale > 0"):
        ToolLoopPhase(groups=1, tool_scale=0.0)
