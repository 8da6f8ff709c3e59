"""The machinery of a synchronous ``gyre train`` run (``TrainRun``): its state and one
method per phase. ``train.loop`` is the program that runs the phases in order.

Everything a run writes goes under ``cfg.out_dir``: ``store.db`` (every call and outcome:
training reads what the store holds), ``metrics.jsonl``, ``tensorboard/``,
``checkpoints/``, ``episodes.jsonl``, ``report.html``, ``model-sft/`` and ``model/``. The
building blocks (model, task pool, store, service, agent: ``train.setup``; episodes:
``train.rollout``; gold: ``train.gold``; minibatches: ``trajectory.sampling``;
checkpoints: ``train.checkpoint``) are the elastic driver's (``train.elastic``) too.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import random
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gyre_env.config import ConfigError
from gyre_env.tasks.splits import draw_rl_tasks
from gyre_env.train.checkpoint import (
    Cursor,
    atomic_write,
    check_resumable,
    load_checkpoint,
    save_checkpoint,
    save_cursor,
)
from gyre_env.train.config import TrainConfig
from gyre_env.train.rollout import RolloutStats, rollout
from gyre_env.train.rollout_engines import (
    attach_router,
    engine_names,
    preflight,
    push_weights,
    rollout_engines,
)
from gyre_env.train.setup import (
    eval_label,
    grading_config,
    make_agent,
    make_trainer,
    metrics_logger,
    model_service,
    open_store,
    prepare_model,
    say,
    task_pool,
    write_config,
)
from gyre_env.trajectory.sampling import episode_reward, rl_minibatches

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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Ctrl-C, and SIGTERM: what a preempting scheduler (Slurm, Kubernetes, a spot VM) or
``kill`` sends before it kills. Both stop the run with a checkpoint."""


class Stop:
    """Ctrl-C or SIGTERM: during rollouts it interrupts at once (the runner cancels its
    episodes); during training it is taken at the next step boundary, so no step is half
    applied. Either way the run saves a checkpoint and exits."""

    def __init__(self) -> None:
        self.requested = False
        self.training = False
        self.signal: int | None = None

    def __call__(self, signum, frame) -> None:
        self.requested, self.signal = True, signum
        if not self.training:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self):
        previous = {s: signal.signal(s, self) for s in STOP_SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def describe(self) -> str:
        """How the run was stopped, for the message that says where it stands."""
        if self.signal == signal.SIGTERM:
            return "terminated (SIGTERM)"
        return "interrupted"

    @contextmanager
    def train_phase(self):
        self.training = True
        try:
            yield
        finally:
            self.training = False
        if self.requested:
            raise KeyboardInterrupt


class TrainRun:
    """The state of one synchronous run; its methods are the phases ``train.loop`` runs
    in order."""

    def __init__(self, cfg: TrainConfig, *, resume: bool):
        cfg.validate()
        cfg.check_sandboxes()  # a missing daemon or an unisolated backend: before any work
        self.cfg, self.resume, self.out = cfg, resume, cfg.out_dir
        ckpt = self.out / "checkpoints" / "ckpt.pt"
        if resume:
            if not ckpt.is_file():
                raise ConfigError(f"--resume: no checkpoint at {ckpt}")
            check_resumable(cfg, self.out / "config.json")
        elif ckpt.is_file():
            raise ConfigError(
                f"{self.out} already holds a run; pass --resume to continue it or choose "
                "another --out"
            )
        self.model_dir = prepare_model(cfg)
        preflight(cfg, self.model_dir)  # SGLang servers that do not answer or differ
        self.tasks = task_pool(cfg)
        self.rng = np.random.default_rng(cfg.seed)
        self.cursor = Cursor()
        self.evals: list[dict] = []
        self.trainer = self.service = self.store = self.logger = None
        self.engines: list = []

    # ---- setup ------------------------------------------------------------------
    def open(self) -> None:
        from gyre_env._optional import require

        require("torch", "gyre train")
        import torch

        from gyre_env.train.gold import GoldSet

        cfg, t0 = self.cfg, time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        write_config(cfg)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.tokenizer, self.store = open_store(cfg, self.model_dir)
        self.gold = GoldSet(self.store)
        self.trainer = make_trainer(cfg, self.model_dir)
        if self.resume:
            self.cursor = load_checkpoint(self.out / "checkpoints", self.trainer, self.rng)
            self.cursor.resumes += 1
            if self.cursor.phase == "done" and self.cursor.iteration < cfg.schedule.iterations:
                self.cursor.phase = "rl"  # a finished run resumed with more iterations
            self.evals = read_evals(self.out / "metrics.jsonl")
        elif cfg.sft.trajectories and cfg.sft.steps:
            cosine = cfg.sft.steps if cfg.sft.lr_schedule == "cosine" else 0
            self.trainer.reset_optimizer(cfg.sft.lr, cosine_steps=cosine, min_lr=cfg.sft.lr_min)
        self.logger = metrics_logger(cfg, resume=self.resume)
        self.engines = rollout_engines(cfg, self.model_dir, engine_names(cfg))
        self.service = model_service(cfg, self.tokenizer, self.store, self.engines)
        attach_router(self.engines, self.service.proxy.core.router)
        if self.trainer.version or any(e.weight_version for e in self.engines):
            self.push_weights()  # a resumed run, or servers left at another run's weights
        self.logger.log("phase", {"phase": "setup", "seconds": time.monotonic() - t0})

    def episodes(
        self, tasks, *, group_size, run, temperature, desc, group=None, min_p=0.0
    ) -> RolloutStats:
        stats = rollout(
            self.cfg,
            service=self.service,
            store=self.store,
            agent=make_agent(self.cfg, temperature, min_p),
            tasks=tasks,
            group_size=group_size,
            run=run,
            desc=desc,
            group=group,
        )
        if stats.infra_errors:
            log.warning("%s: %d infra errors (excluded, never scored 0)", run, stats.infra_errors)
        return stats

    def evaluate(self, phase: str, step: int | None = None) -> dict:
        """``step``: the optimizer steps the evaluated weights took (default: this run's)."""
        t0, c, r = time.monotonic(), self.cursor, self.cfg.rollout
        stats = self.episodes(
            self.tasks.heldout,
            group_size=r.eval_attempts,
            run=f"eval.{phase}.{c.iteration:04d}.r{c.resumes}",
            temperature=r.eval_temperature,
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
        say(
            f"{eval_label(self.cfg)} {phase} (step {row['step']}): pass rate "
            f"{stats.pass_rate:.3f}, mean score {stats.mean_score:.3f} over "
            f"{len(stats.valid)} episodes"
        )
        return row

    def baselines(self) -> None:
        """The no-learning baselines (``scoring.nano_baselines``) on the evaluated tasks, as
        ``baseline`` rows: the pass rates RL's result must beat without reading the spec.
        Generated nano tasks only (``schedule.baselines``)."""
        cfg = self.cfg
        if not (cfg.schedule.baselines and cfg.tasks.suite == "nano" and self.tasks.heldout):
            return
        from gyre_env.scoring.nano_baselines import no_learning_baselines

        t0, grading = time.monotonic(), grading_config(cfg)
        say(f"no-learning baselines on the {len(self.tasks.heldout)} {eval_label(cfg)} tasks")
        found = no_learning_baselines(
            self.tasks.heldout, self.tasks.train, grading, parallel=cfg.rollout.parallel
        )
        for name, per_task in found.items():
            rate = float(np.mean(list(per_task.values()))) if per_task else None
            self.logger.log("baseline", {"name": name, "pass_rate": rate, "tasks": len(per_task)})
            say(f"  {name}: pass rate {rate:.3f}" if rate is not None else f"  {name}: -")
        self.logger.log("phase", {"phase": "baselines", "seconds": time.monotonic() - t0})

    def record_gold(self) -> None:
        """Gold trajectories through the proxy into the store (run ``sft``)."""
        from gyre_env.proxy.scripted import ScriptedEngine
        from gyre_env.train.gold import GoldReplay

        t0, tasks = time.monotonic(), self.tasks.gold
        replay = ScriptedEngine(GoldReplay(self.tokenizer, tasks), name="gold-replay")
        service = self.service
        self.service = model_service(self.cfg, self.tokenizer, self.store, [replay])
        try:
            stats = self.episodes(  # one group: the shared system prompt is packed once
                tasks, group_size=1, run="sft", temperature=1.0, desc="gold", group="sft"
            )
        finally:
            self.service.stop()
            self.service = service
        gold_failure(stats.results)
        self.logger.log("phase", {"phase": "sft_record", "seconds": time.monotonic() - t0})

    def gold_batch(self, rng: np.random.Generator):
        """An SFT batch: ``sft.batch_size`` gold episodes drawn with ``rng``."""
        return self.gold.batch(rng, self.cfg.sft.batch_size, self.cfg.sample_config())

    def sft(self, stop: Stop) -> None:
        t0, cfg, c = time.monotonic(), self.cfg.sft, self.cursor
        self.gold.episodes()  # no gold: fail before the progress bar
        bar = progress_bar(cfg.steps, "sft", self.cfg.logging.progress, initial=c.sft_step)
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

    def end_sft(self) -> None:
        """After SFT: a fresh optimizer for RL, a checkpoint (also kept as
        ``checkpoint-sft/``) and the SFT model as ``model-sft/``."""
        self.trainer.reset_optimizer()
        self.save()
        shutil.copytree(self.out / "checkpoints", self.out / "checkpoint-sft", dirs_exist_ok=True)
        self.export(self.out / "model-sft")

    def rollouts(self, it: int) -> RolloutStats:
        """The iteration's GRPO groups, into the store under a run tag the cursor keeps."""
        cfg, c = self.cfg, self.cursor
        tasks = draw_rl_tasks(
            self.tasks.rl,
            cfg.rollout.tasks_per_iteration,
            self.rng,
            no_gold_share=cfg.tasks.rl_no_gold_share,
        )
        tag = f"rl.{it:04d}.r{c.resumes}"
        stats = self.episodes(
            tasks,
            group_size=cfg.rollout.group_size,
            run=tag,
            temperature=cfg.rollout.temperature,
            min_p=cfg.rollout.min_p,
            desc=f"iter {it} rollout",
        )
        c.rollout_run = tag
        self.save_cursor()
        return stats

    def train_steps(self, it: int, stop: Stop) -> dict:
        """The RL steps on the iteration's rollouts, then ``sft.steps_per_iteration`` gold
        steps (``cursor.minibatch`` counts both, so a resume takes the same steps)."""
        from gyre_env.trainers.protocol import TrainBatch
        from gyre_env.trajectory.packing import loss_token_lags

        cfg, c = self.cfg, self.cursor
        minibatches, skipped = [], 0  # schedule.rl_updates off: the gold steps alone
        if cfg.schedule.rl_updates:
            minibatches, skipped = rl_minibatches(
                self.store.trees(run=c.rollout_run),
                cfg.sample_config(),
                steps=cfg.schedule.optimizer_steps,
                epochs=cfg.schedule.epochs,
                skip_zero_variance=cfg.algorithm.skip_zero_variance,
                rng=np.random.default_rng([cfg.seed, it]),
            )
        if cfg.algorithm.loss.policy_loss == "decoupled" and c.minibatch < len(minibatches):
            self.proximal(it, [u for units in minibatches for u in units])
        staleness: collections.Counter[str] = collections.Counter()
        tokens = seconds = 0.0
        while c.minibatch < len(minibatches) + cfg.gold_steps_per_iteration():
            rl = c.minibatch < len(minibatches)
            if rl:
                batch = TrainBatch(units=minibatches[c.minibatch], kind="rl")
                lags = loss_token_lags(batch.units, self.trainer.version)
                staleness.update({str(lag): n for lag, n in lags.items()})
            else:  # a generator per step: a resumed run draws the same gold
                batch = self.gold_batch(np.random.default_rng([cfg.seed, 2, it, c.minibatch]))
            with stop.train_phase():  # a Ctrl-C is taken once the step is logged
                m = self.trainer.train_step(batch)
                c.minibatch += 1
                c.rl_step += rl
                self.logger.log(
                    "rl" if rl else "ptx", {"step": self.trainer.version, "iteration": it, **m}
                )
            tokens += m["tokens"]
            seconds += m["step_s"]
        return {
            "train_tokens_per_s": tokens / seconds if seconds else 0.0,
            "staleness": dict(staleness),
            "minibatches": len(minibatches),
            "groups_skipped": skipped,
        }

    def proximal(self, it: int, units: list) -> None:
        """Decoupled PPO's proximal policy: the logprobs of the weights this iteration's
        updates start from, on every unit of its minibatches, computed before its first
        update (``Trainer.set_proximal``) and kept beside the checkpoint, so that a run
        resumed mid-iteration trains against the same proximal policy."""
        path = self.out / "checkpoints" / "proximal.npz"
        if self.cursor.minibatch > 0 and path.is_file():
            with np.load(path) as saved:
                if int(saved["iteration"]) == it and int(saved["units"]) == len(units):
                    for i, unit in enumerate(units):
                        unit.proximal_logprobs = saved[f"u{i}"]
                    return
        if self.cursor.minibatch > 0:
            say(f"iter {it}: no saved proximal logprobs; the resumed weights stand in")
        self.trainer.set_proximal(units)
        arrays = {f"u{i}": u.proximal_logprobs for i, u in enumerate(units)}
        path.parent.mkdir(parents=True, exist_ok=True)

        def write(tmp: Path) -> None:
            with tmp.open("wb") as f:  # a file: np.savez would append .npz to a name
                np.savez(f, iteration=it, units=len(units), **arrays)

        atomic_write(path, write)

    def log_iteration(self, it: int, times: dict, steps: dict, stats) -> None:
        """The ``iteration`` record (and its line on stdout when it ran rollouts)."""
        row = {"iteration": it, "step": self.trainer.version, **times, **steps}
        if stats is not None:
            row.update(self.rollout_row(stats))
            say(
                f"iter {it}: reward {row['reward_mean']:.3f} +- {row['reward_std']:.3f}, "
                f"pass {stats.pass_rate:.3f}, zero-variance groups "
                f"{row['zero_variance_groups']:.2f}, step {self.trainer.version} "
                f"({times['time_rollout']:.0f}s rollout, {times['time_train']:.0f}s train)"
            )
        self.logger.log("iteration", row)

    def rollout_row(self, stats: RolloutStats) -> dict:
        """The iteration record's rollout fields."""
        scores = stats.scores
        return dict(
            reward_mean=float(scores.mean()) if len(scores) else 0.0,
            reward_std=float(scores.std()) if len(scores) else 0.0,
            pass_rate=stats.pass_rate,
            zero_variance_groups=stats.zero_variance_groups(
                functools.partial(episode_reward, cfg=self.cfg.sample_config())
            ),
            episodes=len(stats.results),
            infra_errors=stats.infra_errors,
            rollout_tokens_per_s=stats.sampled_tokens / stats.wall_s if stats.wall_s else 0.0,
            wait_fraction=stats.wait_fraction(),
        )

    def export(self, folder: Path) -> None:
        """The current weights and the tokenizer as a Hugging Face model folder, which
        ``gyre bench --model`` or any engine can serve."""
        self.trainer.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def push_weights(self) -> None:
        """The trainer's weights into the engines under the trainer's version: swapped in
        between decode steps (embedded), or through each SGLang server's update API in
        ``rollout.sglang.weight_sync``'s mode (``train.rollout_engines.push_weights``)."""
        version = self.trainer.version
        if all(e.weight_version == version for e in self.engines):
            return  # no optimizer step since the last push: the engines serve these weights
        named = list(self.trainer.named_parameters())
        self.service.proxy.call(push_weights(self.engines, named, version), timeout=None)

    # ---- the end ------------------------------------------------------------------
    def save_cursor(self) -> None:
        """Only the cursor (the phase moved on, no optimizer step since the checkpoint)."""
        save_cursor(self.out / "checkpoints", self.cursor)

    def save(self) -> None:
        if self.trainer is not None:
            save_checkpoint(self.out / "checkpoints", self.trainer, self.cursor, self.rng)

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None
        for engine in self.engines:
            if hasattr(engine, "attach_router"):
                engine.close()  # a launched SGLang server stops; an attached one stays
        if self.store is not None:
            self.store.close()
        if self.logger is not None:
            self.logger.close()

    def finish(self, summary: TrainSummary) -> None:
        from gyre_env.train.report import write_report

        if (self.out / "metrics.jsonl").is_file():
            try:
                say(f"report: {write_report(self.out, title=f'gyre train {self.cfg.name}')}")
            except Exception as e:  # a report must never cost the run
                log.warning("could not write the report: %s", e)
        for phase in ("random", "sft", "rl"):
            rate = summary.pass_rate(phase)
            if rate is not None:
                say(f"{eval_label(self.cfg)} pass rate, {phase}: {rate:.3f}")
        say(f"wall time {summary.wall_s:.0f}s; run folder {self.out}")


@contextmanager
def sigterm_as_ctrl_c():
    """SIGTERM handled as Ctrl-C (``KeyboardInterrupt`` in the main thread) while the block
    runs: a preempted elastic run stops the way a Ctrl-C stops it. Outside the main
    thread (where no handler can be installed) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def gold_failure(results: list) -> None:
    """Raise naming why gold replay fell short, if it did. Episodes that never got graded
    (``infra_error``: a sandbox that did not start, a grader that crashed) are the
    machine's fault, not the gold's: when no gold episode was graded, the error counts
    them and gives the first reason; only gold that was graded below 1 blames the tasks.
    (A few infra errors among solved gold are left out, as everywhere in training.)"""
    infra = [r for r in results if r.outcome == "infra_error"]
    valid = [r for r in results if r.reward_valid and r.score is not None]
    bad = [r.task_id for r in valid if r.score != 1.0]
    reason = next((r.message for r in infra if r.message), "no reason recorded")
    also = f" (and {len(infra)} infra errors, not graded: {reason})" if infra else ""
    if bad:
        raise RuntimeError(f"gold replay did not solve {bad[:5]}: check the tasks' gold{also}")
    if not valid:
        if infra:
            raise RuntimeError(
                f"gold replay: {len(infra)} of {len(results)} gold episodes were infra errors "
                f"(never graded; not the gold's fault): {reason}"
            )
        outcomes = sorted({r.outcome for r in results})
        raise RuntimeError(f"gold replay: no gold episode was graded (outcomes {outcomes})")


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
    run = TrainRun(sub, resume=False)
    try:
        run.open()
        return run.evaluate(phase, step)
    finally:
        run.close()


def read_evals(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    # the rows as they were logged (a record's own ``kind`` and ``time`` are not part of it)
    return [
        {k: v for k, v in r.items() if k not in ("kind", "time")}
        for r in rows
        if r.get("kind") == "eval"
    ]


def progress_bar(total: int, desc: str, enabled: bool, initial: int = 0):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, unit="step", leave=False)
