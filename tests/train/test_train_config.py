"""``gyre train``'s config is read one way: every table, the trainer's ``algorithm.loss`` /
``algorithm.sample`` / ``algorithm.optim`` and the ``[elastic]`` run shape included, is a
typed dataclass when the file is read, so a wrong key is refused at load, by its dotted
name, from a file and from ``--set`` alike. No run is started here."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import tomllib

from gyre_env.train.config import (
    PRESETS_DIR,
    ConfigError,
    TrainConfig,
    apply_overrides,
    from_dict,
    load_config,
)
from gyre_env.trajectory.sampling import SampleConfig

needs_megatron = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="needs megatron-core"
)

# Sandboxes that need nothing on this machine, so the file validates anywhere.
BASE = """\
name = "t"
[tasks]
env_kwargs = { reward_mode = "sparse", sandbox_backend = "local" }
[algorithm.optim]
lr = 1e-3
"""


def _file(tmp_path, text: str, name: str = "run.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# (TOML table, the same as an override, the message's start)
UNKNOWN = {
    "loss": (
        "[algorithm.loss]\nclip_hgh = 0.3\n",
        "algorithm.loss.clip_hgh=0.3",
        r"unknown key 'algorithm.loss.clip_hgh'; known keys here: \[.*'clip_high'",
    ),
    "sample": (
        "[algorithm.sample]\nnegative_scal = 0.0\n",
        "algorithm.sample.negative_scal=0.0",
        r"unknown key 'algorithm.sample.negative_scal'; known keys here: \[.*'negative_scale'",
    ),
    "optim": (
        "[algorithm.optim]\ntensor_parallel = 2\n",  # megatron's, not the torch backend's
        "algorithm.optim.tensor_parallel=2",
        r"unknown key 'algorithm.optim.tensor_parallel'; known keys here: \[.*'fsdp'",
    ),
    "elastic": (
        "[elastic]\ncels = 4\n",
        "elastic.cels=4",
        r"unknown key 'elastic.cels'; known keys here: \['cells', 'enabled', 'ray'\]",
    ),
    "env_kwargs": (
        '[tasks]\nenv_kwargs = { reward_mod = "sparse" }\n',
        'tasks.env_kwargs.reward_mod="sparse"',
        r"tasks.env_kwargs: unknown NL2RepoEnv options \['reward_mod'\]; known: \[.*'reward_mode'",
    ),
    "env_kwargs.sandbox": (
        "[tasks]\nenv_kwargs = { sandbox = { memroy_mb = 512 } }\n",
        "tasks.env_kwargs.sandbox={memroy_mb=512}",
        r"tasks.env_kwargs.sandbox: unknown sandbox config keys \['memroy_mb'\]; known: \[.*'memory_mb'",
    ),
}


@pytest.mark.parametrize("table", list(UNKNOWN))
def test_an_unknown_key_is_refused_at_load_by_its_dotted_name(tmp_path, table):
    text, override, message = UNKNOWN[table]
    with pytest.raises(ConfigError, match=r"bad.toml: " + message):
        load_config(_file(tmp_path, text, "bad.toml"))
    with pytest.raises(ConfigError, match=message):
        load_config(_file(tmp_path, BASE), overrides=[override])
    with pytest.raises(ConfigError, match=message):
        apply_overrides(TrainConfig(), [override])


def test_the_trainer_tables_are_typed_when_read_not_later():
    """``from_dict`` alone (no ``validate``) builds the trainer's classes and refuses
    their unknown keys."""
    cfg = from_dict(TrainConfig, tomllib.loads(BASE))
    assert type(cfg.algorithm.loss).__name__ == "LossConfig"
    assert type(cfg.algorithm.optim).__name__ == "TorchTrainerConfig"
    assert cfg.algorithm.optim.lr == 1e-3
    assert type(cfg.sample_config()) is SampleConfig
    for data, key in (
        ({"algorithm": {"loss": {"clip_hgh": 0.3}}}, "algorithm.loss.clip_hgh"),
        ({"algorithm": {"sample": {"overflw": "error"}}}, "algorithm.sample.overflw"),
        ({"algorithm": {"optim": {"use_te": True}}}, "algorithm.optim.use_te"),
    ):
        with pytest.raises(ConfigError, match=rf"unknown key '{key}'"):
            from_dict(TrainConfig, data)
    with pytest.raises(ConfigError, match=r"algorithm.loss.policy_loss must be one of"):
        from_dict(TrainConfig, {"algorithm": {"loss": {"policy_loss": "reinforce"}}})
    with pytest.raises(ConfigError, match=r"algorithm.optim.lr must be a number, got str"):
        from_dict(TrainConfig, {"algorithm": {"optim": {"lr": "fast"}}})
    with pytest.raises(ConfigError, match=r"algorithm.sample: negative_scale must be in \[0, 1\]"):
        from_dict(TrainConfig, {"algorithm": {"sample": {"negative_scale": 2.0}}})


def test_the_loss_temperature_is_the_rollouts(tmp_path):
    message = r"algorithm.loss.temperature: set rollout.temperature \(the loss uses it\)"
    with pytest.raises(ConfigError, match=message):
        load_config(_file(tmp_path, "[algorithm.loss]\ntemperature = 0.5\n"))
    with pytest.raises(ConfigError, match=message):
        load_config(_file(tmp_path, BASE), overrides=["algorithm.loss.temperature=0.5"])
    cfg = load_config(_file(tmp_path, BASE + "[rollout]\ntemperature = 0.7\n"))
    assert cfg.loss_config().temperature == 0.7
    assert cfg.algorithm.loss.temperature == 0.7  # what the run's config.json says
    assert apply_overrides(cfg, ["rollout.temperature=0.9"]).loss_config().temperature == 0.9
    with pytest.raises(ConfigError, match=r"rollout.temperature must be > 0, got 0.0"):
        apply_overrides(cfg, ["rollout.temperature=0"])
    assert apply_overrides(cfg, ["rollout.min_p=0.05"]).rollout.min_p == 0.05
    with pytest.raises(
        ConfigError, match=r"rollout.min_p must be in \[0, 1\) \(0 disables it\), got 1"
    ):
        apply_overrides(cfg, ["rollout.min_p=1"])


def test_the_token_budget_is_the_context_length_unless_set(tmp_path):
    cfg = load_config(_file(tmp_path, BASE + "[model]\ncontext_length = 2048\n"))
    assert cfg.algorithm.sample.token_budget is None
    assert cfg.sample_config().token_budget == 2048
    # an override of the context, after the file was read, moves the budget with it
    assert apply_overrides(cfg, ["model.context_length=1024"]).sample_config().token_budget == 1024
    fixed = apply_overrides(cfg, ["algorithm.sample.token_budget=512"])
    assert apply_overrides(fixed, ["model.context_length=1024"]).sample_config().token_budget == 512
    with pytest.raises(ConfigError, match=r"algorithm.sample: token_budget must be positive"):
        apply_overrides(cfg, ["algorithm.sample.token_budget=0"])


def test_the_optimizer_table_is_the_backends_class(tmp_path):
    from gyre_env.trainers.megatron.trainer import MegatronTrainerConfig

    megatron = BASE.replace('name = "t"', 'name = "t"\nbackend = "megatron"')
    text = megatron + "tensor_parallel = 2\nuse_te = false\n"
    cfg = from_dict(TrainConfig, tomllib.loads(text))  # read without megatron-core
    assert type(cfg.algorithm.optim) is MegatronTrainerConfig
    assert cfg.algorithm.optim.tensor_parallel == 2 and cfg.algorithm.optim.lr == 1e-3
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.optim.fsdp'"):
        from_dict(TrainConfig, tomllib.loads(megatron + "fsdp = true\n"))
    with pytest.raises(ConfigError, match=r"backend: 'jax' is not available"):
        from_dict(TrainConfig, {"backend": "jax"})
    # in Python, another backend's options are read as the backend's, as --set does
    torch = from_dict(TrainConfig, tomllib.loads(BASE))
    optim = dataclasses.replace(torch, backend="megatron").optim_config()
    assert type(optim) is MegatronTrainerConfig and optim.lr == 1e-3
    assert type(TrainConfig(backend="megatron").optim_config()) is MegatronTrainerConfig
    fsdp = from_dict(TrainConfig, tomllib.loads(BASE + "fsdp = true\n"))
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.optim.fsdp'"):
        dataclasses.replace(fsdp, backend="megatron")


@needs_megatron
def test_backend_megatron_from_an_override_reads_its_optimizer_keys(tmp_path):
    path = _file(tmp_path, BASE)
    cfg = load_config(path, overrides=["backend='megatron'", "algorithm.optim.tensor_parallel=2"])
    optim = cfg.optim_config()
    assert type(optim).__name__ == "MegatronTrainerConfig"
    assert optim.tensor_parallel == 2 and optim.lr == 1e-3  # the file's lr carried over
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.optim.tensor_parallel'"):
        apply_overrides(cfg, ["backend='torch'"])  # torch has no tensor parallelism
    back = apply_overrides(
        apply_overrides(cfg, ["algorithm.optim.tensor_parallel=1"]), ["backend='torch'"]
    )
    assert type(back.optim_config()).__name__ == "TorchTrainerConfig"
    assert (
        load_config(_file(tmp_path, BASE.replace('name = "t"', 'backend = "megatron"'))).backend
        == "megatron"
    )


def test_overrides_round_trip_and_the_run_config_is_json(tmp_path):
    cfg = load_config(_file(tmp_path, BASE + "[elastic]\nenabled = true\nray = 'local'\n"))
    assert apply_overrides(cfg, []) == cfg
    assert apply_overrides(TrainConfig(), []) == TrainConfig() == from_dict(TrainConfig, {})
    saved = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    assert saved["algorithm"]["optim"]["lr"] == 1e-3 and saved["elastic"]["ray"] == "local"
    tuned = apply_overrides(cfg, ["algorithm.optim.betas=[0.9, 0.99]"])
    assert tuned.optim_config().betas == (0.9, 0.99)


def test_importing_the_config_does_not_import_torch():
    code = "import sys, gyre_env.train.config\nassert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_preset_reads_as_typed_tables():
    presets = sorted(PRESETS_DIR.glob("*.toml"))
    assert presets
    for path in presets:
        from_dict(TrainConfig, tomllib.loads(path.read_text(encoding="utf-8")), "")


@pytest.mark.bwrap
def test_every_preset_loads():
    for path in sorted(PRESETS_DIR.glob("*.toml")):
        cfg = load_config(preset=path.stem)
        cfg.loss_config(), cfg.sample_config(), cfg.optim_config()
        assert not cfg.elastic.enabled


# ---- the [elastic] table and gyre train's flags ---------------------------------------
@pytest.fixture
def runs(monkeypatch):
    """What ``gyre train`` would run: ``train_elastic``'s and ``train``'s arguments."""
    calls = []

    def elastic(cfg, cells, ray=None, *, resume=False):
        calls.append(("elastic", cfg, cells, ray, resume))
        return object()

    def train(cfg, *, resume=False):
        calls.append(("train", cfg, None, None, resume))
        return SimpleNamespace(interrupted=False)

    monkeypatch.setattr("gyre_env.train.elastic.train_elastic", elastic)
    monkeypatch.setattr("gyre_env.train.loop.train", train)
    return calls


def _main(*argv):
    from gyre_env.cli import main

    return main(["train", *argv])


def test_the_elastic_table_drives_the_same_run_as_the_flags(tmp_path, runs):
    table = _file(tmp_path, BASE + "[elastic]\nenabled = true\ncells = 3\nray = 'local'\n")
    plain = _file(tmp_path, BASE, "plain.toml")
    assert _main(str(table), "--resume") == 0
    assert _main(str(plain), "--elastic", "--cells", "3", "--ray", "local", "--resume") == 0
    (kind_a, cfg_a, *args_a), (kind_b, cfg_b, *args_b) = runs
    assert kind_a == kind_b == "elastic" and args_a == args_b == [3, "local", True]
    assert cfg_a == cfg_b
    assert cfg_a.elastic.enabled and cfg_a.elastic.cells == 3 and cfg_a.elastic.ray == "local"
    runs.clear()
    # flags override the table; without either the synchronous loop runs
    assert _main(str(table), "--cells", "4") == 0
    assert _main(str(plain), "--elastic") == 0
    assert _main(str(plain), "--cells", "5") == 0
    assert _main(str(table), "--set", "elastic.enabled=false", "--set", "elastic.ray='local'") == 2
    assert [(k, c, r) for k, _, c, r, _ in runs] == [
        ("elastic", 4, "local"),
        ("elastic", 2, None),
        ("train", None, None),
    ]
    assert runs[2][1].elastic.cells == 5 and not runs[2][1].elastic.enabled


def test_elastic_flags_and_table_are_refused_by_name(tmp_path, runs, capsys):
    plain = _file(tmp_path, BASE)
    assert _main(str(plain), "--ray", "auto") == 2
    err = capsys.readouterr().err
    assert "elastic.ray = 'auto' needs elastic.enabled = true (--ray needs --elastic)" in err
    assert _main(str(plain), "--elastic", "--cells", "0") == 2
    assert "gyre train: elastic.cells must be >= 1, got 0" in capsys.readouterr().err
    bad = _file(tmp_path, BASE + "[elastic]\ncells = 0\n", "bad.toml")
    assert _main(str(bad)) == 2
    assert "bad.toml: elastic.cells must be >= 1, got 0" in capsys.readouterr().err
    assert _main(str(plain), "--set", "elastic.cells='two'") == 2
    assert "elastic.cells must be int, got str 'two'" in capsys.readouterr().err
    assert runs == []


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ('"nouns"', r'model.words must be a list of words or "nano", got \'nouns\''),
        ('["two words"]', r"model.words: 'two words' is not one word"),
        ("[1]", r"model.words\[0\] must be str, got int 1"),
    ],
)
def test_bad_model_words_are_refused_by_name(tmp_path, value, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_file(tmp_path, BASE), overrides=[f"model.words={value}"])


def test_model_words_nano_are_every_made_up_word(tmp_path):
    from gyre_env.tasks.nano import _made_up_words, made_up_words

    cfg = load_config(_file(tmp_path, BASE), overrides=['model.words="nano"'])
    coined, decoys, vague = _made_up_words()
    assert set(cfg.model.word_list()) >= set(coined.values()) | set(vague["list"])
    assert len(set(made_up_words())) == len(made_up_words())
