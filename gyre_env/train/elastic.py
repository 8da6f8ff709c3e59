"""``gyre train --elastic --cells N``: the RL phase of a ``TrainConfig`` on elastic cells.

The same pieces as the synchronous loop (``gyre_env.train.loop``): the model folder, the
task pool, the store, ``run_episodes`` for a GRPO group's episodes (the LangGraph agent,
sandboxes, the proxy), ``units_of`` for packed units, and the torch trainer's loss; but
N cells change roles at runtime under Gyre's waterlevel policy, and one optimizer step
runs whenever the policy asks for one. Like the synchronous loop, a run starts with the
held-out evaluation of the initial model and the SFT warm start (the synchronous loop's
own phases, in ``OUT/warm-start/``; skipped with ``sft.trajectories = 0``) and ends with
the held-out evaluation of the trained weights (``OUT/eval-rl/``), which are written to
``OUT/model``. The elastic phase checkpoints every ``schedule.checkpoint_every`` steps
(``OUT/checkpoints/elastic.pt``: the core trainer's model, optimizer and version, the
driver's :class:`~gyre_env.scheduler.driver.DriverState`, the task sampler's state);
``--resume`` continues from there (Ctrl-C, a crash): the weights and optimizer state of
the last checkpoint, its finished groups not yet trained on, new groups numbered after
every group the store holds. Without ``--resume`` an ``OUT`` that holds an elastic run's
episodes is refused before any work (a second run would collide with the first's
sessions). With Ray the core rank's state comes over from its actor. With ``backend =
"megatron"`` every cell's trainer is megatron-core (the core sums the satellites' grad
buffers; on Ray over the ranks' gloo/NCCL group). The run writes
``store.db``, ``episodes.jsonl``, ``elastic.json`` (steps with their reward, switches
with phase times, the role timeline, per-cell busy seconds and idle reasons, the
staleness histogram, the held-out pass rates), ``metrics.jsonl`` (the driver's records:
steps, switches, cell states, per-cell busy/idle fractions; the evals) and
``report.html`` (the training report with the cell-role Gantt chart and the busy/idle
table) and ``elastic-trace.json`` (the run as simulator input, see
``gyre_env.sim.trace``; not for a resumed run).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from dataclasses import dataclass

from gyre_env.train.config import TrainConfig

RUN_PREFIX = "elastic."
"""The store's run of the elastic phase's group N is ``elastic.NNNNN``."""
CHECKPOINT = "elastic.pt"
"""The elastic phase's checkpoint, in ``OUT/checkpoints``."""


@dataclass
class EpisodeGroup:
    index: int
    run: str
    rewards: list[float]
    tokens: int


class EpisodeWorkload:
    """GRPO groups of real episodes (``Workload`` for the elastic driver)."""

    def __init__(self, cfg: TrainConfig, service, store, tasks: list, agent):
        import numpy as np

        self.cfg, self.service, self.store, self.tasks, self.agent = (
            cfg,
            service,
            store,
            tasks,
            agent,
        )
        self._rng = np.random.default_rng([cfg.seed, 11])
        self._lock = threading.Lock()
        self.trace: list[dict] = []
        """Per finished group, as the simulator reads it (``elastic_trace``): ``index``,
        ``start``, ``end`` (``time.time()``) and per scored episode its ``session``, its
        ``calls`` from the store and ``tool_s``, the seconds after each call before the
        next one or the episode's end (its tools, the agent's own time, the scoring)."""

    def run_group(self, index: int) -> EpisodeGroup:
        from gyre_env.train.rollout import run_episodes

        cfg = self.cfg
        with self._lock:
            task = self.tasks[int(self._rng.integers(len(self.tasks)))]
        tag = f"{RUN_PREFIX}{index:05d}"
        started = time.time()
        stats = run_episodes(
            service=self.service, agent=self.agent, tasks=[task], env_id=cfg.tasks.env_id,
            group_size=cfg.rollout.group_size, run=tag, store=self.store,
            parallel=cfg.rollout.group_size, time_limit_s=cfg.rollout.time_limit_s,
            seed=cfg.seed + index, results_path=cfg.out_dir / "episodes.jsonl", progress=False,
            desc=tag, env_kwargs=cfg.tasks.env_kwargs,
        )  # fmt: skip
        self._trace_group(index, started, stats.results)
        return EpisodeGroup(index, tag, [float(s) for s in stats.scores], stats.sampled_tokens)

    def _trace_group(self, index: int, started: float, results: list) -> None:
        """The group's episodes as simulator input (``trace``). An episode starts with
        its group (the runner starts all of them at once) and ends ``times["wall"]``
        later; an ``infra_error`` episode is left out (it trains nothing)."""
        from gyre_env.trajectory.records import trace_calls

        end, episodes = time.time(), []
        for res in results:
            if res.outcome == "infra_error" or not res.session:
                continue
            calls = trace_calls(self.store.records([res.session]))
            ends = [c["start"] + c["total"] for c in calls]
            finish = min(started + float(res.times.get("wall", end - started)), end)
            after = [c["start"] for c in calls[1:]] + [finish]
            tool = [max(b - a, 0.0) for a, b in zip(ends, after, strict=True)]
            episodes.append(dict(session=res.session, calls=calls, tool_s=tool))
        with self._lock:
            self.trace.append(dict(index=index, start=started, end=end, episodes=episodes))

    def units(self, groups: list[EpisodeGroup]) -> list:
        from gyre_env.train.loop import units_of

        trees = [t for g in groups for t in self.store.trees(run=g.run)]
        return units_of(trees, self.cfg)

    def tokens(self, group: EpisodeGroup) -> int:
        return group.tokens

    @property
    def sampler_state(self) -> dict:
        """The task sampler's state (a checkpoint keeps it)."""
        return self._rng.bit_generator.state

    @sampler_state.setter
    def sampler_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state


def warm_start(cfg: TrainConfig) -> tuple[TrainConfig, list[dict]]:
    """The synchronous loop's first phases (held-out eval of the initial model, gold SFT,
    held-out eval of the SFT model) in ``OUT/warm-start``; returns ``cfg`` pointed at the
    SFT model (unchanged when SFT is off) and the eval rows."""
    import dataclasses

    from gyre_env.train.loop import train

    if not (cfg.sft.trajectories and cfg.sft.steps):
        return cfg, []
    pre = dataclasses.replace(
        cfg,
        out=str(cfg.out_dir / "warm-start"),
        schedule=dataclasses.replace(cfg.schedule, iterations=0),
    )
    summary = train(pre, resume=(pre.out_dir / "checkpoints" / "ckpt.pt").is_file())
    if summary.interrupted:
        raise KeyboardInterrupt
    model = pre.out_dir / "model-sft"
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(model))), (
        summary.evals
    )


def train_elastic(cfg: TrainConfig, cells: int, ray: str | None = None, *, resume: bool = False):
    """Warm start, then ``cfg``'s RL phase on ``cells`` elastic cells, then the held-out
    evaluation; returns the ``ElasticResult`` (None when interrupted: the last checkpoint
    stands). ``resume``: continue the run in ``cfg.out`` (its warm start, or its elastic
    phase from the last checkpoint; see the module docstring). ``ray``:
    the cells' trainers are Ray actors in one placement group (``ray_cells.RayCells``;
    ``auto``, ``local`` or a cluster address, see ``ray_cells.connect``); None: all in
    this process."""
    from gyre_env.agents import LangGraphAgent, LangGraphAgentConfig
    from gyre_env.engines.tiny import load_tokenizer
    from gyre_env.proxy.serving import ModelService, ModelServiceConfig
    from gyre_env.scheduler.core_cell import with_reference
    from gyre_env.scheduler.driver import CallClock, DriverState, ElasticConfig, ElasticDriver
    from gyre_env.scheduler.local_cells import LocalCells, LocalCellsConfig
    from gyre_env.scheduler.policy import WaterlevelPolicy
    from gyre_env.train.loop import (
        _KeepOpen,
        check_store_tokenizer,
        evaluate_heldout,
        load_tasks,
        prepare_model,
        split_pool,
    )
    from gyre_env.trainers.torch_backend import TorchTrainer
    from gyre_env.trajectory.store import TrajectoryStore

    cfg.validate()
    if cfg.gold_steps_per_iteration():  # said, not silently left out
        print(
            f"note: sft.steps_per_iteration={cfg.sft.steps_per_iteration} (gold SFT steps "
            "between RL iterations) is the synchronous loop's; the elastic phase trains on "
            "its rollouts only",
            file=sys.stderr,
        )
        cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps_per_iteration=0))
    _check_out(cfg.out_dir, resume)
    if resume:
        _check_unfinished(cfg)
    if ray is not None:  # before any work: a missing extra, cluster or GPU fails here
        from gyre_env.scheduler.ray_cells import cell_devices, connect

        connect(ray)
        devices = cell_devices(cells)
    out = cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    cfg, evals = warm_start(cfg)
    ckpt_dir = out / "checkpoints"
    saved = _load_checkpoint(cfg, ckpt_dir) if resume else None
    _write_config(cfg)
    model_dir = prepare_model(cfg)
    train_pool, _ = load_tasks(cfg)
    _, rl_tasks = split_pool(cfg, train_pool)
    tokenizer = load_tokenizer(model_dir)
    store = TrajectoryStore(out / "store.db")
    check_store_tokenizer(store, tokenizer, model_dir)
    clock = CallClock()
    r = cfg.rollout

    def service(engines):
        sinks = (_KeepOpen(store), clock)
        return ModelService(
            ModelServiceConfig(context_length=cfg.model.context_length),
            engines=engines, tokenizer=tokenizer, sinks=sinks,
        ).start()  # fmt: skip

    agent = LangGraphAgent(LangGraphAgentConfig(
        max_steps=r.max_steps, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
        subagent=False, nudges=0, seed=cfg.seed,
    ))  # fmt: skip
    logger = _metrics_logger(cfg)
    cells_config = LocalCellsConfig(
        cells=cells, max_batch_size=max(r.parallel, 1), context_length=cfg.model.context_length
    )
    if ray is None:
        trainer_class = TorchTrainer
        if cfg.backend == "megatron":
            from gyre_env.trainers.megatron import MegatronTrainer as trainer_class
        pool = LocalCells(
            model_dir, tokenizer, cells_config, service_factory=service,
            trainer_factory=lambda d: with_reference(
                trainer_class(d, cfg.optim_config(), cfg.loss_config())
            ),
        )  # fmt: skip
    else:
        import ray as ray_module

        from gyre_env.scheduler.ray_cells import RayCells, RayGroupConfig

        nodes = sum(1 for n in ray_module.nodes() if n.get("Alive"))
        group = RayGroupConfig(
            trainer=cfg.backend,
            trainer_configs=(cfg.optim_config(), cfg.loss_config()),
            strategy="SPREAD" if nodes > 1 else "PACK",  # a cluster: cells over its nodes
            **devices,
        )
        device = "1 GPU" if group.gpus_per_rank else f"{group.cpus_per_rank:g} CPU"
        print(f"ray: {cells} cells on {nodes} node(s), {device} each, "
              f"{group.strategy}", flush=True)  # fmt: skip
        pool = RayCells(model_dir, tokenizer, cells_config, service_factory=service, ray=group)
    t0 = time.monotonic()
    interrupted = False
    try:
        pool.open()
        workload = EpisodeWorkload(cfg, pool.service, store, rl_tasks, agent)
        start = _restore(pool, workload, saved, out / "store.db") if saved is not None else None
        if start is None and resume:  # stopped before its first checkpoint: start over,
            stored = _stored_groups(out / "store.db")  # numbering after what is stored
            start = DriverState(next_index=max(stored) + 1) if stored else None
        sched = cfg.schedule
        config = ElasticConfig(
            steps=sched.iterations * sched.optimizer_steps,
            groups_per_step=max(1, r.tasks_per_iteration // sched.optimizer_steps),
            agent_slots=max(1, r.parallel // r.group_size), timeout_s=24 * 3600.0,
            profile_dir=str(out / "profiles") if cfg.logging.profile_switches else None,
        )  # fmt: skip
        policy = WaterlevelPolicy()
        driver = ElasticDriver(
            pool.cells, policy, workload, call=pool.proxy.call,
            router=pool.proxy.core.router, config=config, clock=clock, costs=pool.costs,
            metrics=logger, core=getattr(pool, "core", None), start=start,
            on_step=_checkpointer(cfg, ckpt_dir, pool, workload, config.steps),
        )  # fmt: skip
        try:
            result = driver.run()
        except KeyboardInterrupt:
            interrupted = True
        else:
            _export_newest(pool, tokenizer, out / "model")
            _trace_run(cfg, policy, cells_config, config, workload, result, start is not None)
    except BaseException:
        logger.close()
        raise
    finally:
        pool.close()
        store.close()
    if interrupted:
        logger.close()
        done = len(driver.state().steps)
        where = ckpt_dir / CHECKPOINT
        kept = f"the last checkpoint ({where})" if where.is_file() else "no checkpoint yet"
        print(f"interrupted after {done} steps; {kept}; continue with --resume", flush=True)
        return None
    try:
        if cfg.tasks.heldout_count:
            where = out / "eval-rl"
            if where.exists():  # a resumed run that trained further: keep the earlier one
                where = out / f"eval-rl-step{len(result.steps)}"
            warm = max((e["step"] for e in evals), default=0)  # the warm start's steps
            step = warm + len(result.steps)  # labelled as the sync loop labels its evals
            evals.append(evaluate_heldout(cfg, out / "model", where, "rl", step))
        for row in evals:
            logger.log("eval", row)
    finally:
        logger.close()
    result.evals = evals
    _write(out / "elastic.json", result)
    _report(cfg)
    for rec in result.switches:
        print(rec.summary(), flush=True)
    for s in result.steps:
        reward = s.get("reward_mean")
        shown = f"reward {reward:.3f}" if reward is not None else "no scored episodes"
        print(f"step {s['step']} on cells {s['cells']}: {shown}, loss {s['loss']:.4f}", flush=True)
    print(f"elastic: {len(result.steps)} steps, {len(result.switches)} switches, "
          f"{time.monotonic() - t0:.0f}s; {out / 'elastic.json'}", flush=True)  # fmt: skip
    if evals:
        rates = ", ".join(f"{e['phase']} {e['pass_rate']:.3f}" for e in evals)
        print(f"held-out pass rate: {rates}", flush=True)
    return result


def _trace_run(cfg: TrainConfig, policy, cells_config, config, workload, result, resumed: bool):
    """``OUT/elastic-trace.json``: the run as simulator input
    (``benchmarks/simulator_validation.py OUT``). Not for a resumed run: its wall time
    and groups would be those since the resume, its steps all of them."""
    from gyre_env.sim.trace import TRACE_FILE, write_elastic_trace

    if resumed:
        print(f"{TRACE_FILE}: not written for a resumed run", flush=True)
        return
    write_elastic_trace(
        cfg.out_dir, policy=policy, label=cfg.name, cells=cells_config.cells,
        max_batch_size=cells_config.max_batch_size, switch_prior_s=cells_config.switch_prior_s,
        config=config, group_size=cfg.rollout.group_size, result=result, groups=workload.trace,
    )  # fmt: skip


def _checkpointer(cfg: TrainConfig, folder, pool, workload, steps: int):
    """``on_step`` for the driver: a checkpoint every ``schedule.checkpoint_every`` steps
    and after the last one."""
    every = max(1, cfg.schedule.checkpoint_every)

    def on_step(driver) -> None:
        state = driver.state()
        if len(state.steps) % every and len(state.steps) < steps:
            return
        _save_checkpoint(folder, pool.cells[0].trainer, driver.core.version, state, workload)

    return on_step


def _save_checkpoint(folder, trainer, version: int, state, workload) -> None:
    import dataclasses

    import torch

    from gyre_env.train.checkpoint import _atomic_write

    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "trainer": trainer.state_dict(),
        "version": version,
        "driver": dataclasses.asdict(state),
        "tasks_rng": workload.sampler_state,
    }
    _atomic_write(folder / CHECKPOINT, lambda p: torch.save(data, p))


def _load_checkpoint(cfg: TrainConfig, folder) -> dict | None:
    """The elastic checkpoint (None: the phase had not checkpointed); a checkpoint written
    under another backend or model shape is refused naming the difference."""
    import torch

    from gyre_env.train.loop import _check_resumable

    path = folder / CHECKPOINT
    if not path.is_file():
        return None
    _check_resumable(cfg, cfg.out_dir / "config.json")
    return torch.load(path, weights_only=False)


def _write_config(cfg: TrainConfig) -> None:
    """The elastic phase's effective settings (after the warm start) as ``OUT/config.json``
    (what a resume is checked against)."""
    import dataclasses

    path = cfg.out_dir / "config.json"
    path.write_text(json.dumps(dataclasses.asdict(cfg), indent=1, default=str), encoding="utf-8")


def _restore(pool, workload, saved: dict, db):
    """Load a checkpoint into the open pool: the core trainer's state, its weights on the
    board and in every engine; returns the driver's start, new groups numbered after the
    last one the store holds (those run after the checkpoint included)."""
    from gyre_env.scheduler.driver import DriverState

    pool.load_core(saved["trainer"], int(saved["version"]))
    workload.sampler_state = saved["tasks_rng"]
    d = saved["driver"]
    ready = [EpisodeGroup(**g) for g in d["ready"]]
    stored = _stored_groups(db)
    return DriverState(
        steps=d["steps"], groups_trained=d["groups_trained"],
        groups_discarded=d["groups_discarded"], ready=ready,
        next_index=max([d["next_index"], *(i + 1 for i in stored)]),
    )  # fmt: skip


def _stored_groups(db) -> list[int]:
    """Indices of the elastic groups ``store.db`` holds anything of: a finished episode,
    or a call of one cut short."""
    import re
    import sqlite3

    pattern = re.compile(rf"^{re.escape(RUN_PREFIX)}(\d+)")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = con.execute(
            "SELECT run FROM episodes WHERE run LIKE ? UNION SELECT session FROM calls "
            "WHERE session LIKE ?", (f"{RUN_PREFIX}%", f"{RUN_PREFIX}%"),
        ).fetchall()  # fmt: skip
    finally:
        con.close()
    return [int(m[1]) for (name,) in names if (m := pattern.match(name))]


def _check_unfinished(cfg: TrainConfig) -> None:
    """Refuse ``--resume`` of an elastic run that ended (``elastic.json`` written) with
    all the steps asked for: there is nothing to continue."""
    from gyre_env.config import ConfigError

    path = cfg.out_dir / "elastic.json"
    if not path.is_file():
        return
    try:
        done = len(json.loads(path.read_text(encoding="utf-8"))["steps"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not an elastic run's result ({e})") from e
    sched = cfg.schedule
    wanted = sched.iterations * sched.optimizer_steps
    if done >= wanted:
        raise ConfigError(
            f"--resume: the elastic run in {cfg.out_dir} is finished ({done} of {wanted} "
            f"steps; results in {path}); to train it further, resume with a larger "
            "--iterations"
        )


def _check_out(out, resume: bool) -> None:
    """Refuse, before any work, an ``out`` whose store already holds an elastic phase's
    episodes unless the run is resumed: its sessions would collide with this run's."""
    import sqlite3

    from gyre_env.config import ConfigError

    db = out / "store.db"
    started = False
    if db.is_file():
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            started = con.execute(
                "SELECT 1 FROM episodes WHERE run LIKE ? LIMIT 1", (f"{RUN_PREFIX}%",)
            ).fetchone() is not None  # fmt: skip
        except sqlite3.DatabaseError as e:
            raise ConfigError(f"{db}: not a readable trajectory store ({e})") from e
        finally:
            con.close()
    if started and not resume:
        raise ConfigError(
            f"{out} already holds an elastic run's episodes (store.db); refusing to mix "
            "runs. Continue it with --resume, choose another --out (to reuse this run's "
            f"SFT model: --set model.path='{out / 'warm-start' / 'model-sft'}' --set "
            "sft.trajectories=0), or delete the folder"
        )
    if resume and not (
        started
        or (out / "warm-start" / "checkpoints" / "ckpt.pt").is_file()
        or (out / "checkpoints" / CHECKPOINT).is_file()
    ):
        raise ConfigError(f"--resume: no elastic run to continue in {out}")


def _metrics_logger(cfg: TrainConfig):
    import dataclasses

    from gyre_env.train.metrics import MetricsLogger

    lg = cfg.logging
    return MetricsLogger(
        cfg.out_dir, tensorboard=lg.tensorboard, wandb=lg.wandb, wandb_project=lg.wandb_project,
        run_name=cfg.name, config=dataclasses.asdict(cfg),
    )  # fmt: skip


def _report(cfg: TrainConfig) -> None:
    import logging

    from gyre_env.train.report import write_report

    try:
        print(f"report: {write_report(cfg.out_dir, title=f'gyre train --elastic {cfg.name}')}")
    except Exception as e:  # a report must never cost the run
        logging.getLogger(__name__).warning("could not write the report: %s", e)


def _export_newest(pool, tokenizer, folder) -> None:
    """The newest published weights as a Hugging Face folder (the model the run made),
    written here (on Ray the core's rank may sit on another node: the board's copy)."""
    if getattr(pool, "group", None) is not None:
        from gyre_env.trainers.torch_backend import TorchTrainer

        trainer = TorchTrainer(pool.model_dir)
        _, tensors = pool.board.latest()
        if tensors:
            trainer.load_named_parameters(tensors)
    else:
        trainer = pool.cells[0].trainer
        pool.cells[0].sync_trainer()
    trainer.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _write(path, result) -> None:
    from gyre_env.scheduler.driver import switch_values

    data = {
        "steps": result.steps,
        "switches": [switch_values(s, result.t0) for s in result.switches],
        "timeline": result.timeline,
        "seconds": result.seconds,
        "idle_reasons": result.idle_reasons,
        "cells": {c: result.cell_fractions(c) for c in result.seconds},
        "staleness": result.staleness,
        "wall_s": result.wall_s,
        "evals": result.evals,
    }
    path.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
