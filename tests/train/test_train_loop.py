"""``gyre train`` end to end on real parts (Docker sandboxes, the proxy, the embedded
engine, the store, the torch trainer), with tiny budgets: the run's outputs, exact resume
after Ctrl-C, and bad input refused before any work starts."""

from __future__ import annotations

import json
import os
import signal

import pytest

from gyre_env.train.config import ConfigError, TrainConfig, apply_overrides, from_dict, load_config

pytestmark = pytest.mark.docker

TINY = [
    "schedule.epochs=1",  # the toy makes one pass over each iteration's groups
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
    "model.context_length=1024", "tasks.train_count=50", "tasks.heldout_count=2",
    "rollout.group_size=2", "rollout.tasks_per_iteration=2", "rollout.max_new_tokens=16",
    "rollout.max_steps=1", "logging.progress=false", "schedule.eval_random=true",
    # the tiny random model scores 0 everywhere: keep its groups so there are steps
    "algorithm.skip_zero_variance=false",
]  # fmt: skip


def _cfg(tmp_path, *more):
    return apply_overrides(
        load_config(preset="cpu-demo"), [*TINY, f"out={str(tmp_path / 'run')!r}", *more]
    )


def _rows(out, kind):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.mark.slow
def test_a_run_writes_its_outputs_and_pushes_versioned_weights(tmp_path):
    """Random eval -> SFT on gold replays -> 2 GRPO iterations -> eval; the store groups
    each task's attempts; checkpoints, TensorBoard events, the report, an exported model."""
    from gyre_env.trainers.steps import lr_factor

    from gyre_env.train import train
    from gyre_env.trajectory.store import TrajectoryStore

    cfg = _cfg(tmp_path, "sft.trajectories=4", "sft.steps=3", "sft.batch_size=4",
               "schedule.iterations=2", "schedule.eval_every=2", "rollout.min_p=0.05",
               "sft.steps_per_iteration=0",  # gold steps: their own test below
               'sft.lr_schedule="cosine"', "sft.lr_min=2e-4")  # fmt: skip
    summary = train(cfg)
    out = cfg.out_dir
    assert not summary.interrupted
    assert [e["phase"] for e in summary.evals] == ["random", "sft", "rl"]
    assert len(_rows(out, "sft")) == 3 and len(_rows(out, "iteration")) == 2
    warm, lr = cfg.optim_config().warmup_steps, cfg.sft.lr
    want = [lr * lr_factor(s, warmup=warm, cosine_steps=3, floor=2e-4 / lr) for s in range(3)]
    assert [r["lr"] for r in _rows(out, "sft")] == pytest.approx(want)
    assert [r["step"] for r in _rows(out, "rl")] == [4, 5, 6, 7]  # 2 per iteration
    for name in ("report.html", "checkpoints/ckpt.pt", "model/config.json", "episodes.jsonl"):
        assert (out / name).is_file(), name
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    with TrajectoryStore(out / "store.db", readonly=True) as store:
        trees = store.trees(run="rl.0001.r0")
        assert len(trees) == 2 and all(len(t.episodes) == 2 for t in trees)
        versions = {n.weight_version for t in trees for n in t.nodes if n.sampled}
        assert versions == {5}  # sampled by the weights pushed after step 5
        gold = store.episodes(run="sft")
        assert len(gold) == 4 and {e.reward for e in gold} == {1.0}

        def min_ps(run):
            sessions = [e.session for e in store.episodes(run=run)]
            return {r.sampling["min_p"] for r in store.records(sessions)}

        # rollout.min_p filters the RL rollouts only; held-out evaluation samples without it
        assert min_ps("rl.0001.r0") == {0.05} and min_ps("eval.rl.0002.r0") == {0.0}


@pytest.mark.slow
def test_a_finished_run_resumed_with_more_iterations_trains_on(tmp_path):
    """``--resume --iterations M`` with a larger M goes on from the finished run's last
    iteration (it stopped as done and did nothing before); the same M again: no work."""
    from gyre_env.train import train

    cfg = _cfg(tmp_path, "sft.trajectories=0", "schedule.iterations=1")
    train(cfg)
    assert len(_rows(cfg.out_dir, "iteration")) == 1
    more = apply_overrides(cfg, ["schedule.iterations=2"])
    summary = train(more, resume=True)
    assert [r["iteration"] for r in _rows(cfg.out_dir, "iteration")] == [0, 1]
    assert [e["phase"] for e in summary.evals] == ["random", "rl", "rl"]
    train(more, resume=True)
    assert len(_rows(cfg.out_dir, "iteration")) == 2


@pytest.mark.slow
def test_eval_random_false_skips_only_the_random_eval(tmp_path):
    """The cpu-demo preset skips the random-init eval (it scores 0) to give RL the time."""
    from gyre_env.train import train

    assert load_config(preset="cpu-demo").schedule.eval_random is False
    cfg = _cfg(tmp_path, "schedule.eval_random=false", "sft.trajectories=0",
               "schedule.iterations=1")  # fmt: skip
    summary = train(cfg)
    assert [e["phase"] for e in summary.evals] == ["rl"]
    assert len(_rows(cfg.out_dir, "iteration")) == 1


@pytest.mark.slow
def test_ctrl_c_saves_and_resume_gives_the_same_next_step_loss(tmp_path, monkeypatch):
    """Run A trains 4 steps uninterrupted (decoupled PPO, 2 minibatches an iteration).
    Run B gets SIGINT during step 3: it finishes that step, saves, exits; resumed, it
    takes step 4 from the rollouts already in the store, against the proximal policy of
    the iteration's start (saved, not the resumed weights). Step 4's loss equals A's
    (rollouts are seeded and run one at a time). The proximal logprobs are computed once
    per iteration, before its first update (the clip itself: test_torch_trainer.py)."""
    from gyre_env.trainers import torch_backend

    from gyre_env.train import train

    more = ["sft.trajectories=0", "schedule.iterations=2", "schedule.optimizer_steps=2",
            "rollout.parallel=1", "rollout.group_size=3", "schedule.eval_every=100",
            "algorithm.loss.entropy_coef=0.01",
            'algorithm.loss.policy_loss="decoupled"']  # fmt: skip
    proximal = torch_backend.TorchTrainer.set_proximal
    calls = []

    def recorded(self, units):
        calls.append(self.version)
        return proximal(self, units)

    monkeypatch.setattr(torch_backend.TorchTrainer, "set_proximal", recorded)
    a = train(_cfg(tmp_path / "a", *more))
    losses_a = {r["step"]: r["loss"] for r in _rows(a.out_dir, "rl")}
    assert sorted(losses_a) == [1, 2, 3, 4]
    assert calls == [0, 2]  # at each iteration's start

    step = torch_backend.TorchTrainer.train_step

    def interrupted(self, batch):
        if self.version == 2:  # during step 3
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, batch)

    monkeypatch.setattr(torch_backend.TorchTrainer, "train_step", interrupted)
    cfg_b = _cfg(tmp_path / "b", *more)
    b = train(cfg_b)
    assert b.interrupted
    assert [r["step"] for r in _rows(b.out_dir, "rl")] == [1, 2, 3]
    monkeypatch.setattr(torch_backend.TorchTrainer, "train_step", step)
    assert calls == [0, 2, 0, 2]
    calls.clear()
    resumed = train(cfg_b, resume=True)
    assert not resumed.interrupted
    assert calls == []  # step 4 uses the proximal logprobs saved at step 3's iteration start
    losses_b = {r["step"]: r["loss"] for r in _rows(b.out_dir, "rl")}
    assert sorted(losses_b) == [1, 2, 3, 4]
    for k in (1, 2, 3, 4):
        assert abs(losses_a[k] - losses_b[k]) <= 1e-6, (k, losses_a[k], losses_b[k])
    assert losses_a[4] != 0.0


@pytest.mark.slow
def test_gold_steps_follow_each_iterations_rl_steps_and_resume_exactly(tmp_path, monkeypatch):
    """``sft.steps_per_iteration``: after each iteration's RL steps, that many SFT steps
    on the gold trajectories (logged as ``ptx``; the version counts them, the RL step
    count does not). Run B is stopped during its first gold step and resumed: its gold
    steps draw the same gold and give the same NLL as uninterrupted run A's."""
    from gyre_env.trainers import torch_backend

    from gyre_env.train import train

    more = ["sft.trajectories=4", "sft.steps=2", "sft.batch_size=2", "sft.steps_per_iteration=2",
            "schedule.iterations=2", "schedule.optimizer_steps=1", "rollout.parallel=1",
            "schedule.eval_every=100"]  # fmt: skip
    a = train(_cfg(tmp_path / "a", *more))
    assert [r["step"] for r in _rows(a.out_dir, "rl")] == [3, 6]
    ptx_a = {r["step"]: r["nll"] for r in _rows(a.out_dir, "ptx")}
    assert sorted(ptx_a) == [4, 5, 7, 8]
    assert [r["iteration"] for r in _rows(a.out_dir, "ptx")] == [0, 0, 1, 1]
    assert all(0 < v < 20 for v in ptx_a.values())
    assert len(set(ptx_a.values())) == 4  # other gold or other weights each step
    assert json.loads((a.out_dir / "checkpoints" / "cursor.json").read_text())["rl_step"] == 2

    step = torch_backend.TorchTrainer.train_step

    def interrupted(self, batch):
        if self.version == 3:  # during the first gold step
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, batch)

    monkeypatch.setattr(torch_backend.TorchTrainer, "train_step", interrupted)
    cfg_b = _cfg(tmp_path / "b", *more)
    assert train(cfg_b).interrupted
    assert [r["step"] for r in _rows(cfg_b.out_dir, "ptx")] == [4]
    monkeypatch.setattr(torch_backend.TorchTrainer, "train_step", step)
    assert not train(cfg_b, resume=True).interrupted
    ptx_b = {r["step"]: r["nll"] for r in _rows(cfg_b.out_dir, "ptx")}
    assert sorted(ptx_b) == [4, 5, 7, 8]
    for k in ptx_a:
        assert abs(ptx_a[k] - ptx_b[k]) <= 1e-6, (k, ptx_a[k], ptx_b[k])


def test_bad_configs_are_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.group_size must be int, got str"):
        from_dict(TrainConfig, {"rollout": {"group_size": "8"}})
    with pytest.raises(ConfigError, match=r"unknown key 'rollout.gropu_size'"):
        from_dict(TrainConfig, {"rollout": {"gropu_size": 8}})
    with pytest.raises(ConfigError, match=r"algorithm.loss.policy_loss must be one of"):
        apply_overrides(TrainConfig(), ['algorithm.loss.policy_loss="reinforce"'])
    bad = tmp_path / "bad.toml"
    bad.write_text("[schedule]\niterations = 'ten'\n")
    with pytest.raises(ConfigError, match=r"bad.toml: schedule.iterations must be int"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"sft.steps_per_iteration must be >= 0, got -1"):
        apply_overrides(TrainConfig(), ["sft.steps_per_iteration=-1"])
    with pytest.raises(ConfigError, match=r'sft.lr_schedule must be "constant" or "cosine"'):
        apply_overrides(TrainConfig(), ['sft.lr_schedule="linear"'])
    with pytest.raises(ConfigError, match=r"sft.lr_min must be in \[0, sft.lr = 0.001\], got 0.01"):
        apply_overrides(TrainConfig(), ["sft.lr_min=1e-2"])
    gold = apply_overrides(TrainConfig(), ["sft.steps_per_iteration=4"])
    assert gold.gold_steps_per_iteration() == 4
    assert apply_overrides(gold, ["sft.trajectories=0"]).gold_steps_per_iteration() == 0  # no gold
    with pytest.raises(ConfigError, match="schedule.rl_updates = false leaves each iteration"):
        apply_overrides(TrainConfig(), ["schedule.rl_updates=false"])  # nothing would train
    assert not apply_overrides(gold, ["schedule.rl_updates=false"]).schedule.rl_updates
    with pytest.raises(ConfigError, match="elastic driver trains on rollouts alone"):
        apply_overrides(gold, ["schedule.rl_updates=false", "elastic.enabled=true"])
    with pytest.raises(ConfigError, match="no preset 'cpu-dmeo'"):
        load_config(preset="cpu-dmeo")
    # The env's options, nested ones too, are checked before a run folder exists.
    with pytest.raises(
        ConfigError, match=r"env_kwargs: unknown NL2RepoEnv grading options \['memoise'\]"
    ):
        apply_overrides(
            load_config(preset="cpu-demo"), ["tasks.env_kwargs={grading={memoise=true}}"]
        )
    with pytest.raises(
        ConfigError, match=r"env_kwargs: unknown NL2RepoEnv options \['reward_mod'\]"
    ):
        apply_overrides(TrainConfig(), ['tasks.env_kwargs={reward_mod="sparse"}'])
    with pytest.raises(ConfigError, match=r"env_kwargs: unknown sandbox backend 'bwarp'"):
        apply_overrides(TrainConfig(), ['tasks.env_kwargs={sandbox_backend="bwarp"}'])


def test_a_missing_bubblewrap_is_named_before_any_work(monkeypatch):
    """The preset's sandboxes are bubblewrap's: without it on PATH the config is refused,
    naming the install and the Docker alternative (not an infra_error per episode)."""
    monkeypatch.setattr("gyre_env.sandbox.bwrap.bwrap_available", lambda: False)
    with pytest.raises(
        ConfigError, match=r"'bwrap' needs bubblewrap .*apt install bubblewrap.*'docker'"
    ):
        load_config(preset="cpu-demo").validate()
    # The override gyre train's error and the preset suggest mends it (applied before the
    # preset is validated).
    cfg = load_config(preset="cpu-demo", overrides=['tasks.env_kwargs={sandbox_backend="docker"}'])
    assert cfg.tasks.env_kwargs["sandbox_backend"] == "docker"


def test_bad_inputs_fail_before_any_work(tmp_path):
    """A model folder that is not a causal LM, an empty task set, and a store written with
    another model's tokenizer: each a clear error, before any episode runs."""
    from gyre_env.train import train

    enc = tmp_path / "t5"
    enc.mkdir()
    (enc / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ConfigError, match="'t5' model, which is not a causal LM"):
        train(_cfg(tmp_path, f"model.path={str(enc)!r}"))
    with pytest.raises(ConfigError, match="not a Hugging Face model folder"):
        train(_cfg(tmp_path, f"model.path={str(tmp_path / 'nothing')!r}"))
    empty = tmp_path / "no-tasks"
    empty.mkdir()
    with pytest.raises(ConfigError, match="takes no options"):
        train(_cfg(tmp_path, f"tasks.suite={str(empty)!r}"))
    with pytest.raises(ConfigError, match="no task folders"):
        train(_cfg(tmp_path, f"tasks.suite={str(empty)!r}", "tasks.suite_kwargs={}"))

    from gyre_env.trajectory.store import TrajectoryStore

    out = tmp_path / "run"
    out.mkdir()
    with TrajectoryStore(out / "store.db") as store:
        store.set_meta("tokenizer", "0123456789abcdef")
        store.set_meta("model", "/elsewhere/other-model")
    with pytest.raises(ConfigError, match="another tokenizer .*/elsewhere/other-model"):
        train(_cfg(tmp_path))
    assert not (out / "metrics.jsonl").exists()


def test_resume_with_another_backend_or_model_shape_is_named(tmp_path):
    """A checkpoint loads only into what wrote it; before, --resume --backend megatron on
    a torch run died in load_state_dict with two pages of parameter names."""
    import dataclasses

    from gyre_env.train import train

    cfg = _cfg(tmp_path)
    (cfg.out_dir / "checkpoints").mkdir(parents=True)
    (cfg.out_dir / "checkpoints" / "ckpt.pt").write_bytes(b"")  # never read: refused first
    (cfg.out_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    with pytest.raises(ConfigError, match="backend: 'torch' in the run, 'megatron' now"):
        train(dataclasses.replace(cfg, backend="megatron"), resume=True)
    wider = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hidden_size=64))
    with pytest.raises(
        ConfigError, match=r"fit these settings \(model.hidden_size: 32 in the run, 64 now\)"
    ):
        train(wider, resume=True)
    assert not (cfg.out_dir / "metrics.jsonl").exists()
