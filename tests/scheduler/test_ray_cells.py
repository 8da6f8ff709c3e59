"""The core and a satellite as Ray actors in a placement group (Ray in local mode): their
gloo step equals one ``TorchTrainer.train_step``, only the core holds optimizer state, and
a rank that was away past the staleness bound is synced by the heartbeat."""

from __future__ import annotations

import copy
import os

import pytest

if os.environ.get("CI"):
    import ray  # CI installs the extra: a missing one must fail, not skip
else:
    ray = pytest.importorskip("ray", reason="the ray extra (pip install gyre-env[ray])")

pytestmark = pytest.mark.slow


def test_ray_placed_core_and_satellite(tiny_path, make_units):
    import torch
    from gyre_env.trainers.protocol import TrainBatch
    from gyre_env.trainers.torch_backend import TorchTrainer

    from gyre_env.scheduler.core import split_units
    from gyre_env.scheduler.ray_cells import RayGroupConfig, RayTrainingGroup

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    batches = [[u for g in range(2) for u in make_units(seed=10 * s + g)] for s in range(3)]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        group = RayTrainingGroup(str(tiny_path), RayGroupConfig(ranks=2, staleness_bound=1))
        try:
            group.step(split_units(batches[0], 2))
            for units in batches[1:]:  # rank 1 away serving: no share, no pull
                group.step([units, []], pull=[True, False])
            assert group.call("version") == [3, 1]
            assert group.beat() == [1]
            assert group.call("version") == [3, 3]
            assert group.call("has_optimizer_state") == [True, False]
            weights = group.call("weights")
        finally:
            group.close()
    finally:
        ray.shutdown()
    reference = TorchTrainer(tiny_path)
    for units in batches:
        reference.train_step(TrainBatch(units=copy.deepcopy(units), kind="rl"))
    for name, want in reference.model.state_dict().items():
        assert all(torch.allclose(w[name], want, atol=1e-5) for w in weights), name
