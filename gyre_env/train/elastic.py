"""``gyre train --elastic --cells N``: the RL phase of a ``TrainConfig`` on elastic cells.

The same pieces as the synchronous loop (``gyre_env.train.loop``): the model folder, the
task pool, the store, ``run_episodes`` for a GRPO group's episodes (the LangGraph agent,
sandboxes, the proxy), ``packed_units`` for packed units, and the torch trainer's loss; but
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

from gyre_env.config import ConfigError
from gyre_env.train.checkpoint import ELASTIC_CHECKPOINT, load_elastic, save_elastic
from gyre_env.train.config import TrainConfig
from gyre_env.train.loop import train
from gyre_env.train.rollout import rollout
from gyre_env.train.rollout_engines import attach_router, preflight, rollout_engines
from gyre_env.train.run import evaluate_heldout, sigterm_as_ctrl_c
from gyre_env.train.setup import (
    make_agent,
    make_trainer,
    metrics_logger,
    model_service,
    open_store,
    prepare_model,
    task_pool,
    write_config,
)
from gyre_env.trajectory.sampling import packed_units

RUN_PREFIX = "elastic."
"""The store's run of the elastic phase's group N is ``elastic.NNNNN``."""


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
        """Per finished group, as the simulator reads it (``gyre_env.sim.trace``): ``index``,
        ``start``, ``end`` (``time.time()``) and per scored episode its ``session``, its
        ``calls`` from the store and ``tool_s``, the seconds after each call before the
        next one or the episode's end (its tools, the agent's own time, the scoring)."""

    def run_group(self, index: int) -> EpisodeGroup:
        cfg = self.cfg
        with self._lock:
            task = self.tasks[int(self._rng.integers(len(self.tasks)))]
        tag = f"{RUN_PREFIX}{index:05d}"
        started = time.time()
        stats = rollout(
            cfg, service=self.service, store=self.store, agent=self.agent, tasks=[task],
            group_size=cfg.rollout.group_size, run=tag, desc=tag,
            parallel=cfg.rollout.group_size, seed=cfg.seed + index, progress=False,
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
        trees = [t for g in groups for t in self.store.trees(run=g.run)]
        return packed_units(trees, self.cfg.sample_config())

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
    this process. SIGTERM (a preemption) stops it as Ctrl-C does."""
    with sigterm_as_ctrl_c():
        return _train_elastic(cfg, cells, ray, resume=resume)


def _train_elastic(cfg: TrainConfig, cells: int, ray: str | None, *, resume: bool):
    from gyre_env.scheduler.driver import CallClock

    cfg = _bounded_staleness(_without_gold_steps(cfg))
    cfg.validate()
    cfg.check_sandboxes()  # a missing daemon or an unisolated backend: before any work
    _check_out(cfg.out_dir, resume)
    if resume:
        _check_unfinished(cfg)
    preflight(cfg, prepare_model(cfg), cells=cells)  # SGLang servers, before any work
    devices = _connect_ray(ray, cells) if ray is not None else None
    out = cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    cfg, evals = warm_start(cfg)
    saved = load_elastic(cfg, out / "checkpoints") if resume else None
    write_config(cfg)
    model_dir = prepare_model(cfg)
    rl_tasks = task_pool(cfg).rl  # bad tasks fail before any cell is built
    tokenizer, store = open_store(cfg, model_dir)
    clock = CallClock()
    agent = make_agent(cfg, cfg.rollout.temperature, cfg.rollout.min_p)
    logger = metrics_logger(cfg)
    try:
        pool = _cells(cfg, cells, devices, model_dir, tokenizer, store, clock)
    except BaseException:
        logger.close()
        store.close()
        raise
    t0 = time.monotonic()
    try:
        result = _run_phase(cfg, pool, store, rl_tasks, clock, agent, logger, saved, resume)
    except BaseException:
        logger.close()
        raise
    finally:
        pool.close()
        store.close()
    if result is None:
        logger.close()
        return None
    try:
        evals = _evaluate(cfg, result, evals)
        for row in evals:
            logger.log("eval", row)
    finally:
        logger.close()
    result.evals = evals
    _write(out / "elastic.json", result)
    _report(cfg)
    _print_result(result, evals, time.monotonic() - t0, out)
    return result


def _without_gold_steps(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with no gold steps between iterations (the synchronous loop's), said, not
    silently left out."""
    if not cfg.gold_steps_per_iteration():
        return cfg
    print(
        f"note: sft.steps_per_iteration={cfg.sft.steps_per_iteration} (gold SFT steps "
        "between RL iterations) is the synchronous loop's; the elastic phase trains on "
        "its rollouts only",
        file=sys.stderr,
    )
    return dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps_per_iteration=0))


def _bounded_staleness(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` whose loss zero-weights the tokens sampled more than the driver's staleness
    bound behind the trainer (``algorithm.loss.max_staleness``; unset: the driver's
    default bound, ``ElasticConfig.staleness_bound``). The driver admits rollouts within
    the same bound, but admission alone lets a sample past it be trained on (a long group,
    a lagging cell, groups carried over a resume); the loss drops those and counts them
    (``stale_tokens``)."""
    from gyre_env.scheduler.driver import ElasticConfig

    loss = cfg.algorithm.loss
    if loss.max_staleness is not None:
        return cfg
    bounded = dataclasses.replace(loss, max_staleness=ElasticConfig().staleness_bound)
    return dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, loss=bounded))


def _connect_ray(ray: str, cells: int) -> dict:
    """Before any work: a missing extra, cluster or GPU fails here. Returns the cells'
    devices (``ray_cells.cell_devices``)."""
    from gyre_env.scheduler.ray_cells import cell_devices, connect

    connect(ray)
    return cell_devices(cells)


def _cells(cfg: TrainConfig, cells: int, devices, model_dir, tokenizer, store, clock):
    """The cells' pool: all in this process (``devices`` None) or Ray actors."""
    from gyre_env.scheduler.core_cell import with_reference
    from gyre_env.scheduler.local_cells import LocalCells, LocalCellsConfig

    r = cfg.rollout
    config = LocalCellsConfig(
        cells=cells, max_batch_size=max(r.parallel, 1), context_length=cfg.model.context_length
    )

    def service(engines):
        return model_service(cfg, tokenizer, store, engines, extra_sinks=(clock,))

    engines = None
    if cfg.rollout.engine != "embedded":  # one server per cell (train.rollout_engines)

        def engines(configs):
            return rollout_engines(cfg, model_dir, [c["name"] for c in configs])

    if devices is None:
        return LocalCells(
            model_dir, tokenizer, config, service_factory=service, engine_factory=engines,
            trainer_factory=lambda d: with_reference(make_trainer(cfg, d)),
        )  # fmt: skip
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
    return RayCells(model_dir, tokenizer, config, service_factory=service, ray=group)


def _run_phase(cfg, pool, store, rl_tasks, clock, agent, logger, saved, resume: bool):
    """The elastic phase: the driver runs the waterlevel policy over the open pool until
    it took every step; returns its ``ElasticResult`` (None when interrupted) and writes
    ``OUT/model`` and the trace."""
    from gyre_env.scheduler.driver import DriverState, ElasticConfig, ElasticDriver
    from gyre_env.scheduler.policy import WaterlevelPolicy

    out, r, sched = cfg.out_dir, cfg.rollout, cfg.schedule
    pool.open()
    attach_router([c.engine for c in pool.cells], pool.proxy.core.router)
    workload = EpisodeWorkload(cfg, pool.service, store, rl_tasks, agent)
    start = _restore(pool, workload, saved, out / "store.db") if saved is not None else None
    if start is None and resume:  # stopped before its first checkpoint: start over,
        stored = _stored_groups(out / "store.db")  # numbering after what is stored
        start = DriverState(next_index=max(stored) + 1) if stored else None
    config = ElasticConfig(
        steps=sched.iterations * sched.optimizer_steps,
        groups_per_step=max(1, r.tasks_per_iteration // sched.optimizer_steps),
        agent_slots=max(1, r.parallel // r.group_size), timeout_s=24 * 3600.0,
        staleness_bound=cfg.algorithm.loss.max_staleness,  # the loss's too (_bounded_staleness)
        profile_dir=str(out / "profiles") if cfg.logging.profile_switches else None,
    )  # fmt: skip
    policy = WaterlevelPolicy()
    driver = ElasticDriver(
        pool.cells, policy, workload, call=pool.proxy.call,
        router=pool.proxy.core.router, config=config, clock=clock, costs=pool.costs,
        metrics=logger, core=pool.core, start=start,
        on_step=_checkpointer(cfg, out / "checkpoints", pool, workload, config.steps),
    )  # fmt: skip
    try:
        result = driver.run()
    except KeyboardInterrupt:
        done = len(driver.state().steps)
        where = out / "checkpoints" / ELASTIC_CHECKPOINT
        kept = f"the last checkpoint ({where})" if where.is_file() else "no checkpoint yet"
        print(f"interrupted after {done} steps; {kept}; continue with --resume", flush=True)
        return None
    _export_newest(pool, pool.tokenizer, out / "model")
    _trace_run(cfg, policy, pool.config, config, workload, result, start is not None)
    return result


def _evaluate(cfg: TrainConfig, result, evals: list[dict]) -> list[dict]:
    """The warm start's evals plus the held-out evaluation of ``OUT/model``."""
    if not cfg.tasks.heldout_count:
        return evals
    out = cfg.out_dir
    where = out / "eval-rl"
    if where.exists():  # a resumed run that trained further: keep the earlier one
        where = out / f"eval-rl-step{len(result.steps)}"
    warm = max((e["step"] for e in evals), default=0)  # the warm start's steps
    step = warm + len(result.steps)  # labelled as the sync loop labels its evals
    return [*evals, evaluate_heldout(cfg, out / "model", where, "rl", step)]


def _print_result(result, evals: list[dict], wall_s: float, out) -> None:
    for rec in result.switches:
        print(rec.summary(), flush=True)
    for s in result.steps:
        reward = s.get("reward_mean")
        shown = f"reward {reward:.3f}" if reward is not None else "no scored episodes"
        print(f"step {s['step']} on cells {s['cells']}: {shown}, loss {s['loss']:.4f}", flush=True)
    print(f"elastic: {len(result.steps)} steps, {len(result.switches)} switches, "
          f"{wall_s:.0f}s; {out / 'elastic.json'}", flush=True)  # fmt: skip
    if evals:
        rates = ", ".join(f"{e['phase']} {e['pass_rate']:.3f}" for e in evals)
        print(f"held-out pass rate: {rates}", flush=True)


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
        save_elastic(
            folder, pool.cells[0].trainer, driver.core.version, state, workload.sampler_state
        )

    return on_step


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
        or (out / "checkpoints" / ELASTIC_CHECKPOINT).is_file()
    ):
        raise ConfigError(f"--resume: no elastic run to continue in {out}")


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
    if pool.remote:
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
