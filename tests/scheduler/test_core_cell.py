"""The core cell and satellites: gradients of shares summed at the core equal one
``TorchTrainer.train_step`` over the whole batch (in-process, and across three real
processes over gloo), satellites hold no optimizer state, and a rank that was away past
the staleness bound is detected by the heartbeat and synced."""

from __future__ import annotations

import copy
import pickle
import socket
import subprocess
import sys
import textwrap

import pytest

from gyre_env.scheduler.core_cell import CoreStep, split_units, with_reference
from gyre_env.scheduler.versions import STALE_WEIGHTS_DETECTED, Heartbeat, HeartbeatConfig


def _batches(make_units, steps=3, groups=3):
    return [[u for g in range(groups) for u in make_units(seed=10 * s + g)] for s in range(steps)]


def _assert_same_weights(a, b, atol=1e-6):
    import torch

    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.allclose(x, y, atol=atol), name


def test_split_units_balances_tokens(make_units):
    units = _batches(make_units, steps=1, groups=5)[0]
    shares = split_units(units, 3)
    assert sorted(id(u) for s in shares for u in s) == sorted(id(u) for u in units)
    assert all(shares)


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_in_process_core_step_equals_one_train_step(tiny_path, make_units, kl_coef):
    """With a KL term too: every trainer of the step freezes its reference when it is
    built (``with_reference``), the single trainer at its first step: the same weights.

    The weights agree to 2e-5 (a fifteenth of one step's ``lr``), with Adam's ``eps`` at
    1e-6, not 1e-8. The KL term's gradient on the second step is ~1e-7 per element, a
    difference of nearly equal logprobs, so the shares summed in another order change it
    by a few percent; Adam divides each element by its own RMS, and at ``eps`` 1e-8 that
    turned the noise into a step of up to ``lr`` either way, depending on the torch thread
    count (it failed at 1, 3 and 4 threads, passed at 2). Loss and gradient norm still
    agree to 1e-4, which a missing or doubled share would break."""
    from gyre_env.trainers.losses import LossConfig
    from gyre_env.trainers.protocol import TrainBatch
    from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig

    def trainer():
        return with_reference(
            TorchTrainer(tiny_path, TorchTrainerConfig(eps=1e-6), LossConfig(kl_coef=kl_coef))
        )

    reference = TorchTrainer(tiny_path, TorchTrainerConfig(eps=1e-6), LossConfig(kl_coef=kl_coef))
    core = trainer()
    satellites = [trainer() for _ in range(2)]
    step = CoreStep(core)
    for i, units in enumerate(_batches(make_units, steps=3)):
        want = reference.train_step(TrainBatch(units=units, kind="rl"))
        got = step.step(units, satellites)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        if kl_coef and i:  # the KL term is in the loss once the weights moved
            assert want["kl_ref"] > 0
        _assert_same_weights(core, reference, atol=2e-5)
        for sat in satellites:  # pull the published version
            sat.model.load_state_dict(core.model.state_dict())
            assert not sat.optimizer.state, "satellites never step"
    assert step.version == 3


def test_heartbeat_interval_adapts_and_flags_stale_cells(caplog):
    hb = Heartbeat(HeartbeatConfig(min_interval_s=0.5, max_interval_s=2.0, staleness_bound=2))
    assert hb.beat(1, {0: 1, 1: 1}) == [] and hb.interval_s == 0.5
    hb.beat(1, {0: 1, 1: 1})
    hb.beat(1, {0: 1, 1: 1})
    assert hb.interval_s == 2.0, "doubles while nothing moves, up to the max"
    with caplog.at_level("WARNING"):
        assert hb.beat(4, {0: 4, 1: 1}) == [1]
    assert hb.interval_s == 0.5 and STALE_WEIGHTS_DETECTED in caplog.text


WORKER = textwrap.dedent(
    """
    import logging, pickle, sys
    import torch
    from gyre_env.scheduler.core_cell import GroupConfig, TrainingGroup, split_units
    from gyre_env.scheduler.versions import HeartbeatConfig
    from gyre_env.trainers.torch_backend import TorchTrainer

    logging.basicConfig(level=logging.WARNING)
    rank, world, port, data, out = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6]
    torch.set_num_threads(1)
    model, batches = pickle.load(open(data, "rb"))
    group = TrainingGroup(TorchTrainer(model), GroupConfig(
        rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
        heartbeat=HeartbeatConfig(staleness_bound=1)))
    group.step(split_units(batches[0], world)[rank])
    away = world - 1
    for units in batches[1:]:  # the last rank is away serving: no share, no pull
        share = split_units(units, world - 1)[rank] if rank < away else []
        group.step(share, pull=rank < away)
    before = group.version
    stale = group.beat(force=True)
    state = {k: v.clone() for k, v in group.trainer.model.state_dict().items()}
    opt = group.trainer.optimizer
    torch.save({"before": before, "after": group.version, "stale": stale, "weights": state,
                "opt_state": 0 if opt is None else len(opt.state)}, out)
    group.close()
    """
)


WORLD = 2
"""Ranks in the gloo test: the core and one satellite (3 ranks pass too; each process
costs ~15 s of imports on a loaded 2-core machine)."""


@pytest.mark.slow
def test_gloo_core_and_satellites(tiny_path, make_units, tmp_path):
    import torch
    from gyre_env.trainers.protocol import TrainBatch
    from gyre_env.trainers.torch_backend import TorchTrainer

    batches = _batches(make_units)
    data = tmp_path / "data.pkl"
    data.write_bytes(pickle.dumps((str(tiny_path), batches)))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    outs = [tmp_path / f"rank{r}.pt" for r in range(WORLD)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(WORLD), port, str(data), str(outs[r])],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(WORLD)
    ]
    logs = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, logs
    results = [torch.load(o) for o in outs]

    reference = TorchTrainer(tiny_path)
    for units in batches:
        reference.train_step(TrainBatch(units=copy.deepcopy(units), kind="rl"))
    want = reference.model.state_dict()
    for r, res in enumerate(results):
        for name, tensor in res["weights"].items():
            assert torch.allclose(tensor, want[name], atol=1e-5), (r, name)
    assert [res["opt_state"] > 0 for res in results] == [True] + [False] * (WORLD - 1)
    away = results[-1]
    assert away["before"] == 1 and away["after"] == 3 and away["stale"] == [WORLD - 1]
    assert STALE_WEIGHTS_DETECTED in logs[0]


def test_heartbeat_tracks_only_cells_reported_now():
    hb = Heartbeat(HeartbeatConfig(staleness_bound=1))
    assert hb.beat(0, {0: 0, 1: 0}) == []
    assert hb.beat(5, {1: 5}) == [], "cell 0 left serving: its old version is not a lag"


def test_a_core_step_with_nan_gradients_leaves_the_weights(tiny_path, make_units):
    """The elastic core's optimizer step (``apply_grads``) skips NaN gradients as
    ``train_step`` does, and stops after ``max_nonfinite_steps`` in a row."""
    import torch
    from gyre_env.trainers.steps import NonFiniteStepError
    from gyre_env.trainers.torch_backend import TorchTrainer, TorchTrainerConfig

    core = TorchTrainer(tiny_path, TorchTrainerConfig(max_nonfinite_steps=2))
    before = {n: p.detach().clone() for n, p in core.named_parameters()}
    for p in core.model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    assert core.apply_grads()["skipped"] == 1.0
    for n, p in core.named_parameters():
        assert torch.equal(p, before[n]) and p.grad is None, n
    assert not core.optimizer.state
    for p in core.model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    with pytest.raises(NonFiniteStepError, match="2 non-finite steps in a row"):
        core.apply_grads()


def test_a_core_step_builds_each_units_tensors_once(tiny_path, make_units, monkeypatch):
    """The step's normalizer and its gradients read the same packed tensors: each unit's
    ``PackedTree.tensors`` is built once per core step, not once for the normalizer and
    again for ``accumulate_grads``."""
    from gyre_env.trainers.torch_backend import TorchTrainer

    from gyre_env.trajectory.packing import PackedTree

    built = []
    original = PackedTree.tensors

    def counting(self, *args, **kwargs):
        built.append(id(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PackedTree, "tensors", counting)
    units = _batches(make_units, steps=1, groups=2)[0]
    step = CoreStep(TorchTrainer(tiny_path))
    step.step(units, [TorchTrainer(tiny_path)])
    assert sorted(built) == sorted(id(u) for u in units), "each unit's tensors built once"
