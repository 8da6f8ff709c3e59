"""``gyre train``: the synchronous training loop.

    evaluate the random model on held-out tasks
    SFT: replay gold trajectories through the proxy -> store -> NLL steps -> evaluate
    repeat: sample tasks -> G episodes each (LangGraph agent, proxy, embedded engine)
            -> store -> token trees per GRPO group -> bounded units -> packed batches
            -> K optimizer steps -> push weights to the engine (new version)
            -> evaluate every N iterations -> checkpoint

Everything a run writes goes under ``cfg.out_dir``: ``store.db`` (every call and outcome:
training reads what the store holds), ``metrics.jsonl``, ``tensorboard/``,
``checkpoints/``, ``episodes.jsonl``, ``report.html``. The elastic scheduler will drive
the same pieces (``run_episodes``, ``rl_minibatches``, ``Trainer.train_step``, weight push)
without this driver.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import random
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gyre_env.train.checkpoint import Cursor, load_checkpoint, save_checkpoint, save_cursor
from gyre_env.train.config import ConfigError, TrainConfig
from gyre_env.train.rollout import RolloutStats, run_episodes
from gyre_env.trajectory.sampling import episode_reward

log = logging.getLogger(__name__)


@dataclass
class TrainSummary:
    """What a run ended with (also printed)."""

    out_dir: Path
    evals: list[dict] = field(default_factory=list)
    interrupted: bool = False
    wall_s: float = 0.0

    def pass_rate(self, phase: str) -> float | None:
        rates = [e["pass_rate"] for e in self.evals if e["phase"] == phase]
        return rates[-1] if rates else None


class _Stop:
    """Ctrl-C: during rollouts it interrupts at once (the runner cancels its episodes);
    during training it is taken at the next step boundary, so no step is half applied."""

    def __init__(self) -> None:
        self.requested = False
        self.training = False

    def __call__(self, signum, frame) -> None:
        self.requested = True
        if not self.training:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self):
        previous = signal.signal(signal.SIGINT, self)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def train_phase(self):
        self.training = True
        try:
            yield
        finally:
            self.training = False
        if self.requested:
            raise KeyboardInterrupt


def train(cfg: TrainConfig, *, resume: bool = False) -> TrainSummary:
    """Run ``cfg`` (see the module docstring); ``resume`` continues from its checkpoint."""
    start = time.monotonic()
    run = _Run(cfg, resume=resume)
    stop = _Stop()
    summary = TrainSummary(out_dir=run.out)
    try:
        with stop.installed():
            run.open()
            run.loop(stop)
    except KeyboardInterrupt:
        summary.interrupted = True
        run.save()
        print(
            f"\ninterrupted: checkpoint saved at step {run.trainer.version}; continue with "
            f"`gyre train ... --out {run.out} --resume`",
            file=sys.stderr,
        )
    finally:
        run.close()
    summary.evals = run.evals
    summary.wall_s = time.monotonic() - start
    run.finish(summary)
    return summary


class _Run:
    """The state of one run; methods are the loop's phases."""

    def __init__(self, cfg: TrainConfig, *, resume: bool):
        cfg.validate()
        self.cfg, self.resume = cfg, resume
        self.out = cfg.out_dir
        ckpt = self.out / "checkpoints" / "ckpt.pt"
        if resume:
            if not ckpt.is_file():
                raise ConfigError(f"--resume: no checkpoint at {ckpt}")
            _check_resumable(cfg, self.out / "config.json")
        elif ckpt.is_file():
            raise ConfigError(
                f"{self.out} already holds a run; pass --resume to continue it or choose "
                "another --out"
            )
        self.model_dir = prepare_model(cfg)
        self.train_tasks, self.heldout = load_tasks(cfg)
        self.rng = np.random.default_rng(cfg.seed)
        self.gold_tasks, self.rl_tasks = split_pool(cfg, self.train_tasks)
        self.cursor = Cursor()
        self._gold_data: tuple[list, dict] | None = None
        self.evals: list[dict] = []
        self.trainer = self.service = self.engine = self.store = self.logger = None

    # ---- setup ------------------------------------------------------------------
    def open(self) -> None:
        from gyre_env._optional import require

        require("torch", "gyre train")
        import torch

        from gyre_env.engines.embedded import EmbeddedEngine, EmbeddedEngineConfig
        from gyre_env.engines.tiny import load_tokenizer
        from gyre_env.train.metrics import MetricsLogger
        from gyre_env.trainers.torch_backend import TorchTrainer
        from gyre_env.trajectory.store import TrajectoryStore

        cfg = self.cfg
        t0 = time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.json").write_text(
            json.dumps(dataclasses.asdict(cfg), indent=1), encoding="utf-8"
        )
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.store = TrajectoryStore(self.out / "store.db")
        check_store_tokenizer(self.store, self.tokenizer, self.model_dir)
        trainer_class = TorchTrainer
        if cfg.backend == "megatron":
            from gyre_env.trainers.megatron import MegatronTrainer as trainer_class
        self.trainer = trainer_class(self.model_dir, cfg.optim_config(), cfg.loss_config())
        if self.resume:
            self.cursor = load_checkpoint(self.out / "checkpoints", self.trainer, self.rng)
            self.cursor.resumes += 1
            if self.cursor.phase == "done" and self.cursor.iteration < cfg.schedule.iterations:
                self.cursor.phase = "rl"  # a finished run resumed with more iterations
            self.evals = _read_evals(self.out / "metrics.jsonl")
        elif cfg.sft.trajectories and cfg.sft.steps:
            self.trainer.reset_optimizer(cfg.sft.lr)
        self.logger = MetricsLogger(
            self.out,
            tensorboard=cfg.logging.tensorboard,
            wandb=cfg.logging.wandb,
            wandb_project=cfg.logging.wandb_project,
            run_name=cfg.name,
            config=dataclasses.asdict(cfg),
            resume=self.resume,
        )
        self.engine = EmbeddedEngine(
            EmbeddedEngineConfig(
                model_path=str(self.model_dir),
                max_batch_size=max(cfg.rollout.parallel, 1),
                context_length=cfg.model.context_length,
            )
        )
        self.service = self._service([self.engine])
        if self.trainer.version:
            self.push_weights()
        self.logger.log("phase", {"phase": "setup", "seconds": time.monotonic() - t0})

    def _service(self, engines):
        from gyre_env.proxy.serving import ModelService, ModelServiceConfig

        return ModelService(
            ModelServiceConfig(context_length=self.cfg.model.context_length),
            engines=engines,
            tokenizer=self.tokenizer,
            sinks=(_KeepOpen(self.store),),
        ).start()

    def _agent(self, temperature: float):
        from gyre_env.agents import LangGraphAgent, LangGraphAgentConfig

        r = self.cfg.rollout
        return LangGraphAgent(
            LangGraphAgentConfig(
                max_steps=r.max_steps,
                max_new_tokens=r.max_new_tokens,
                temperature=temperature,
                subagent=False,
                nudges=0,
                seed=self.cfg.seed,
            )
        )

    # ---- the loop ---------------------------------------------------------------
    def loop(self, stop: _Stop) -> None:
        cfg, c = self.cfg, self.cursor
        if c.phase == "eval_random":
            if cfg.schedule.eval_random:
                self.evaluate("random")
            c.phase = "sft_record" if cfg.sft.trajectories and cfg.sft.steps else "rl"
            self.save()
        if c.phase == "sft_record":
            self.record_gold()
            c.phase = "sft_train"
            save_cursor(self.out / "checkpoints", c)
        if c.phase == "sft_train":
            self.sft(stop)
            self.trainer.reset_optimizer()
            c.phase = "rl"
            self.save()
            shutil.copytree(
                self.out / "checkpoints", self.out / "checkpoint-sft", dirs_exist_ok=True
            )
            self.export(self.out / "model-sft")
        while c.phase == "rl" and c.iteration < cfg.schedule.iterations:
            self.iteration(stop)
        c.phase = "done"
        self.save()
        self.export(self.out / "model")

    def evaluate(self, phase: str, step: int | None = None) -> dict:
        """``step``: the optimizer steps the evaluated weights took (default: this run's)."""
        t0 = time.monotonic()
        c = self.cursor
        stats = self.episodes(
            self.heldout,
            group_size=self.cfg.rollout.eval_attempts,
            run=f"eval.{phase}.{c.iteration:04d}.r{c.resumes}",
            temperature=self.cfg.rollout.eval_temperature,
            desc=f"eval {phase}",
        )
        row = {
            "phase": phase,
            "iteration": c.iteration,
            "step": self.trainer.version if step is None else step,
            "pass_rate": stats.pass_rate,
            "mean_score": stats.mean_score,
            "episodes": len(stats.valid),
            "time_eval": time.monotonic() - t0,
        }
        self.logger.log("eval", row)
        self.evals.append(row)
        _say(
            f"{_eval_label(self.cfg)} {phase} (step {row['step']}): pass rate {stats.pass_rate:.3f}, "
            f"mean score {stats.mean_score:.3f} over {len(stats.valid)} episodes"
        )
        return row

    def episodes(self, tasks, *, group_size, run, temperature, desc, group=None) -> RolloutStats:
        r = self.cfg.rollout
        stats = run_episodes(
            service=self.service,
            agent=self._agent(temperature),
            tasks=tasks,
            env_id=self.cfg.tasks.env_id,
            group_size=group_size,
            run=run,
            store=self.store,
            parallel=r.parallel,
            time_limit_s=r.time_limit_s,
            seed=self.cfg.seed,
            results_path=self.out / "episodes.jsonl",
            progress=self.cfg.logging.progress,
            desc=desc,
            env_kwargs=self.cfg.tasks.env_kwargs,
            group=group,
        )
        if stats.infra_errors:
            log.warning("%s: %d infra errors (excluded, never scored 0)", run, stats.infra_errors)
        return stats

    def record_gold(self) -> None:
        """Gold trajectories through the proxy into the store (run ``sft``)."""
        from gyre_env.proxy.scripted import ScriptedEngine
        from gyre_env.train.gold import GoldReplay

        t0 = time.monotonic()
        tasks = self.gold_tasks
        replay = ScriptedEngine(GoldReplay(self.tokenizer, tasks), name="gold-replay")
        service, self.service = self.service, self._service([replay])
        try:
            stats = self.episodes(  # one group: the shared system prompt is packed once
                tasks, group_size=1, run="sft", temperature=1.0, desc="gold", group="sft"
            )
        finally:
            self.service.stop()
            self.service = service
        if stats.mean_score < 1.0:
            bad = [r.task_id for r in stats.results if r.score != 1.0]
            raise RuntimeError(f"gold replay did not solve {bad[:5]}: check the tasks' gold")
        self.logger.log("phase", {"phase": "sft_record", "seconds": time.monotonic() - t0})

    def sft(self, stop: _Stop) -> None:
        t0 = time.monotonic()
        cfg, c = self.cfg.sft, self.cursor
        self._gold()  # no gold: fail before the progress bar
        bar = _bar(cfg.steps, "sft", self.cfg.logging.progress, initial=c.sft_step)
        started = time.monotonic()
        while c.sft_step < cfg.steps:
            if cfg.max_seconds is not None and time.monotonic() - started > cfg.max_seconds:
                break
            batch = self.gold_batch(self.rng)
            with stop.train_phase():  # a Ctrl-C is taken once the step is logged
                m = self.trainer.train_step(batch)
                c.sft_step += 1
                self.logger.log("sft", {"step": c.sft_step, **m})
            if bar is not None:
                bar.set_postfix_str(f"nll {m['nll']:.3f}")
                bar.update(1)
        if bar is not None:
            bar.close()
        self.push_weights()
        self.logger.log("phase", {"phase": "sft_train", "seconds": time.monotonic() - t0})
        self.evaluate("sft")

    def _gold(self) -> tuple[list, dict]:
        """The gold episodes (store run ``sft``) and their records, read once."""
        if self._gold_data is None:
            episodes = [e for e in self.store.episodes(run="sft") if e.outcome != "infra_error"]
            if not episodes:
                raise RuntimeError("no gold trajectories in the store (run 'sft')")
            records = {e.session: list(self.store.records([e.session])) for e in episodes}
            self._gold_data = episodes, records
        return self._gold_data

    def gold_batch(self, rng: np.random.Generator):
        """An SFT batch: ``sft.batch_size`` gold episodes drawn with ``rng``."""
        from gyre_env.trainers.protocol import TrainBatch
        from gyre_env.trajectory.tree import build_trees

        episodes, records = self._gold()
        n = min(self.cfg.sft.batch_size, len(episodes))
        pick = [episodes[i] for i in rng.choice(len(episodes), n, False)]
        trees = build_trees([r for e in pick for r in records[e.session]], pick)
        return TrainBatch(units=units_of(trees, self.cfg), kind="sft")

    def iteration(self, stop: _Stop) -> None:
        from gyre_env.trainers.protocol import TrainBatch

        cfg, c = self.cfg, self.cursor
        it = c.iteration
        t0 = time.monotonic()
        stats = None
        if c.rollout_run is None:
            n = cfg.rollout.tasks_per_iteration
            pool = len(self.rl_tasks)
            tasks = [self.rl_tasks[i] for i in self.rng.choice(pool, n, replace=n > pool)]
            tag = f"rl.{it:04d}.r{c.resumes}"
            stats = self.episodes(
                tasks,
                group_size=cfg.rollout.group_size,
                run=tag,
                temperature=cfg.rollout.temperature,
                desc=f"iter {it} rollout",
            )
            c.rollout_run = tag
            save_cursor(self.out / "checkpoints", c)
        t_rollout = time.monotonic() - t0
        t1 = time.monotonic()
        minibatches, skipped = rl_minibatches(
            self.store.trees(run=c.rollout_run), cfg, np.random.default_rng([cfg.seed, it])
        )
        staleness: dict[str, int] = {}
        train_tokens = train_s = 0.0
        # the RL steps, then sft.steps_per_iteration gold steps (c.minibatch counts both)
        while c.minibatch < len(minibatches) + cfg.gold_steps_per_iteration():
            rl = c.minibatch < len(minibatches)
            if rl:
                batch = TrainBatch(units=minibatches[c.minibatch], kind="rl")
                _count_lag(staleness, batch, self.trainer.version)
            else:  # a generator per step: a resumed run draws the same gold
                batch = self.gold_batch(np.random.default_rng([cfg.seed, 2, it, c.minibatch]))
            with stop.train_phase():  # a Ctrl-C is taken once the step is logged
                m = self.trainer.train_step(batch)
                c.minibatch += 1
                c.rl_step += rl
                row = {"step": self.trainer.version, "iteration": it, **m}
                self.logger.log("rl" if rl else "ptx", row)
            train_tokens += m["tokens"]
            train_s += m["step_s"]
        t_train = time.monotonic() - t1
        t2 = time.monotonic()
        self.push_weights()
        row = {
            "iteration": it,
            "step": self.trainer.version,
            "time_rollout": t_rollout,
            "time_train": t_train,
            "time_sync": time.monotonic() - t2,
            "train_tokens_per_s": train_tokens / train_s if train_s else 0.0,
            "staleness": staleness,
            "minibatches": len(minibatches),
            "groups_skipped": skipped,
        }
        if stats is not None:
            scores = stats.scores
            row.update(
                reward_mean=float(scores.mean()) if len(scores) else 0.0,
                reward_std=float(scores.std()) if len(scores) else 0.0,
                pass_rate=stats.pass_rate,
                zero_variance_groups=stats.zero_variance_groups(
                    functools.partial(episode_reward, cfg=cfg.sample_config())
                ),
                episodes=len(stats.results),
                infra_errors=stats.infra_errors,
                rollout_tokens_per_s=stats.sampled_tokens / stats.wall_s if stats.wall_s else 0.0,
                wait_fraction=stats.wait_fraction(),
            )
            _say(
                f"iter {it}: reward {row['reward_mean']:.3f} +- {row['reward_std']:.3f}, "
                f"pass {stats.pass_rate:.3f}, zero-variance groups "
                f"{row['zero_variance_groups']:.2f}, step {self.trainer.version} "
                f"({t_rollout:.0f}s rollout, {t_train:.0f}s train)"
            )
        self.logger.log("iteration", row)
        c.iteration, c.minibatch, c.rollout_run = it + 1, 0, None
        sched = cfg.schedule
        if c.iteration % sched.eval_every == 0 or c.iteration == sched.iterations:
            self.evaluate("rl")
        if c.iteration % sched.checkpoint_every == 0 or c.iteration == sched.iterations:
            self.save()

    def export(self, folder: Path) -> None:
        """The current weights and the tokenizer as a Hugging Face model folder, which
        ``gyre bench --model`` or any engine can serve."""
        self.trainer.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def push_weights(self) -> None:
        """The trainer's weights into the engine under the trainer's version (in-process
        weight sync: swapped in between decode steps, versions strictly increasing)."""
        from gyre_env.weightsync.inprocess import InProcessPublisher

        if self.engine.weight_version == self.trainer.version:
            return  # no optimizer step since the last push: the engine serves these weights
        publisher = InProcessPublisher([self.engine])
        named = list(self.trainer.named_parameters())
        self.service.proxy.call(publisher.apublish(named, self.trainer.version))

    # ---- the end ------------------------------------------------------------------
    def save(self) -> None:
        if self.trainer is not None:
            save_checkpoint(self.out / "checkpoints", self.trainer, self.cursor, self.rng)

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None
        if self.store is not None:
            self.store.close()
        if self.logger is not None:
            self.logger.close()

    def finish(self, summary: TrainSummary) -> None:
        from gyre_env.train.report import write_report

        if (self.out / "metrics.jsonl").is_file():
            try:
                path = write_report(self.out, title=f"gyre train {self.cfg.name}")
                _say(f"report: {path}")
            except Exception as e:  # a report must never cost the run
                log.warning("could not write the report: %s", e)
        for phase in ("random", "sft", "rl"):
            rate = summary.pass_rate(phase)
            if rate is not None:
                _say(f"{_eval_label(self.cfg)} pass rate, {phase}: {rate:.3f}")
        _say(f"wall time {summary.wall_s:.0f}s; run folder {self.out}")


class _KeepOpen:
    """The store as a record sink that a stopping proxy does not close (several model
    services write into the one store of a run)."""

    def __init__(self, store):
        self.store = store

    def write(self, record) -> None:
        self.store.write(record)

    def close(self) -> None:
        """The run closes the store."""


def _check_resumable(cfg: TrainConfig, saved_path: Path) -> None:
    """A checkpoint loads only into the backend and model shape that wrote it: say which
    differs (before: a raw state_dict error after the model was built)."""
    if not saved_path.is_file():
        return
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # an unreadable config.json: the checkpoint itself is what counts
    now = dataclasses.asdict(cfg)
    diffs = []
    for key in ("backend", "model"):
        was, new = saved.get(key, now[key]), now[key]
        if isinstance(was, dict) and isinstance(new, dict):
            diffs += [
                f"{key}.{k}: {was.get(k)!r} in the run, {new.get(k)!r} now"
                for k in new
                if k in was and was[k] != new[k]
            ]
        elif was != new:
            diffs.append(f"{key}: {was!r} in the run, {new!r} now")
    if diffs:
        raise ConfigError(
            f"--resume: {cfg.out_dir}'s checkpoint does not fit these settings ("
            + "; ".join(diffs)
            + "). Resume with the run's own settings, or start a new run with another --out"
        )


def evaluate_heldout(
    cfg: TrainConfig, model: Path, out: Path, phase: str, step: int | None = None
) -> dict:
    """Held-out evaluation of the Hugging Face folder ``model`` with ``cfg``'s tasks and
    rollout settings, as a run of its own under ``out``; returns the eval row (what
    ``gyre train`` logs as ``eval``), labelled with ``step`` (the optimizer steps the
    weights took; default 0, the evaluation run's own). The elastic driver evaluates its
    result with it."""
    sub = dataclasses.replace(
        cfg,
        out=str(out),
        model=dataclasses.replace(cfg.model, path=str(model)),
        sft=dataclasses.replace(cfg.sft, trajectories=0),
        schedule=dataclasses.replace(cfg.schedule, iterations=0),
    )
    run = _Run(sub, resume=False)
    try:
        run.open()
        return run.evaluate(phase, step)
    finally:
        run.close()


def units_of(trees, cfg: TrainConfig):
    """Packed units of ``trees`` under the run's sampling config."""
    from gyre_env.trajectory.packing import pack
    from gyre_env.trajectory.sampling import bounded_samples

    units, _ = bounded_samples(trees, cfg.sample_config())
    return [pack(u) for u in units]


def rl_minibatches(trees, cfg: TrainConfig, rng) -> tuple[list[list], int]:
    """One iteration's optimizer steps: per epoch the groups (trees) are shuffled and
    split into ``schedule.optimizer_steps`` minibatches, each cut into packed units.
    Groups without signal (all advantages 0) are left out first when
    ``algorithm.skip_zero_variance``. Returns the minibatches and how many groups were
    left out; deterministic for ``rng``'s seed (a resumed run rebuilds the same list)."""
    from gyre_env.trajectory.sampling import group_advantages

    kept = trees
    if cfg.algorithm.skip_zero_variance:
        sample = cfg.sample_config()
        kept = [t for t in trees if any(group_advantages(t, sample).values())]
    if not kept:
        return [], len(trees)
    out = []
    k = min(cfg.schedule.optimizer_steps, len(kept))
    for _ in range(cfg.schedule.epochs):
        for chunk in np.array_split(rng.permutation(len(kept)), k):
            units = units_of([kept[i] for i in chunk], cfg)
            if units:
                out.append(units)
    return out, len(trees) - len(kept)


def _count_lag(hist: dict[str, int], batch, version: int) -> None:
    from gyre_env.trajectory.packing import loss_token_lags

    for lag, count in loss_token_lags(batch.units, version).items():
        hist[str(lag)] = hist.get(str(lag), 0) + count


def prepare_model(cfg: TrainConfig) -> Path:
    """The model folder: the user's (checked to be a causal LM with a tokenizer) or the
    built-in tiny Qwen2 of ``cfg.model``'s shape, built here if missing."""
    m = cfg.model
    if m.path is None:
        from gyre_env.engines.tiny import TinyModelConfig, tiny_model_path

        return tiny_model_path(
            TinyModelConfig(
                seed=m.seed,
                hidden_size=m.hidden_size,
                intermediate_size=m.intermediate_size,
                num_layers=m.num_layers,
                num_heads=m.num_heads,
                num_kv_heads=m.num_kv_heads,
                initializer_range=m.initializer_range,
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


def split_pool(cfg: TrainConfig, train: list) -> tuple[list, list]:
    """(SFT's gold tasks, RL's tasks): ``sft.trajectories`` tasks with gold, drawn for the
    run's seed; RL samples the whole pool, or with ``tasks.rl_includes_sft_tasks = false``
    the rest of it (the whole pool if SFT took every task)."""
    n = cfg.sft.trajectories if cfg.sft.steps else 0
    order = np.random.default_rng([cfg.seed, 1]).permutation(len(train))
    gold = [train[i] for i in order if train[i].gold_dir][:n]
    if cfg.tasks.rl_includes_sft_tasks:
        return gold, list(train)
    taken = {t.id for t in gold}
    return gold, [t for t in train if t.id not in taken] or list(train)


def _eval_label(cfg: TrainConfig) -> str:
    return "held-out" if cfg.tasks.eval_split == "heldout" else cfg.tasks.eval_split


def load_tasks(cfg: TrainConfig):
    """(training pool, held-out tasks); the nano suite's splits are disjoint."""
    t = cfg.tasks
    if t.eval_split not in ("heldout", "validation"):
        raise ConfigError(
            f"tasks.eval_split: must be 'heldout' or 'validation', got {t.eval_split!r}"
        )
    tuning = t.eval_split == "validation"
    if t.suite == "nano":
        from gyre_env.tasks.nano import fit_size, nano_tasks

        fit, evaluate = ("fit", "validation") if tuning else ("train", "heldout")
        try:
            count = t.train_count
            if tuning:  # fit is train less validation: a count sized for train caps at it
                kw = {
                    k: v for k, v in t.suite_kwargs.items() if k in ("names", "only", "arg_names")
                }
                count = min(count, fit_size(t.seed, **kw))
            train = nano_tasks(fit, count, seed=t.seed, **t.suite_kwargs)
            kw = {**t.suite_kwargs, **t.eval_suite_kwargs}
            heldout = nano_tasks(evaluate, t.heldout_count, seed=t.seed, **kw)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"tasks: {e}") from e
    else:
        from gyre_env.tasks import load_suite

        if t.eval_suite_kwargs:
            raise ConfigError(
                f"tasks.eval_suite_kwargs: only the nano suite loads its evaluated tasks "
                f"apart; suite {t.suite!r} cuts them from one task list"
            )
        try:
            tasks = load_suite(t.suite, **t.suite_kwargs)
        except (KeyError, TypeError, ValueError, FileNotFoundError) as e:
            raise ConfigError(f"tasks: suite {t.suite!r}: {e}") from e
        order = np.random.default_rng(t.seed).permutation(len(tasks))
        if tuning:  # the held-out tasks leave; the next heldout_count validate
            order = order[t.heldout_count :]
        heldout = [tasks[i] for i in order[: t.heldout_count]]
        train = [tasks[i] for i in order[t.heldout_count :]][: t.train_count]
    if not train:
        raise ConfigError(f"tasks: suite {t.suite!r} gives no training tasks")
    if not heldout:
        raise ConfigError(f"tasks: suite {t.suite!r} gives no {t.eval_split} tasks")
    if cfg.sft.trajectories and cfg.sft.steps and not any(x.gold_dir for x in train):
        raise ConfigError("sft: no training task has a gold solution to replay")
    return train, heldout


def check_store_tokenizer(store, tokenizer, model_dir: Path) -> None:
    """A store holds token ids of one tokenizer: refuse to mix in another's."""
    import hashlib

    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), separators=(",", ":"))
    fingerprint = hashlib.sha256(vocab.encode()).hexdigest()[:16]
    known = store.meta("tokenizer")
    if known is None:
        store.set_meta("tokenizer", fingerprint)
        store.set_meta("model", str(model_dir))
    elif known != fingerprint:
        raise ConfigError(
            f"{store.path} holds token ids of another tokenizer (model "
            f"{store.meta('model')}), not {model_dir}'s: use a new --out"
        )


def _read_evals(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    # the rows as they were logged (a record's own ``kind`` and ``time`` are not part of it)
    return [
        {k: v for k, v in r.items() if k not in ("kind", "time")}
        for r in rows
        if r.get("kind") == "eval"
    ]


def _bar(total: int, desc: str, enabled: bool, initial: int = 0):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, unit="step", leave=False)


def _say(text: str) -> None:
    print(text, flush=True)
