"""Episodes for training and evaluation: G attempts per task through the runner, the
agent calling the policy through the proxy, every call and outcome into the store."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from gyre_env.runner import (
    EpisodeResult,
    EpisodeSpec,
    JsonlResultSink,
    MultiSink,
    Runner,
    RunnerConfig,
    StoreResultSink,
)


@dataclass
class RolloutStats:
    """What one batch of episodes gave."""

    results: list[EpisodeResult]
    wall_s: float

    @property
    def valid(self) -> list[EpisodeResult]:
        return [r for r in self.results if r.reward_valid and r.score is not None]

    @property
    def scores(self) -> np.ndarray:
        return np.array([r.score for r in self.valid], dtype=np.float64)

    @property
    def pass_rate(self) -> float:
        """Share of valid episodes whose hidden tests all passed."""
        s = self.scores
        return float((s >= 1.0).mean()) if len(s) else 0.0

    @property
    def mean_score(self) -> float:
        s = self.scores
        return float(s.mean()) if len(s) else 0.0

    @property
    def infra_errors(self) -> int:
        return sum(r.outcome == "infra_error" for r in self.results)

    @property
    def sampled_tokens(self) -> int:
        return sum(r.tokens for r in self.results)

    def zero_variance_groups(self, reward=float) -> float:
        """Share of groups whose valid attempts all got the same reward (no GRPO signal);
        ``reward`` maps a score to the reward trained on (``sampling.episode_reward``)."""
        groups: dict[str, list[float]] = {}
        for r in self.valid:
            groups.setdefault(r.group, []).append(reward(r.score))
        if not groups:
            return 0.0
        return float(np.mean([len(set(v)) <= 1 for v in groups.values()]))

    def wait_fraction(self) -> float:
        return float(np.mean([r.wait_fraction for r in self.results])) if self.results else 0.0


def run_episodes(
    *,
    service,
    agent,
    tasks: list,
    env_id: str,
    group_size: int,
    run: str,
    store,
    parallel: int,
    time_limit_s: float,
    seed: int,
    results_path=None,
    progress: bool = True,
    desc: str = "rollout",
    env_kwargs: dict | None = None,
    group: str | None = None,
) -> RolloutStats:
    """``group_size`` attempts of every task (one GRPO group per task, or all in ``group``),
    under ``run``."""
    specs = [
        EpisodeSpec(
            episode_id=f"{run}.{i}.{task.id}.{k}",
            env_id=env_id,
            env_kwargs={**(env_kwargs or {}), "tasks": [task]},
            reset_options={"task_id": task.id},
            seed=seed + k,
            group=group or task.id,
        )
        for i, task in enumerate(tasks)
        for k in range(group_size)
    ]
    sinks = [StoreResultSink(store, run=run)]
    if results_path is not None:
        sinks.append(JsonlResultSink(results_path))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(specs), desc=desc, file=sys.stderr, unit="ep", leave=False)

    def on_result(result: EpisodeResult) -> None:
        if bar is not None:
            bar.update(1)

    runner = Runner(
        agent,
        RunnerConfig(
            parallel=parallel, time_limit_s=time_limit_s, max_retries=1, wait_warn_fraction=1.0
        ),
        endpoint_factory=lambda session: service.endpoint(session),
        release_endpoint=service.release,
        sink=MultiSink(*sinks),
        on_result=on_result,
    )
    start = time.monotonic()
    try:
        results = runner.run(specs)
    finally:
        for sink in sinks[1:]:
            sink.close()
        if bar is not None:
            bar.close()
    return RolloutStats(results=results, wall_s=time.monotonic() - start)


def rollout(
    cfg,
    *,
    service,
    store,
    agent,
    tasks: list,
    group_size: int,
    run: str,
    desc: str,
    group: str | None = None,
    parallel: int | None = None,
    seed: int | None = None,
    progress: bool | None = None,
) -> RolloutStats:
    """``run_episodes`` with the run's settings (``cfg``, a ``TrainConfig``): its env,
    episode limits, seed, results file and progress bars, unless given here."""
    r = cfg.rollout
    return run_episodes(
        service=service,
        agent=agent,
        tasks=tasks,
        env_id=cfg.tasks.env_id,
        group_size=group_size,
        run=run,
        store=store,
        parallel=r.parallel if parallel is None else parallel,
        time_limit_s=r.time_limit_s,
        seed=cfg.seed if seed is None else seed,
        results_path=cfg.out_dir / "episodes.jsonl",
        progress=cfg.logging.progress if progress is None else progress,
        desc=desc,
        env_kwargs=cfg.tasks.env_kwargs,
        group=group,
    )
