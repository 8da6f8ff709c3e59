"""``gyre train``: the synchronous training loop, as a program.

    evaluate the starting model on the held-out tasks
    SFT: replay gold trajectories through the proxy -> store -> NLL steps -> evaluate
    repeat: sample tasks -> G episodes each (LangGraph agent, proxy, embedded engine)
            -> store -> token trees per GRPO group -> bounded units -> packed batches
            -> K optimizer steps (then the gold steps) -> push weights to the engine
            -> evaluate every N iterations -> checkpoint

The run's state and how each phase is done are ``train.run.TrainRun``'s; this module
says only what happens in which order. A cursor (``train.checkpoint.Cursor``) records
the phase, so ``resume`` continues where a run stopped: Ctrl-C or SIGTERM is taken at
once during rollouts and at the next step boundary during training, and saves a
checkpoint.
"""

from __future__ import annotations

import sys
import time

from gyre_env.train.config import TrainConfig
from gyre_env.train.run import Stop, TrainRun, TrainSummary


def train(cfg: TrainConfig, *, resume: bool = False) -> TrainSummary:
    """Run ``cfg`` (see the module docstring); ``resume`` continues from its checkpoint."""
    start = time.monotonic()
    run = TrainRun(cfg, resume=resume)  # settings, model folder and tasks checked: no I/O yet
    stop = Stop()
    summary = TrainSummary(out_dir=run.out)
    try:
        with stop.installed():
            run.open()  # store, trainer, engine and proxy
            _phases(run, stop)
    except KeyboardInterrupt:
        summary.interrupted = True
        run.save()
        print(
            f"\n{stop.describe()}: checkpoint saved at step {run.trainer.version}; "
            "continue with "
            f"`gyre train ... --out {run.out} --resume`",
            file=sys.stderr,
        )
    finally:
        run.close()
    summary.evals = run.evals
    summary.wall_s = time.monotonic() - start
    run.finish(summary)
    return summary


def _phases(run: TrainRun, stop: Stop) -> None:
    cfg, c = run.cfg, run.cursor
    sft = bool(cfg.sft.trajectories and cfg.sft.steps)
    if c.phase == "eval_random":
        if cfg.schedule.eval_random:
            run.evaluate("random")
        c.phase = "sft_record" if sft else "rl"
        run.save()
    if c.phase == "sft_record":
        run.record_gold()
        c.phase = "sft_train"
        run.save_cursor()
    if c.phase == "sft_train":
        run.sft(stop)
        run.evaluate("sft")
        c.phase = "rl"
        run.end_sft()  # a fresh optimizer for RL; checkpoint-sft/ and model-sft/
    while c.phase == "rl" and c.iteration < cfg.schedule.iterations:
        _iteration(run, stop)
    if c.phase == "rl":
        run.baselines()
    c.phase = "done"
    run.save()
    run.export(run.out / "model")


def _iteration(run: TrainRun, stop: Stop) -> None:
    """One RL iteration: rollouts (unless the resumed cursor has them), the optimizer
    steps on them and the gold steps, a weight push, then eval and checkpoint."""
    cfg, c = run.cfg, run.cursor
    it, t0 = c.iteration, time.monotonic()
    rollouts = c.rollout_run is None and cfg.schedule.rl_updates
    stats = run.rollouts(it) if rollouts else None
    t1 = time.monotonic()
    steps = run.train_steps(it, stop)
    t2 = time.monotonic()
    run.push_weights()
    times = {"time_rollout": t1 - t0, "time_train": t2 - t1, "time_sync": time.monotonic() - t2}
    run.log_iteration(it, times, steps, stats)
    c.iteration, c.minibatch, c.rollout_run = it + 1, 0, None
    sched = cfg.schedule
    if c.iteration % sched.eval_every == 0 or c.iteration == sched.iterations:
        run.evaluate("rl")
    if c.iteration % sched.checkpoint_every == 0 or c.iteration == sched.iterations:
        run.save()
