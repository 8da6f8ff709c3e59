"""The elastic pool on a Ray cluster of two nodes: ``ray.cluster_utils.Cluster`` starts
two raylets on this machine (Ray's own way to test a multi-node cluster on one host),
each with one CPU. With ``SPREAD`` (what ``gyre train --elastic --ray`` picks when the
cluster has more than one node) the two cells' bundles land on different nodes; each
cell's trainer rank and engine actor run on its bundle's node; the ranks rendezvous over
gloo across the nodes, the driver switches roles and the core publishes two steps."""

from __future__ import annotations

import os

import pytest

if os.environ.get("CI"):
    import ray  # CI installs the extra: a missing one must fail, not skip
else:
    ray = pytest.importorskip("ray", reason="the ray extra (pip install gyre-env[ray])")

pytestmark = pytest.mark.slow


@pytest.fixture
def two_nodes():
    from ray.cluster_utils import Cluster

    from gyre_env.scheduler.ray_cells import connect

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        connect(cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_cells_spread_over_two_nodes(tiny_path, tokenizer, two_nodes, two_ray_steps):
    from ray.util.placement_group import placement_group_table

    from gyre_env.scheduler.chat_workload import RecordBook
    from gyre_env.scheduler.local_cells import LocalCellsConfig
    from gyre_env.scheduler.ray_cells import RayCells, RayGroupConfig

    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    book = RecordBook()
    config = LocalCellsConfig(cells=2, max_batch_size=8, switch_prior_s=0.05)
    placement = RayGroupConfig(strategy="SPREAD")
    with RayCells(tiny_path, tokenizer, config, sink=book, ray=placement).open() as pool:
        table = placement_group_table(pool.group.pg)["bundles_to_node_id"]
        bundle_nodes = [table[0], table[1]]
        assert set(bundle_nodes) == nodes, "one cell per node"
        assert [p["node"] for p in pool.group.call("placement")] == bundle_nodes, (
            "each rank on its bundle's node"
        )
        assert [c.engine.node_id for c in pool.cells] == bundle_nodes, "each engine too"
        two_ray_steps(pool, book, timeout_s=240)
