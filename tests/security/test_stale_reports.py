"""Every backend's elastic step reports the tokens its loss left out as stale (issue 34).

``gyre train --elastic`` bounds staleness in the loss (``algorithm.loss.max_staleness``):
tokens sampled too many weight versions behind the core get weight 0 and are counted as
``stale_tokens`` in the step's metrics, which the driver logs. The torch backend's cells
reported the count; the Megatron backend's ``accumulate_grads`` dropped it, so a Megatron
core step (``CoreStep``) said nothing of what it left out. Here a Megatron core and
satellite step a batch with stale episodes and must count exactly the stale loss tokens,
the same count as the torch cells. (``RayCoreStep``, which sums the rank actors' parts,
is checked in ``tests/scheduler/test_ray_cells.py``, where a local Ray runs.)
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "trainers"))

if os.environ.get("CI"):
    import megatron.core  # noqa: F401  CI installs the extra: a missing one must fail
else:
    pytest.importorskip("megatron.core", reason="pip install 'gyre-env[megatron]'")

from gyre_env.trainers.losses import LossConfig  # noqa: E402
from test_megatron import megatron_world, model_dir  # noqa: E402, F401  (fixtures)
from test_torch_trainer import _batch, _group  # noqa: E402


def _stale_count(units, current: int, bound: int) -> int:
    """Loss tokens with a weight whose version lags ``current`` by more than ``bound``."""
    total = 0
    for u in units:
        t = u.tensors("cpu")
        sel = t["loss_mask"]
        lagging = t["weight_versions"][sel] < current - bound
        total += int((lagging & (t["weights"][sel] > 0)).sum())
    return total


def test_a_megatron_core_step_counts_the_stale_tokens_like_the_torch_one(
    megatron_world,  # noqa: F811  (the fixture imported above)
    model_dir,  # noqa: F811
):
    from gyre_env.trainers.megatron import MegatronTrainer, MegatronTrainerConfig
    from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig

    from gyre_env.scheduler.core_cell import CoreStep

    bound = 2
    loss = LossConfig(max_staleness=bound)
    common = dict(lr=1e-3, device="cpu")

    def megatron():
        return MegatronTrainer(model_dir, MegatronTrainerConfig(**common), loss)

    def torch_trainer():
        return TorchTrainer(model_dir, TorchTrainerConfig(**common), loss)

    units = _batch(_group(np.random.default_rng(3), versions=[10, 9, 11, 5])).units
    want = _stale_count(units, 11, bound)
    assert want > 0  # episode 3's tokens, 6 versions behind
    got = CoreStep(megatron(), version=11).step(units, [megatron()])
    torch_got = CoreStep(torch_trainer(), version=11).step(units, [torch_trainer()])
    assert got["stale_tokens"] == torch_got["stale_tokens"] == want, (got, torch_got)
    assert got["loss"] != 0.0  # the fresh episodes still train
    # a share with no units reports zero, not nothing
    assert megatron().accumulate_grads([], "rl", 1.0, 11)["stale_tokens"] == 0.0
