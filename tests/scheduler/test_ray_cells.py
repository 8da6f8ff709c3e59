"""The core and a satellite as Ray actors in a placement group (Ray in local mode): their
gloo step equals one ``TorchTrainer.train_step``, only the core holds optimizer state, and
a rank that was away past the staleness bound is synced by the heartbeat; and the elastic
driver on ``RayCells`` (``--ray``): every cell's trainer a rank actor in one placement
group for the pool. One local Ray for the module (its start is the slow part)."""

from __future__ import annotations

import copy
import os

import pytest

if os.environ.get("CI"):
    import ray  # CI installs the extra: a missing one must fail, not skip
else:
    ray = pytest.importorskip("ray", reason="the ray extra (pip install gyre-env[ray])")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    from gyre_env.scheduler.ray_cells import connect

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # two GPUs declared to Ray on this CPU machine: Ray hands out their ids (torch sees
    # no CUDA); only a RayGroupConfig with gpus_per_rank asks for them
    connect("local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _three_steps(tiny_path, config, batches) -> list[dict]:
    """Three steps on two rank actors, the satellite away (no share, no pull) for the
    last two; the heartbeat then syncs it. Every rank's weights."""
    from gyre_env.scheduler.core_cell import split_units
    from gyre_env.scheduler.ray_cells import RayTrainingGroup

    group = RayTrainingGroup(str(tiny_path), config)
    try:
        group.step(split_units(batches[0], 2))
        for units in batches[1:]:
            group.step([units, []], pull=[True, False])
        assert group.call("version") == [3, 1]
        assert group.beat() == [1]
        assert group.call("version") == [3, 3]
        assert group.call("has_optimizer_state") == [True, False]
        return group.call("weights")
    finally:
        group.close()


def test_ray_placed_core_and_satellite(tiny_path, make_units, local_ray):
    import torch
    from gyre_env.trainers.protocol import TrainBatch
    from gyre_env.trainers.torch_backend import TorchTrainer

    from gyre_env.scheduler.ray_cells import RayGroupConfig

    batches = [[u for g in range(2) for u in make_units(seed=10 * s + g)] for s in range(3)]
    weights = _three_steps(tiny_path, RayGroupConfig(ranks=2, staleness_bound=1), batches)
    reference = TorchTrainer(tiny_path)
    for units in batches:
        reference.train_step(TrainBatch(units=copy.deepcopy(units), kind="rl"))
    for name, want in reference.model.state_dict().items():
        assert all(torch.allclose(w[name], want, atol=1e-5) for w in weights), name


def test_ray_placed_megatron_core_and_satellite(tiny_path, make_units, local_ray):
    """``trainer="megatron"``: each rank actor joins the gloo group, then builds a
    megatron-core trainer (CPU shim) whose parallel state spans the group; the satellite's
    grad buffers reduce to the core, which alone holds optimizer state and steps. With a KL
    term and an entropy bonus, three steps (the satellite away for two) give, on every
    rank, the weights of one megatron ``train_step`` per whole batch in this process."""
    import torch
    from gyre_env.trainers.losses import LossConfig
    from gyre_env.trainers.protocol import TrainBatch

    from gyre_env.scheduler.core_cell import with_reference
    from gyre_env.scheduler.ray_cells import RayGroupConfig

    if not os.environ.get("CI"):
        pytest.importorskip("megatron.core", reason="pip install 'gyre-env[megatron]'")
    from gyre_env.trainers.megatron import MegatronTrainer, MegatronTrainerConfig
    from gyre_env.trainers.megatron.cpu_shim import remove_cpu_shim
    from gyre_env.trainers.megatron.model import shutdown_parallel

    loss = LossConfig(kl_coef=0.1, entropy_coef=0.01)
    config = MegatronTrainerConfig(lr=3e-3, warmup_steps=2, device="cpu", grad_clip=0.01)
    batches = [[u for g in range(2) for u in make_units(seed=10 * s + g)] for s in range(3)]
    ranks = RayGroupConfig(
        ranks=2, staleness_bound=1, trainer="megatron", trainer_configs=(config, loss)
    )
    weights = _three_steps(tiny_path, ranks, batches)
    try:  # the reference: one process, megatron's own one-rank group
        reference = with_reference(MegatronTrainer(tiny_path, config, loss))
        start = dict(reference.named_parameters())
        for units in batches:
            reference.train_step(TrainBatch(units=copy.deepcopy(units), kind="rl"))
        want = dict(reference.named_parameters())
    finally:
        shutdown_parallel()
        remove_cpu_shim()
    worst = max(float((w[k] - want[k]).abs().max()) for w in weights for k in want)
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    print(f"megatron ranks on Ray vs one megatron train_step per batch: {worst:.3e}")
    assert set(weights[0]) == set(want) and worst <= 1e-5 and moved > 1e-3
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in want), "the heartbeat synced"


def test_elastic_driver_on_ray_cells(tiny_path, tokenizer, local_ray, two_ray_steps):
    """Cells switch at runtime, steps run on the rank actors, the core publishes."""
    from ray.util.placement_group import placement_group_table

    from gyre_env.engines.ray_engine import RayEngine
    from gyre_env.scheduler.chat_workload import RecordBook
    from gyre_env.scheduler.local_cells import LocalCellsConfig
    from gyre_env.scheduler.ray_cells import RayCells

    book = RecordBook()
    config = LocalCellsConfig(cells=2, max_batch_size=8, switch_prior_s=0.05)
    with RayCells(tiny_path, tokenizer, config, sink=book).open() as pool:
        table = placement_group_table(pool.group.pg)
        assert len(table["bundles"]) == 2, "one placement group, a bundle per cell"
        engines = [c.engine for c in pool.cells]
        assert all(isinstance(e, RayEngine) for e in engines), "the engines are actors too"
        assert len({e.pid for e in engines} | {os.getpid()}) == 3, "each in its own process"
        assert [e.node_id for e in engines] == [table["bundles_to_node_id"][i] for i in (0, 1)]
        result = two_ray_steps(pool, book, timeout_s=120)
        # the ranks' stale-token counts reach the driver, as the local cells' do
        assert all(s["stale_tokens"] == 0.0 for s in result.steps), result.steps
        assert pool.group.call("has_optimizer_state") == [True, False]
        moved = [r.migration for r in result.switches if r.migration is not None]
        assert all(m.transport == "ray object store (via the driver)" for m in moved)


def test_a_cluster_address_nothing_answers_at_is_named():
    """``--ray HOST:PORT`` with no cluster there: one clear error at once, not minutes of
    GCS retries from ``ray.init``."""
    import socket

    from gyre_env.config import ConfigError
    from gyre_env.scheduler.ray_cells import _check_reachable

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens
    with pytest.raises(ConfigError, match=f"127.0.0.1:{port}: no Ray cluster answers there"):
        _check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="expected auto, local or HOST:PORT"):
        _check_reachable("nonsense")


def test_an_address_where_something_else_answers_is_named(local_ray):
    """``--ray HOST:PORT`` where something answers that is not Ray's head (a wrong port:
    ray.init would retry for minutes, then raise): one clear error at once. The check
    (Ray's head is a gRPC server, so it speaks HTTP/2) passes for a real head, this
    module's local Ray; and a head that refuses to join still gives a clear error."""
    import socket
    import threading

    from gyre_env.config import ConfigError
    from gyre_env.scheduler import ray_cells

    ray_cells._check_reachable(ray.get_runtime_context().gcs_address)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer():  # an HTTP/1.1 server's 404 to whatever comes
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(ConfigError) as raised:
            ray_cells._check_reachable(f"127.0.0.1:{port}")
    assert str(raised.value).startswith(
        f"--ray 127.0.0.1:{port}: something answers there, but not a Ray cluster's head "
        "(no gRPC: it answered b'HTTP/1.1 ')"
    )

    def refused(address=None, **_):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    with pytest.MonkeyPatch.context() as patch:  # what ray.init raises when it gives up
        patch.setattr(ray, "is_initialized", lambda: False)
        patch.setattr(ray, "init", refused)
        patch.setattr(ray_cells, "_check_reachable", lambda address: None)
        with pytest.raises(ConfigError, match="something answers there, but not a Ray"):
            ray_cells.connect("127.0.0.1:1")


def test_cells_get_a_gpu_each_where_the_cluster_has_them(
    tiny_path, tokenizer, local_ray, monkeypatch
):
    """``--ray`` on a cluster with a GPU per cell (the fixture's two declared GPUs): each
    cell's rank and engine share one GPU, the two cells different ones; the ranks' backend
    is NCCL where the actor sees CUDA, gloo here (the CUDA path: benchmarks/gpu). Fewer
    CPUs or GPUs than the cells need is refused at once, naming both counts (the placement
    group would otherwise wait for resources that never come)."""
    from gyre_env.config import ConfigError
    from gyre_env.scheduler.chat_workload import RecordBook
    from gyre_env.scheduler.local_cells import LocalCellsConfig
    from gyre_env.scheduler.ray_cells import RayCells, RayGroupConfig, cell_devices

    devices = cell_devices(2)
    assert devices == {"gpus_per_rank": 1.0, "backend": "auto"}
    with pytest.raises(ConfigError, match=r"--cells 3: the Ray cluster has 2 CPUs, each"):
        cell_devices(3)
    with monkeypatch.context() as m:  # a cluster with CPUs to spare, as Ray reports it
        m.setattr(local_ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
        with pytest.raises(ConfigError, match=r"--cells 3: the Ray cluster has 2 GPUs"):
            cell_devices(3)
    config = LocalCellsConfig(cells=2, max_batch_size=8)
    ray_config = RayGroupConfig(**devices)
    with RayCells(tiny_path, tokenizer, config, sink=RecordBook(), ray=ray_config).open() as pool:
        ranks = pool.group.call("placement")
        engine_gpus = [c.engine.gpu_ids for c in pool.cells]
    print(f"ranks {ranks}, engines {engine_gpus}")
    assert [r["gpus"] for r in ranks] == engine_gpus, "a cell's rank and engine: one GPU"
    assert all(len(g) == 1 for g in engine_gpus) and engine_gpus[0] != engine_gpus[1]
    assert [(r["backend"], r["device"]) for r in ranks] == [("gloo", "cpu")] * 2
