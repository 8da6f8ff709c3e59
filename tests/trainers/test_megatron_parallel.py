"""The Megatron backend over two gloo processes on CPU (fp32):

- data parallel 2 (megatron's ``DistributedDataParallel``, each rank training on half the
  packed units) gives the losses, gradient norms and weights of one process on all units;
- tensor parallel 2 (megatron's column/row-parallel layers, vocab-parallel embedding and
  output layer, the clip's norm summed over the TP group) gives the same.

Both run in the same two spawned processes (one start-up), one after the other.
"""

from __future__ import annotations

import os
import socket
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

if os.environ.get("CI"):
    import megatron.core  # noqa: F401  CI installs the extra: a missing one must fail
else:
    pytest.importorskip("megatron.core", reason="pip install 'gyre-env[megatron]'")

TOL = 1e-4


def _batches():
    from test_torch_trainer import _batch, _group

    rng = np.random.default_rng(0)
    return [_batch(_group(rng) + _group(rng), budget=250) for _ in range(3)]


def _config(tp: int, threads: int | None = None):
    from gyre_env.trainers.megatron import MegatronTrainerConfig

    return MegatronTrainerConfig(
        lr=3e-3,
        warmup_steps=1,
        grad_clip=0.01,
        device="cpu",
        tensor_parallel=tp,
        num_threads=threads,
    )


def _run(trainer, batches, share) -> dict:
    """Three steps; each loss summed over the ranks that split the units."""
    import torch.distributed as dist
    from gyre_env.trainers.protocol import TrainBatch

    metrics, local = [], []
    for batch in batches:
        m = trainer.train_step(TrainBatch(units=share(batch.units)))
        loss = torch.tensor([m["loss"]], dtype=torch.float64)
        if share(batch.units) != batch.units:
            dist.all_reduce(loss)  # each rank's loss is its share over the global normalizer
        metrics.append((float(loss), m["grad_norm"]))
        local.append(m["loss"])
    return {"metrics": metrics, "local": local, "state": dict(trainer.named_parameters())}


def _rank(rank: int, world: int, folder: str, port: int, out: str) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from gyre_env.trainers.megatron import MegatronTrainer
    from gyre_env.trainers.megatron.model import shutdown_parallel
    from megatron.core import parallel_state as ps

    batches = _batches()
    results = {}
    dp = MegatronTrainer(folder, _config(tp=1, threads=1))
    assert ps.get_data_parallel_world_size() == world
    results["dp"] = _run(dp, batches, lambda units: units[rank::world])
    shutdown_parallel()  # keeps the group this function started; megatron's state goes
    tp = MegatronTrainer(folder, _config(tp=world, threads=1))
    assert ps.get_tensor_model_parallel_world_size() == world
    qkv = tp.model.decoder.layers[0].self_attention.linear_qkv.weight
    results["tp_local_qkv_rows"] = qkv.shape[0]
    results["tp"] = _run(tp, batches, lambda units: units)
    if rank == 0:
        torch.save(results, out)
    dist.barrier()  # rank 0 has saved before anyone tears down
    dist.destroy_process_group()
    # The work is done and saved. Leave without the interpreter's teardown: gloo's
    # threads can abort it ("terminate called without an active exception", SIGABRT),
    # which failed one full CI run under load although every rank had finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _compare(name, got, want_metrics, want_state) -> float:
    for (loss, norm), (want_loss, want_norm) in zip(got["metrics"], want_metrics, strict=True):
        assert loss == pytest.approx(want_loss, abs=TOL), name
        assert norm == pytest.approx(want_norm, rel=1e-4), name
    assert set(got["state"]) == set(want_state)
    worst = max(float((got["state"][k] - v).abs().max()) for k, v in want_state.items())
    loss_diff = max(abs(a[0] - b[0]) for a, b in zip(got["metrics"], want_metrics, strict=True))
    print(f"{name}: loss max abs diff {loss_diff:.3e}, weights {worst:.3e}")
    assert worst <= TOL, name
    return worst


@pytest.mark.slow
def test_data_and_tensor_parallel_over_two_gloo_ranks(tmp_path):
    import torch.multiprocessing as mp
    from gyre_env.trainers.hf_tree import tiny_qwen2

    folder = tmp_path / "model"
    tiny_qwen2(vocab_size=64, hidden_size=32, num_heads=4, num_kv_heads=2, seed=3).save_pretrained(
        folder
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "two.pt"
    batches = _batches()
    assert all(len(b.units) >= 2 for b in batches)
    mp.spawn(_rank, args=(2, str(folder), port, str(out)), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    assert two["tp_local_qkv_rows"] == (4 + 2 * 2) * 8 // 2  # each rank holds one kv group

    # one Megatron process on all units (itself equal to the torch backend, test_megatron.py)
    from gyre_env.trainers.megatron import MegatronTrainer
    from gyre_env.trainers.megatron.cpu_shim import remove_cpu_shim
    from gyre_env.trainers.megatron.model import shutdown_parallel

    try:
        one = MegatronTrainer(folder, _config(tp=1))
        one_metrics = [(m["loss"], m["grad_norm"]) for m in map(one.train_step, batches)]
        one_state = dict(one.named_parameters())
    finally:
        shutdown_parallel()
        remove_cpu_shim()
    # rank 0 trained on its share only: its own loss is part of the total
    assert all(abs(a - t[0]) > 1e-3 for a, t in zip(two["dp"]["local"], one_metrics, strict=True))
    _compare("data parallel 2 vs 1 process", two["dp"], one_metrics, one_state)
    _compare("tensor parallel 2 vs 1 process", two["tp"], one_metrics, one_state)
