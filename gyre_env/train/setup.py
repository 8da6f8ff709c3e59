"""The building blocks both drivers (``train.loop`` and ``train.elastic``) set a run up
with: the model folder, the task pool, the tokenizer and store, the trainer, the model
service that records every call into the store, the agent, the metrics logger."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from gyre_env.config import ConfigError
from gyre_env.train.config import TasksConfig, TrainConfig


def prepare_model(cfg: TrainConfig) -> Path:
    """The model folder: the user's (checked to be a causal LM with a tokenizer) or the
    built-in tiny Qwen2 of ``cfg.model``'s shape, built here if missing."""
    m = cfg.model
    if m.path is None:
        from gyre_env.engines.tiny import TinyModelConfig, tiny_model_path

        return tiny_model_path(
            TinyModelConfig(
                seed=cfg.seed if m.seed is None else m.seed,
                hidden_size=m.hidden_size,
                intermediate_size=m.intermediate_size,
                num_layers=m.num_layers,
                num_heads=m.num_heads,
                num_kv_heads=m.num_kv_heads,
                initializer_range=m.initializer_range,
                words=m.word_list(),
            )
        )
    folder = Path(m.path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"model.path: {folder} is not a Hugging Face model folder (no config.json)"
        )
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path: {folder}: unreadable config.json: {e}") from e
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"model.path: {folder} holds a {config.model_type!r} model, which is not a causal "
            "LM (transformers has no AutoModelForCausalLM class for it)"
        )
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ConfigError(f"model.path: {folder} has no tokenizer files")
    return folder


@dataclass
class TaskPool:
    """A run's tasks: ``train`` (the pool), ``heldout`` (what evaluations measure: the
    held-out or the validation split), ``gold`` (SFT's tasks) and ``rl`` (RL's)."""

    train: list
    heldout: list
    gold: list
    rl: list


def task_splits(t: TasksConfig) -> tuple[list, list]:
    """(training pool, evaluated tasks) of the ``tasks`` table (``tasks.splits``)."""
    from gyre_env.tasks.splits import load_splits

    return load_splits(
        t.suite,
        train_count=t.train_count,
        heldout_count=t.heldout_count,
        seed=t.seed,
        suite_kwargs=t.suite_kwargs,
        eval_suite_kwargs=t.eval_suite_kwargs,
        eval_split=t.eval_split,
    )


def task_pool(cfg: TrainConfig) -> TaskPool:
    """``cfg.tasks`` loaded and split (``gyre_env.tasks.splits``)."""
    from gyre_env.tasks.splits import no_gold_share_used, split_gold

    t = cfg.tasks
    train, heldout = task_splits(t)
    sft = bool(cfg.sft.trajectories and cfg.sft.steps)
    if sft and not any(x.gold_dir for x in train):
        raise ConfigError("sft: no training task has a gold solution to replay")
    gold, rl = split_gold(
        train,
        gold_count=cfg.sft.trajectories if cfg.sft.steps else 0,
        seed=cfg.seed,
        rl_includes_gold=t.rl_includes_sft_tasks,
    )
    share = t.rl_no_gold_share
    if share is not None and (used := no_gold_share_used(rl, share)) != share:
        side = "no task without gold" if used == 0.0 else "no task with gold"
        say(f"tasks.rl_no_gold_share = {share}: RL's {len(rl)} tasks include {side}; "
            "every iteration draws from the other side")  # fmt: skip
    return TaskPool(train=train, heldout=heldout, gold=gold, rl=rl)


def grading_config(cfg: TrainConfig):
    """The final grader's settings the run's envs use (``tasks.env_kwargs``), for grading
    outside an env (the no-learning baselines)."""
    from gyre_env.scoring.final import GradingConfig

    kw = cfg.tasks.env_kwargs
    return GradingConfig(
        backend=kw.get("sandbox_backend", "auto"),
        pytest_plugins=kw.get("grading", {}).get("pytest_plugins"),
    )


def open_store(cfg: TrainConfig, model_dir: Path):
    """(tokenizer, store): ``OUT/store.db``, refused if it holds another tokenizer's ids."""
    from gyre_env.engines.tiny import load_tokenizer
    from gyre_env.trajectory.store import TrajectoryStore, check_tokenizer

    tokenizer = load_tokenizer(model_dir)
    store = TrajectoryStore(cfg.out_dir / "store.db")
    try:
        check_tokenizer(store, tokenizer, model_dir)
    except ConfigError:
        store.close()
        raise
    return tokenizer, store


def make_trainer(cfg: TrainConfig, model_dir: Path):
    """The ``cfg.backend`` trainer of ``model_dir`` with the run's optimizer and loss."""
    if cfg.backend == "megatron":
        from gyre_env.trainers.megatron import MegatronTrainer as trainer_class
    else:
        from gyre_env.trainers.torch_backend import TorchTrainer as trainer_class
    return trainer_class(model_dir, cfg.optim_config(), cfg.loss_config())


def model_service(cfg: TrainConfig, tokenizer, store, engines, extra_sinks=()):
    """A started model service (the proxy) over ``engines`` that records every call
    into ``store`` (and ``extra_sinks``)."""
    from gyre_env.proxy.serving import ModelService, ModelServiceConfig
    from gyre_env.trajectory.store import StoreSink

    return ModelService(
        ModelServiceConfig(context_length=cfg.model.context_length),
        engines=engines,
        tokenizer=tokenizer,
        sinks=(StoreSink(store), *extra_sinks),
    ).start()


def make_agent(cfg: TrainConfig, temperature: float, min_p: float = 0.0):
    """The agent of the run's episodes (``rollout.agent``), sampling at ``temperature``
    with a ``min_p`` filter (0: none)."""
    from gyre_env import agents

    r = cfg.rollout
    if r.agent == "mini-swe-agent":
        return agents.MiniSweAgent(
            agents.MiniSweAgentConfig(
                max_steps=r.max_steps,
                max_new_tokens=r.max_new_tokens,
                temperature=temperature,
                min_p=min_p,
                seed=cfg.seed,
            )
        )
    return agents.LangGraphAgent(
        agents.LangGraphAgentConfig(
            max_steps=r.max_steps,
            max_new_tokens=r.max_new_tokens,
            temperature=temperature,
            min_p=min_p,
            subagent=False,
            nudges=0,
            seed=cfg.seed,
        )
    )


def metrics_logger(cfg: TrainConfig, *, resume: bool = False):
    """``OUT/metrics.jsonl`` (and TensorBoard / W&B as ``cfg.logging`` asks)."""
    from gyre_env.train.metrics import MetricsLogger

    lg = cfg.logging
    return MetricsLogger(
        cfg.out_dir,
        tensorboard=lg.tensorboard,
        wandb=lg.wandb,
        wandb_project=lg.wandb_project,
        run_name=cfg.name,
        config=dataclasses.asdict(cfg),
        resume=resume,
    )


def write_config(cfg: TrainConfig) -> None:
    """The run's effective settings as ``OUT/config.json`` (what a resume is checked
    against)."""
    path = cfg.out_dir / "config.json"
    path.write_text(json.dumps(dataclasses.asdict(cfg), indent=1, default=str), encoding="utf-8")


def eval_label(cfg: TrainConfig) -> str:
    """What the run's evaluations measure, as printed: ``held-out`` or ``validation``."""
    return "held-out" if cfg.tasks.eval_split == "heldout" else cfg.tasks.eval_split


def say(text: str) -> None:
    """A line of the run's own output (stdout, flushed)."""
    print(text, flush=True)
