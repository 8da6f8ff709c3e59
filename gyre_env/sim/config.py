"""Typed configuration of a simulation (``gyre simulate CONFIG.toml``).

A ``SimConfig`` holds the cluster (``[cells]``), the agent workload (``[workload]``, with
one table per distribution: ``[workload.tool_s]``...), the RL batch (``[training]``), the
policies to compare (``[policies]``, one table per policy) and the sweeps (``[sweep]``).
Unknown keys and wrong types are rejected with the dotted key named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gyre_env.config import ConfigError, from_dict


@dataclass(kw_only=True)
class Dist:
    """A positive quantity: a lognormal body, optionally mixed with a Pareto tail, clipped.

    ``sigma = 0`` and ``tail_fraction = 0`` make it the constant ``median``.
    """

    median: float
    sigma: float = 0.0
    """Log-space standard deviation of the body."""
    tail_fraction: float = 0.0
    """Share of draws taken from the Pareto tail instead of the body."""
    tail_alpha: float = 1.5
    """Pareto shape: smaller is heavier (the mean is infinite at alpha <= 1)."""
    tail_min: float = 0.0
    """Pareto scale: the smallest tail value."""
    min: float = 0.0
    max: float = float("inf")

    def __post_init__(self) -> None:
        if self.median < 0 or self.sigma < 0 or not 0 <= self.tail_fraction <= 1:
            raise ValueError(f"bad distribution {self}")
        if self.tail_fraction and (self.tail_alpha <= 0 or self.tail_min <= 0):
            raise ValueError("a Pareto tail needs tail_alpha > 0 and tail_min > 0")


@dataclass(kw_only=True)
class CellConfig:
    """The cells of the cluster: what one cell can serve and train, and what switching costs."""

    count: int = 8
    max_concurrent: int = 32
    """Requests one ROLLOUT cell serves at once (bounded by its KV memory)."""
    prefill_tokens_per_s: float = 20000.0
    """Prompt tokens per second a cell prefills (new tokens only: prefixes are cached)."""
    decode_tokens_per_s: float = 60.0
    """Output tokens per second of one request decoding alone at a short context."""
    batch_slowdown: float = 0.02
    """Per-request decode rate is divided by ``1 + batch_slowdown * (batch - 1)``."""
    shared_host: bool = False
    """The cells share one machine's cores (the CPU cells of ``benchmarks/elastic.py``,
    whose two engines together decode about what one decodes alone), not devices: an
    output token of any call takes every busy engine's decode step in turn, ``(E +
    batch_slowdown x (n - E)) / decode_tokens_per_s`` seconds with ``n`` calls in flight
    on ``E`` engines, and the calls in flight speed up and slow down as that changes."""
    host_call_s: float = 0.0
    """With ``shared_host``: seconds each call starting on the host holds up every call
    in flight there (its prefill, and the host's own work to route it)."""
    context_halfspeed_tokens: float = 131072.0
    """Context length at which per-request decode runs at half speed (attention cost)."""
    train_tokens_per_s: float = 20000.0
    """Training throughput of one cell (forward + backward), tokens/s."""
    dp_efficiency: float = 0.9
    """Data-parallel efficiency of a step on more than one cell."""
    step_overhead_s: float = 2.0
    """Fixed cost of one optimizer step (optimizer, gradient reduce latency)."""
    switch_to_training_s: float = 8.52
    """ROLLOUT -> TRAINING (release engine memory, load trainer state)."""
    switch_to_rollout_s: float = 3.46
    """TRAINING -> ROLLOUT (offload trainer, resume engine with the newest weights)."""
    switch_jitter: float = 0.1
    """Log-space spread of measured switch times around the values above."""
    switch_prior_s: float | None = None
    """The policies' switch-cost estimate (both directions) before any switch is measured;
    None: the switch times above (a real driver starts from its configured prior)."""
    weight_sync_s: float | None = None
    """Time to publish new weights after a step; None: ``weight_gb / sync_gb_per_s``."""
    weight_gb: float = 15.0
    """Model weights to publish after each step (GB)."""
    sync_gb_per_s: float = 25.0
    """Weight-sync transport bandwidth (GB/s)."""
    kv_bytes_per_token: float = 57344.0
    """KV cache per context token (7B-class model with GQA: 28 layers x 2 x 4 heads x 128 x 2 B)."""
    link_gb_per_s: float = 25.0
    """KV migration link bandwidth (GB/s)."""
    migration_window_s: float = 8.0
    """A KV migration past this window re-prefills instead (RDMA_TRANSFER_FAILED)."""

    @property
    def publish_s(self) -> float:
        """Seconds to publish weights after a step."""
        if self.weight_sync_s is not None:
            return self.weight_sync_s
        return self.weight_gb / self.sync_gb_per_s if self.sync_gb_per_s > 0 else 0.0

    def __post_init__(self) -> None:
        if self.count < 1 or self.max_concurrent < 1:
            raise ValueError("cells.count and cells.max_concurrent must be >= 1")
        if min(self.prefill_tokens_per_s, self.decode_tokens_per_s, self.train_tokens_per_s) <= 0:
            raise ValueError("cell throughputs must be > 0")
        negative = [
            f"cells.{k} = {getattr(self, k)}"
            for k in ("batch_slowdown", "host_call_s")
            if getattr(self, k) < 0
        ]
        if negative:
            raise ValueError(f"must be >= 0: {', '.join(negative)}")


def _d(median: float, **kw) -> Dist:
    return Dist(median=median, **kw)


@dataclass(kw_only=True)
class WorkloadPhase:
    """A stretch of consecutive groups whose episodes are scaled from the base
    distributions: a curriculum over task tiers (short one-file tasks, then whole
    repositories), or episodes that lengthen as the policy learns to iterate."""

    groups: int
    """Groups in this phase (the phases repeat in order unless ``phases_cycle`` is off)."""
    turns_scale: float = 1.0
    """Multiplies each episode's drawn turn count (at least 1 turn)."""
    tool_scale: float = 1.0
    """Multiplies each tool call's drawn duration."""
    output_scale: float = 1.0
    """Multiplies each model call's drawn output tokens."""

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ValueError(f"a workload phase needs groups >= 1, got {self.groups}")
        if min(self.turns_scale, self.tool_scale, self.output_scale) <= 0:
            raise ValueError("workload phase scales must be > 0")


@dataclass(kw_only=True)
class WorkloadConfig:
    """Agent episodes: turns alternating a model call and a tool execution.

    ``source = "fitted"`` draws episodes from the distributions below; ``"trace"`` replays
    the episodes of a real run folder (``trace``) in their order, repeating them if the
    simulation needs more.
    """

    source: Literal["fitted", "trace"] = "fitted"
    trace: str | None = None
    """Run folder of ``gyre train`` (episodes.jsonl, store.db) for ``source = "trace"``."""
    group_size: int = 8
    """Episodes per GRPO group (a group trains once all of its episodes have finished)."""
    max_concurrent_episodes: int = 256
    """Agent slots (sandboxes): episodes running at once."""
    turns: Dist = field(default_factory=lambda: _d(20.0, sigma=0.5, min=1.0))
    first_prompt_tokens: Dist = field(default_factory=lambda: _d(2000.0))
    turn_prompt_tokens: Dist = field(default_factory=lambda: _d(300.0, sigma=0.8))
    """New prompt tokens per turn (the previous tool output)."""
    output_tokens: Dist = field(default_factory=lambda: _d(300.0, sigma=0.7, min=1.0))
    tool_s: Dist = field(default_factory=lambda: _d(2.0, sigma=1.0))
    setup_s: Dist = field(default_factory=lambda: _d(5.0))
    scoring_s: Dist = field(default_factory=lambda: _d(10.0))
    max_context_tokens: int = 131072
    """An episode ends when its context would pass this."""
    zero_variance_fraction: float = 0.0
    """Share of groups whose rewards are all equal: finished but not trained on (DAPO filter)."""
    group_turns_sigma: float = 0.0
    """A group's episodes are one task: log-space spread of a factor drawn once per group
    that scales all its episodes' turns (``turns`` is then the spread within a group)."""
    group_tool_sigma: float = 0.0
    """The same factor's spread for the group's tool times (one draw: a larger task has
    both more turns and longer tools)."""
    phases: list[WorkloadPhase] = field(default_factory=list)
    """Non-stationary load (fitted source): group ``g`` is drawn with the scales of the
    phase it falls in, the phases cycling in order; empty: every group alike."""
    phases_cycle: bool = True
    """False: the phases run once and the last one lasts for good (a load that changes
    one way, such as episodes that lengthen as the policy learns)."""

    def phase_of(self, group: int) -> WorkloadPhase | None:
        """The phase group ``group`` belongs to (None without phases)."""
        if not self.phases:
            return None
        total = sum(p.groups for p in self.phases)
        if not self.phases_cycle and group >= total:
            return self.phases[-1]
        g = group % total
        for phase in self.phases:
            if g < phase.groups:
                return phase
            g -= phase.groups
        raise AssertionError("unreachable")


@dataclass(kw_only=True)
class TrainingConfig:
    """The RL batch and off-policy limit."""

    groups_per_step: int = 16
    """Groups in one optimizer step."""
    steps_per_iteration: int = 1
    """Optimizer steps per rollout batch for the batch-synchronous policies."""
    groups_per_iteration: int | None = None
    """Rollout batch of the batch-synchronous policies (colocated, static split), split into
    ``steps_per_iteration`` steps; None: ``groups_per_step * steps_per_iteration``."""
    staleness_bound: int = 4
    """eta: rollouts may run at most this many versions ahead of the trainer; output tokens
    sampled more than this many versions behind the trainer when their step starts weigh
    nothing in its loss (the step still computes them, as the real trainer does)."""

    @property
    def batch_groups(self) -> int:
        return self.groups_per_iteration or self.groups_per_step * self.steps_per_iteration


@dataclass(kw_only=True)
class ColocatedParams:
    enabled: bool = True


@dataclass(kw_only=True)
class StaticSplitParams:
    enabled: bool = True
    rollout_cells: list[int] = field(default_factory=list)
    """k values to sweep; empty: an even grid of up to 8 values over 1..count-1."""


@dataclass(kw_only=True)
class AsyncParams:
    enabled: bool = True
    rollout_cells: list[int] = field(default_factory=list)
    """k values to sweep (as for the static split); the best is reported."""


@dataclass(kw_only=True)
class DynamicParams:
    enabled: bool = True
    queue_threshold: int = 8
    """Queued requests per rollout cell above which a training cell is moved to rollout."""
    switch_prior_s: float = 10.0
    """Switch cost assumed before any is measured."""
    initial_rollout_fraction: float = 0.75


@dataclass(kw_only=True)
class WaterlevelParams:
    enabled: bool = True
    min_rollout_cells: int = 1
    gain_margin: float = 1.0
    min_dwell_factor: float = 1.0
    max_batch_growth: float = 2.0
    hold_round_trips: float = 30.0
    spare_stale_steps: float = 1.0
    spare_stale_share: float = 0.5
    admit_ahead_batches: int = 0
    admit_ahead_room: float = 0.75
    admit_ahead_stale_share: float = 0.25

    def __post_init__(self) -> None:
        numbers = {k: v for k, v in vars(self).items() if k != "enabled"}
        negative = [k for k, v in numbers.items() if v < 0]
        if negative:
            raise ValueError(f"must be >= 0: {', '.join(f'{k} = {numbers[k]}' for k in negative)}")
        if self.max_batch_growth < 1:
            raise ValueError(f"max_batch_growth must be >= 1, got {self.max_batch_growth}")


@dataclass(kw_only=True)
class PoliciesConfig:
    colocated: ColocatedParams = field(default_factory=ColocatedParams)
    static_split: StaticSplitParams = field(default_factory=StaticSplitParams)
    async_staleness: AsyncParams = field(default_factory=AsyncParams)
    dynamic: DynamicParams = field(default_factory=DynamicParams)
    waterlevel: WaterlevelParams = field(default_factory=WaterlevelParams)


@dataclass(kw_only=True)
class SweepConfig:
    """Sweeps run every enabled policy at each value (k fixed at its best in the main run,
    scaled with the cluster); an empty list skips that sweep."""

    duration_s: float | None = None
    """Simulated time per sweep run; None: the main run's ``duration_s`` (a sweep shorter
    than a few episodes and steps mostly measures the warm-up)."""
    tool_tail_fraction: list[float] = field(default_factory=list)
    cells: list[int] = field(default_factory=list)
    switch_cost_scale: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"sweep.duration_s must be > 0 (or left out), got {self.duration_s}")


@dataclass(kw_only=True)
class SimConfig:
    """One simulation: a cluster, a workload and the policies to compare on them."""

    name: str = "simulation"
    seed: int = 0
    duration_s: float = 3600.0
    """Simulated time per policy run."""
    max_steps: int | None = None
    """Stop a run earlier, after this many optimizer steps."""
    max_groups: int | None = None
    """Stop a run earlier, once this many groups are trained on (or filtered out) and no
    step is running (a replay of a run's iterations ends there)."""
    decision_interval_s: float = 1.0
    """Policies decide after each phase event and at least this often."""
    resolution_s: float = 1.0
    """Longest round of episode events (:mod:`gyre_env.sim.rounds`): smaller is closer
    to an event-by-event run and slower; control events are always exact."""
    gantt_max_segments: int = 20000
    """Role segments kept for the Gantt chart (0: none)."""
    timeline_s: float = 3600.0
    """Width of the buckets over which each cell state's time, the trained tokens and the
    stale drops are also kept (the idle causes hour by hour); 0: no timeline."""
    cells: CellConfig = field(default_factory=CellConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ConfigError(f"duration_s must be > 0 simulated seconds, got {self.duration_s}")
        if not self.decision_interval_s > 0:
            raise ConfigError(f"decision_interval_s must be > 0, got {self.decision_interval_s}")
        for name in ("max_steps", "max_groups"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1 (or left out), got {value}")


def load_sim_config(path: str | Path) -> SimConfig:
    """A ``SimConfig`` from a TOML file; a relative ``workload.trace`` is resolved against
    the file's folder."""
    import tomllib

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"no config file at {path}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e
    cfg = from_dict(SimConfig, data)
    if not cfg.resolution_s > 0:
        raise ConfigError("resolution_s: must be > 0")
    if not cfg.timeline_s >= 0:
        raise ConfigError("timeline_s: must be >= 0 (0: no timeline)")
    if cfg.workload.trace and not Path(cfg.workload.trace).is_absolute():
        cfg.workload.trace = str((path.parent / cfg.workload.trace).resolve())
    if cfg.workload.source == "trace" and not cfg.workload.trace:
        raise ConfigError("workload.trace: needed when workload.source = 'trace'")
    return cfg
