"""What the elastic driver tells the policy: the cells in the running step (``in_step``)
and the groups finished without a learning signal (``groups_discarded``), on stand-in
cells (no engines, no trainers)."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace

from gyre_env.scheduler.elastic import ElasticDriver
from gyre_env.scheduler.policy import Role, SwitchCosts, staleness_admits


def _cell(i: int, role: Role):
    return SimpleNamespace(
        id=i, name=f"cell{i}", role=role, switching=False, last_switch=0.0, weight_version=0,
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
    replicas = [SimpleNamespace(name=c.name, inflight=0) for c in cells]
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
