"""``gyre train`` with ``rollout.engine = "sglang"``: the rollouts served by SGLang
servers, the weights pushed to them after each optimizer step, the cells switching them.

SGLang needs a GPU and has no CPU kernels, so the servers here are FAKES of its HTTP API
(tests/engines/fake_sglang.py, the shapes of SGLang v0.5.6) that sample real tokens and
logprobs from the run's own tiny model with Gyre's embedded engine, in this process.
Everything of Gyre's is real: the config, the preflight, SGLangEngine's HTTP traffic, the
proxy, the sandboxes and scoring, the store, the packing, the torch trainer, the disk
weight sync (safetensors folders the fake loads) and the elastic cells. What a real
server would add is checked by ``benchmarks/gpu/sglang_check.py --train`` on a GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gyre_env.train.config import ConfigError, apply_overrides, load_config

sys.path.insert(0, str(Path(__file__).parents[1] / "engines"))
from fake_sglang import FakeServer, FakeState  # noqa: E402

TINY = [
    "schedule.epochs=1",  # the toy makes one pass over each iteration's groups
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
    "model.context_length=1024", "tasks.train_count=50", "tasks.heldout_count=2",
    "rollout.group_size=2", "rollout.tasks_per_iteration=2", "rollout.max_new_tokens=16",
    "rollout.max_steps=1", "logging.progress=false", "schedule.eval_random=false",
    "sft.trajectories=0", "algorithm.skip_zero_variance=false", "rollout.engine='sglang'",
    "rollout.sglang.weight_sync='disk'",
]  # fmt: skip


def _cfg(tmp_path, urls, *more):
    return apply_overrides(
        load_config(preset="cpu-demo"),
        [*TINY, f"out={str(tmp_path / 'run')!r}", f"rollout.sglang.urls={json.dumps(urls)}",
         *more],
    )  # fmt: skip


def _servers(n: int, model_dir, context_length: int = 1024) -> list[FakeServer]:
    servers = []
    for _ in range(n):
        state = FakeState(model_path=str(model_dir), context_length=context_length)
        state.start_model()
        servers.append(FakeServer(state))
    return servers


@pytest.fixture
def model_dir(tmp_path):
    """The run's model (the tiny Qwen2 of TINY's shape, as ``gyre train`` builds it)."""
    from gyre_env.train.setup import prepare_model

    return prepare_model(_cfg(tmp_path, ["http://127.0.0.1:1"]))


@pytest.fixture
def servers(model_dir, request):
    running = _servers(getattr(request, "param", 1), model_dir)
    yield running
    for server in running:
        server.stop()


def _rows(out, kind):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


# ---- bad input, refused before any work ------------------------------------------------
def test_config_refuses_unknown_keys_and_half_settings(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'rollout.sglang.url'"):
        apply_overrides(load_config(preset="cpu-demo"), ["rollout.sglang.url='http://x:1'"])
    with pytest.raises(ConfigError, match="urls .* or launch = true"):
        apply_overrides(load_config(preset="cpu-demo"), ["rollout.engine='sglang'"])
    with pytest.raises(ConfigError, match="rollout.engine must be one of"):
        apply_overrides(load_config(preset="cpu-demo"), ["rollout.engine='vllm'"])
    with pytest.raises(ConfigError, match="weight_sync must be one of"):
        _cfg(tmp_path, ["http://127.0.0.1:1"], "rollout.sglang.weight_sync='nfs'")
    with pytest.raises(ConfigError, match="2 elastic cells; give one server per cell"):
        _cfg(tmp_path, ["http://127.0.0.1:1"], "elastic.enabled=true", "elastic.cells=2")
    with pytest.raises(ConfigError, match="rollout.engine = 'sglang'"):
        apply_overrides(load_config(preset="cpu-demo"), ["rollout.sglang.tp_size=2"])


def _refused(cfg, match):
    """``gyre train`` refuses ``cfg`` naming the cause, having written nothing."""
    from gyre_env.train import train

    with pytest.raises(ConfigError, match=match):
        train(cfg)
    assert not (cfg.out_dir / "store.db").exists()


def test_an_url_nobody_answers_is_named(tmp_path, model_dir):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    _refused(_cfg(tmp_path, [url]), rf"rollout.sglang.urls\[0\] = '{url}': no SGLang server")


def test_a_server_of_another_model_is_named(tmp_path, model_dir):
    from gyre_env.engines.tiny import TinyModelConfig, tiny_model_path

    other = tiny_model_path(TinyModelConfig(hidden_size=64, intermediate_size=64, num_layers=1))
    (server,) = _servers(1, other)
    try:
        _refused(_cfg(tmp_path, [server.url]), "hidden_size 64 \\(model.path: 32\\)")
    finally:
        server.stop()


def test_sglang_without_cuda_or_urls_and_launch_without_sglang(tmp_path, monkeypatch):
    import importlib.util

    from gyre_env.train import rollout_engines

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")  # CI never installs it
    launch = ["rollout.sglang.urls=[]", "rollout.sglang.launch=true"]
    cfg = _cfg(tmp_path, [], *launch)
    if not rollout_engines._cuda_available():
        _refused(cfg, "has no CUDA device .* give the urls of running servers")
    # a GPU machine (faked: none here) without sglang installed
    monkeypatch.setattr(rollout_engines, "_cuda_available", lambda: True)
    _refused(cfg, r"sglang is not installed: pip install 'gyre-env\[sglang\]'")


# ---- the loop on (fake) SGLang servers -------------------------------------------------
@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("servers", [2], indirect=True)
def test_train_on_sglang_records_exactly_what_the_servers_returned(tmp_path, servers, monkeypatch):
    """Two iterations over two servers: every call record holds the ids and logprobs a
    server returned for those prompt ids; the packed batches train on exactly those
    ids (and behaviour logprobs); after each step the servers load the new version from
    disk, and the next iteration's calls carry it."""
    from gyre_env.trainers import torch_backend

    from gyre_env.train import train
    from gyre_env.trajectory.store import TrajectoryStore

    batches = []
    step = torch_backend.TorchTrainer.train_step

    def spy(self, batch):
        batches.append((self.version, batch))
        return step(self, batch)

    monkeypatch.setattr(torch_backend.TorchTrainer, "train_step", spy)
    cfg = _cfg(tmp_path, [s.url for s in servers], "schedule.iterations=2",
               "schedule.optimizer_steps=1", "schedule.eval_every=100")  # fmt: skip
    summary = train(cfg)
    assert not summary.interrupted and len(_rows(cfg.out_dir, "iteration")) == 2

    served = {}
    for server in servers:
        for g in server.state.received["generated"]:
            served[(tuple(g["input_ids"]), tuple(g["output_ids"]))] = g
    with TrajectoryStore(cfg.out_dir / "store.db", readonly=True) as store:
        sessions = [e.session for e in store.episodes() if e.run.startswith("rl.")]
        records = list(store.records(sessions))
    assert records and {r.replica for r in records} <= {"sglang0", "sglang1"}
    for r in records:
        g = served[(tuple(r.prompt_ids), tuple(r.output_ids))]
        assert r.output_logprobs == g["logprobs"]  # exactly, not approximately
        assert str(r.weight_version) == g["weight_version"] or g["weight_version"] == "default"
    assert {r.weight_version for r in records} == {0, 1}  # iteration 1: the pushed step
    for server in servers:
        assert server.state.weight_version == "2"  # and the last step's push
        assert [Path(d["path"]).name for d in server.state.received["disk"]] == ["v1", "v2"]

    sampled = {}
    for r in records:
        seq = list(r.prompt_ids) + list(r.output_ids)
        for k, lp in enumerate(r.output_logprobs):
            sampled[tuple(seq[: len(r.prompt_ids) + k + 1])] = lp
    trained = set()
    for _, batch in batches:
        for unit in batch.units:
            for j in map(int, unit.loss_mask.nonzero()[0]):
                path, i = [], j
                while i >= 0:
                    path.append(int(unit.input_ids[i]))
                    i = int(unit.parent_index[i])
                key = tuple(reversed(path))
                assert key in sampled, "a trained token no server sampled"
                assert abs(float(unit.behaviour_logprobs[j]) - sampled[key]) < 1e-6
                trained.add(key)
    assert trained == set(sampled)  # every sampled token trained, on its exact ids


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("servers", [2], indirect=True)
def test_elastic_sglang_cells_switch_by_release_resume_and_a_weight_push(tmp_path, servers):
    """``--elastic --cells 2`` over two servers, through the switches the policy makes: a
    cell leaving ROLLOUT aborts its requests (re-prefilled on the other from their ids)
    and releases its server's memory; coming back it resumes memory and loads the newest
    version; each switch is timed (``tests/scheduler/test_sglang_cells.py`` drives both
    directions with a request in flight)."""
    from gyre_env.train.elastic import train_elastic

    cfg = _cfg(tmp_path, [s.url for s in servers], "elastic.enabled=true", "elastic.cells=2",
               "schedule.iterations=2", "schedule.optimizer_steps=1",
               "tasks.heldout_count=1")  # fmt: skip
    result = train_elastic(cfg, 2)
    assert result is not None and len(result.steps) == 2
    assert result.switches  # through at least one switch, each timed phase by phase
    for rec in result.switches:
        if rec.to.name == "TRAINING":
            assert list(rec.phases) == ["stop_admitting", "migrate", "release", "onload"]
            assert rec.migration.transport.startswith("re-prefill")
        else:
            assert list(rec.phases) == ["offload", "resume", "load_weights", "admit"]
            assert rec.weight_version >= 1
    assert any(m == "abort" for s in servers for m in s.state.received["pause_modes"])
    saved = json.loads((cfg.out_dir / "elastic.json").read_text())
    assert len(saved["switches"]) == len(result.switches)
    assert all(s["phases"] for s in saved["switches"])
    for server in servers:  # attached servers are handed back serving, not released
        assert not server.state.released and not server.state.paused
