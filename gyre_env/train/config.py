"""Typed configuration of a training run (``gyre train CONFIG.toml``).

A run is a ``TrainConfig``: nested dataclasses, one per component, every field
documented where it is defined. A TOML file fills them (tables named like the fields:
``[model]``, ``[rollout]``, ``[algorithm.loss]``...); unknown keys and wrong types are
rejected with the dotted key named, before any work starts: the component tables too
(``algorithm.loss`` is a ``LossConfig``, ``algorithm.optim`` the backend's trainer config,
``algorithm.sample`` a ``SampleConfig``), and ``tasks.env_kwargs`` is checked against the
env's options when the file is loaded. Presets are TOML files shipped in
``gyre_env/train/presets/`` (``gyre train --preset cpu-demo``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gyre_env.config import ConfigError, from_dict
from gyre_env.trajectory.sampling import SampleConfig

if TYPE_CHECKING:  # torch modules: imported when a config is read (``config_types``)
    from gyre_env.trainers.losses import LossConfig
    from gyre_env.trainers.megatron.trainer import MegatronTrainerConfig
    from gyre_env.trainers.torch_backend import TorchTrainerConfig

__all__ = [
    "ConfigError",
    "ElasticRunConfig",
    "TrainConfig",
    "apply_overrides",
    "as_table",
    "from_dict",
    "load_config",
]

PRESETS_DIR = Path(__file__).with_name("presets")


@dataclass(kw_only=True)
class ModelConfig:
    """The causal LM that is served and trained (one model for both)."""

    path: str | None = None
    """A local Hugging Face causal-LM folder; None builds the built-in tiny Qwen2 with the
    shape below (locally, deterministically, cached)."""
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    initializer_range: float = 0.02
    """Init std of the built-in model (the serving-only tiny model uses a peaked 0.3)."""
    seed: int | None = None
    """Seed of the built-in model's weights; None: the run's ``seed``, so that runs of
    different seeds start from different weights as well as sample differently."""
    context_length: int = 4096
    """Context window of the engine and the training units (prompt + output tokens)."""
    words: list[str] | str = field(default_factory=list)
    """Whole words the built-in model's tokenizer keeps as single tokens, each with an
    embedding of its own (BPE spells a word it never saw out of pieces other words share);
    ``"nano"``: every made-up word of the nano tasks' phrasings. A ``path`` folder brings its
    own tokenizer: these words do not change it."""

    def word_list(self) -> tuple[str, ...]:
        """``words`` resolved to the words themselves."""
        if self.words == "nano":
            from gyre_env.tasks.nano import made_up_words

            return made_up_words()
        if isinstance(self.words, str):
            raise ConfigError(f'model.words must be a list of words or "nano", got {self.words!r}')
        return tuple(self.words)


@dataclass(kw_only=True)
class TasksConfig:
    """Which tasks train and which evaluate."""

    env_id: str = "Gyre/NL2Repo-nano-v0"
    """The Gymnasium env the episodes run in."""
    suite: str = "nano"
    """Task suite: ``nano`` (generated, with train/heldout splits) or a suite name/folder."""
    train_count: int = 2000
    """Tasks in the training pool (nano: drawn from the train split)."""
    heldout_count: int = 48
    """Held-out tasks evaluated (nano: the heldout split, disjoint from training)."""
    seed: int = 0
    """Seed of the task generator (the split itself does not depend on it)."""
    suite_kwargs: dict = field(default_factory=dict)
    """Options of the suite loader, e.g. ``{names = "fixed"}`` for nano."""
    eval_suite_kwargs: dict = field(default_factory=dict)
    """Options of the suite loader for the evaluated tasks only, over ``suite_kwargs``:
    e.g. ``{only = "upper,reverse"}`` trains on more nano operations than it measures
    (the evaluated split stays disjoint from training whatever the operations)."""
    eval_split: str = "heldout"
    """What the evaluations measure: ``heldout``; or ``validation``, for choosing settings
    without looking at the held-out tasks: a validation set is cut out of the training
    pool and the rest trains (nano: the ``fit`` and ``validation`` splits,
    ``gyre_env.tasks.nano.TUNING_SPLITS``, ``train_count`` capped at the fit split's
    size; another suite: the ``heldout_count`` tasks after the held-out ones); the
    held-out tasks are then neither trained nor evaluated."""
    rl_includes_sft_tasks: bool = True
    """RL samples from the whole training pool, SFT's gold tasks included (their gold is
    never in the RL loop: RL sees only its own attempts and their rewards). False: RL
    samples only the tasks SFT did not see."""
    rl_no_gold_share: float | None = None
    """None: each RL iteration draws its tasks uniformly from RL's pool. A share in
    [0, 1]: that share of them comes from the pool's tasks that have no gold solution in
    any split (nano's coined phrasing: what a word means is shown only by the grade of an
    attempt, so only RL can learn it), the rest from the tasks that have one."""
    env_kwargs: dict = field(default_factory=lambda: {"reward_mode": "sparse"})
    """Extra ``gym.make`` options of every episode. GRPO uses only the final score, so the
    default skips the per-step shaping checks (a lint and visible-test run per step)."""


@dataclass(kw_only=True)
class SFTConfig:
    """Warm start: gold trajectories replayed through the proxy, then NLL on their
    assistant tokens."""

    trajectories: int = 64
    """Gold episodes recorded: this many training tasks with gold, drawn for the seed
    (0 skips SFT). Which tasks RL samples: ``tasks.rl_includes_sft_tasks``."""
    steps: int = 60
    """Optimizer steps over those trajectories."""
    batch_size: int = 16
    """Episodes per SFT step."""
    lr: float = 1e-3
    """SFT learning rate (RL uses ``algorithm.optim.lr``)."""
    lr_schedule: str = "constant"
    """``"constant"`` after the warm-up, or ``"cosine"``: down to ``lr_min`` along a cosine
    over the ``steps``."""
    lr_min: float = 0.0
    """Where the cosine schedule ends."""
    max_seconds: float | None = None
    """Stop SFT after this much training time even if steps remain (None: no limit). The
    learning benchmark's control continues SFT for as long as RL ran."""
    steps_per_iteration: int = 0
    """Gold SFT steps in every RL iteration, after its RL steps (InstructGPT's PPO-ptx,
    as steps of their own): RL keeps seeing the gold trajectories, so it does not unlearn
    what SFT taught while it reinforces its own successes. Same gold trajectories and
    ``batch_size`` as SFT, at RL's learning rate (``algorithm.optim.lr``); 0: off, and
    off without SFT (``trajectories`` or ``steps`` 0: no gold). The synchronous loop only
    (``gyre train --elastic`` says so and trains on rollouts alone)."""


def loss_class() -> type[LossConfig]:
    """``LossConfig`` (what ``algorithm.loss`` is read as), imported when needed."""
    from gyre_env.trainers.losses import LossConfig

    return LossConfig


def optim_class(backend: str) -> type[TorchTrainerConfig | MegatronTrainerConfig]:
    """The trainer config class of ``backend`` (what ``algorithm.optim`` is read as)."""
    if backend == "megatron":
        from gyre_env.trainers.megatron.trainer import MegatronTrainerConfig

        return MegatronTrainerConfig
    if backend == "torch":
        from gyre_env.trainers.torch_backend import TorchTrainerConfig

        return TorchTrainerConfig
    raise ConfigError(f"backend: {backend!r} is not available; use 'torch' or 'megatron'")


@dataclass(kw_only=True)
class SampleTable(SampleConfig):
    """``algorithm.sample``: a ``SampleConfig`` (``gyre_env.trajectory.sampling``, every
    field documented there) whose token budget may be left to the model's context."""

    token_budget: int | None = None
    """Most tokens one training unit may hold; None: ``model.context_length``."""

    def __post_init__(self) -> None:
        self.resolve(1)  # SampleConfig's checks, whatever the context length

    def resolve(self, context_length: int) -> SampleConfig:
        """The ``SampleConfig`` of a model with ``context_length`` tokens of context."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(SampleConfig)}
        if values["token_budget"] is None:
            values["token_budget"] = context_length
        return SampleConfig(**values)


@dataclass(kw_only=True)
class AlgorithmConfig:
    """The RL objective, how trees become samples, and the optimizer."""

    loss: LossConfig = field(default_factory=lambda: loss_class()())
    """The RL objective (``gyre_env.trainers.losses.LossConfig``): policy_loss, clip_low,
    clip_high, tis_cap, kl_coef, entropy_coef, aggregation, max_staleness. Its
    ``temperature`` is ``rollout.temperature`` (the table refuses it)."""
    sample: SampleTable = field(default_factory=SampleTable)
    """How trees become samples (``SampleTable``, a ``SampleConfig``): token_budget,
    role_weights, normalize_std, reward, negative_scale, max_paths_per_episode (J_max),
    overflow..."""
    skip_zero_variance: bool = True
    """Leave out of the optimizer steps the groups whose rewards are all equal (DAPO's
    dynamic-sampling filter): their GRPO advantages are all 0, so they carry no signal,
    cost a forward and backward, and dilute a token-level normaliser. Their share is
    logged as ``zero_variance_groups``, their count per iteration as ``groups_skipped``.
    Failed groups given an advantage (``sample.failed_group_advantage``) have signal and
    train."""
    optim: TorchTrainerConfig | MegatronTrainerConfig = field(
        default_factory=lambda: optim_class("torch")()
    )
    """The trainer's optimizer and device settings, of ``backend``'s class: a
    ``TorchTrainerConfig`` (``gyre_env.trainers.torch_backend``: lr, betas, weight_decay,
    grad_clip, warmup_steps, device, dtype, fsdp...) or, with ``backend = "megatron"``, a
    ``MegatronTrainerConfig`` (the same but fsdp, plus tensor_parallel, optimizer,
    distributed_optimizer, use_te)."""

    @classmethod
    def config_types(cls, data: dict) -> dict:
        """The trainer classes, imported when a table is read (they import torch)."""
        return {"loss": loss_class(), "optim": optim_class("torch")}


ROLLOUT_AGENTS = ("langgraph", "mini-swe-agent")
"""Agents that play training episodes (``rollout.agent``)."""
ROLLOUT_ENGINES = ("embedded", "sglang")
WEIGHT_SYNC_MODES = ("tensor", "distributed", "disk")


@dataclass(kw_only=True)
class SGLangRolloutConfig:
    """``[rollout.sglang]``: the SGLang servers that serve the rollouts when
    ``rollout.engine = "sglang"`` (one per cell with ``--elastic``). Give ``urls`` to
    attach to running servers, or ``launch = true`` to start ``python -m
    sglang.launch_server`` on this node (cell ``i`` on GPUs ``i*tp_size ..
    (i+1)*tp_size-1``, port ``port + i``)."""

    urls: list[str] = field(default_factory=list)
    """Running servers (``http://host:port``): the synchronous loop routes over all of
    them; ``--elastic --cells N`` takes one per cell (N of them)."""
    launch: bool = False
    """Start the servers here (needs ``pip install 'gyre-env[sglang]'`` and CUDA)."""
    launch_args: list[str] = field(default_factory=list)
    """Extra flags of a launched server, e.g. ``["--attention-backend", "fa3"]``."""
    port: int = 30000
    """Port of the first launched server (cell ``i``: ``port + i``)."""
    mem_fraction: float = 0.5
    """A launched server's ``--mem-fraction-static``: its share of the GPU's memory for
    weights and KV cache (the trainer uses the rest when they share the GPU)."""
    tp_size: int = 1
    """A launched server's ``--tp-size`` (GPUs per server); also the number of payloads
    a ``tensor`` weight push sends."""
    weight_sync: str = "tensor"
    """How each optimizer step's weights reach the servers: ``tensor`` (same host, CUDA IPC
    handles through ``/update_weights_from_tensor``), ``distributed`` (an NCCL group per
    server, ``/update_weights_from_distributed``) or ``disk`` (a safetensors folder per
    version under ``OUT/sglang-weights``, ``/update_weights_from_disk``; the servers must
    read that path)."""
    sync_backend: str = "nccl"
    """``distributed``: the group's backend (``gloo`` moves CPU tensors)."""
    master_address: str = "127.0.0.1"
    """``distributed``: where this process serves the groups' stores (server ``i`` joins
    port ``master_port + i``); must be reachable from the servers."""
    master_port: int = 29670
    sync_timeout_s: float = 600.0
    """Deadline of one server's weight update; past it the server is excluded from routing
    until a full resync succeeds."""
    launch_timeout_s: float = 900.0
    """How long a launched server may take to answer ``/health``."""
    api_key: str | None = None
    """Bearer token of servers started with ``--api-key``."""

    def __post_init__(self) -> None:
        if self.weight_sync not in WEIGHT_SYNC_MODES:
            raise ValueError(
                f"weight_sync must be one of {WEIGHT_SYNC_MODES}, got {self.weight_sync!r}"
            )
        if not 0 < self.mem_fraction < 1:
            raise ValueError(f"mem_fraction must be in (0, 1), got {self.mem_fraction}")
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.sync_backend not in ("nccl", "gloo"):
            raise ValueError(f"sync_backend must be 'nccl' or 'gloo', got {self.sync_backend!r}")
        for url in self.urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"urls: {url!r} is not an http(s):// URL")


@dataclass(kw_only=True)
class RolloutConfig:
    """How episodes are collected."""

    agent: str = "langgraph"
    """Who plays the episodes: ``langgraph`` (``gyre_env.agents.LangGraphAgent``) or
    ``mini-swe-agent`` (``gyre_env.agents.MiniSweAgent``; ``pip install
    'gyre-env[mini-swe-agent]'``). Both call the policy through the proxy, so their
    calls train alike."""
    engine: str = "embedded"
    """What serves the rollouts: ``embedded`` (transformers in this process: the CPU
    default, and the engine that exports KV for migration) or ``sglang`` (SGLang servers,
    ``[rollout.sglang]``: the GPU engine)."""
    sglang: SGLangRolloutConfig = field(default_factory=SGLangRolloutConfig)
    """The SGLang servers (``rollout.engine = "sglang"`` only)."""

    group_size: int = 8
    """G: attempts per task per iteration (one GRPO group)."""
    tasks_per_iteration: int = 8
    """Tasks sampled per iteration."""
    parallel: int = 8
    """Episodes running at once."""
    max_new_tokens: int = 128
    """Completion tokens per model call."""
    max_steps: int = 3
    """Tool calls an agent may make per episode."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (the loss uses the same)."""
    min_p: float = 0.0
    """Min-p filter of training rollouts: a token is sampled only if its probability (at
    ``temperature``) is at least ``min_p`` times the most likely token's; 0 disables it. It
    lets a high temperature explore among plausible tokens without sampling the tail.
    Behaviour logprobs stay those of the unfiltered tempered distribution, as with top-p.
    Held-out evaluation samples without it (at ``eval_temperature``)."""
    eval_temperature: float = 1.0
    """Sampling temperature of held-out evaluation (pass rate of the sampled policy)."""
    eval_attempts: int = 1
    """Attempts per held-out task in an evaluation (more: a less noisy pass rate)."""
    time_limit_s: float = 120.0
    """Wall-clock limit per episode."""


@dataclass(kw_only=True)
class ScheduleConfig:
    """The loop's length and rhythm."""

    iterations: int = 20
    """RL iterations (rollouts, then ``optimizer_steps`` steps, then a weight push)."""
    optimizer_steps: int = 2
    """K: optimizer steps per epoch; the iteration's groups are split into K minibatches
    (fewer when fewer groups carry signal), each packed on its own."""
    epochs: int = 1
    """Passes over the iteration's groups (PPO epochs; reshuffled each pass). Steps
    after the first see a moved policy: the PPO ratio and its clip keep them near the
    behaviour policy."""
    eval_every: int = 5
    """Held-out evaluation every this many iterations (and after the last)."""
    eval_random: bool = True
    """Evaluate the starting model on the held-out tasks before SFT (the ``random`` row;
    a random-init model scores 0, so a time-boxed run may skip it)."""
    checkpoint_every: int = 1
    """Checkpoint every this many iterations (and at the end, and on Ctrl-C)."""
    baselines: bool = True
    """After the last evaluation, grade the no-learning baselines on the evaluated tasks
    (generated nano tasks only; ``gyre_env.scoring.nano_baselines``): the report shows RL's
    result beside what a policy scores that never reads the operation."""
    rl_updates: bool = True
    """False: each iteration takes only its gold steps (``sft.steps_per_iteration``) and
    no rollouts or RL steps, the RL schedule with the RL loss switched off: the learning
    benchmark's control (b) (``benchmarks/train_cpu.py``)."""


@dataclass(kw_only=True)
class LoggingConfig:
    """Where metrics go (always ``metrics.jsonl`` under the run folder)."""

    tensorboard: bool = True
    """TensorBoard event files under ``<out>/tensorboard``."""
    wandb: bool = False
    """Also log to Weights & Biases (needs ``wandb`` installed)."""
    wandb_project: str = "gyre"
    progress: bool = True
    """Progress bars on stderr."""
    profile_switches: bool = False
    """``gyre train --elastic``: a PyTorch profiler trace of every role switch (and a CUDA
    memory snapshot where CUDA is present) under ``<out>/profiles``."""


@dataclass(kw_only=True)
class ElasticRunConfig:
    """``gyre train --elastic``: the RL phase on elastic cells that switch between rollout
    and training at runtime (``gyre_env.train.elastic``) instead of the synchronous loop.
    The flags ``--elastic``, ``--cells N`` and ``--ray ADDRESS`` override this table."""

    enabled: bool = False
    """Run the RL phase on elastic cells (``--elastic``); false: the synchronous loop."""
    cells: int = 2
    """Cells (each one engine and one trainer) of the elastic run (``--cells``)."""
    ray: str | None = None
    """The cells' trainers as Ray actors in one placement group (``--ray``): ``auto``
    joins the running cluster (else starts a local one), ``local``, or ``host:port``
    (needs ``pip install 'gyre-env[ray]'``); None: all in the ``gyre train`` process.
    Needs ``enabled``."""


@dataclass(kw_only=True)
class TrainConfig:
    """A whole training run."""

    name: str = "train"
    """Run name; the default output folder is ``runs/<name>``."""
    out: str | None = None
    """Where everything the run writes goes (default ``runs/<name>``)."""
    seed: int = 0
    """Seeds task sampling, rollout sampling and the trainer's RNG."""
    backend: str = "torch"
    """Training backend: ``torch`` or ``megatron`` (megatron-core, ``pip install
    'gyre-env[megatron]'``)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    elastic: ElasticRunConfig = field(default_factory=ElasticRunConfig)

    def __post_init__(self) -> None:
        # The loss's temperature is the rollouts' (``loss_config`` sets it; here too, so that
        # the run's config.json says what the loss uses).
        loss, temperature = self.algorithm.loss, self.rollout.temperature
        if temperature > 0 and loss.temperature != temperature:  # <= 0: validate says so
            loss = dataclasses.replace(loss, temperature=temperature)
            self.algorithm = dataclasses.replace(self.algorithm, loss=loss)
        # Another backend's optimizer options (``dataclasses.replace(cfg, backend=...)``):
        # read as this backend's, as ``--set backend=...`` reads them (``as_table``).
        want, optim = optim_class(self.backend), self.algorithm.optim
        if not isinstance(optim, want):
            optim = from_dict(want, _changed(optim), "algorithm.optim")
            self.algorithm = dataclasses.replace(self.algorithm, optim=optim)

    @classmethod
    def config_types(cls, data: dict) -> dict:
        """``algorithm.optim`` is read as ``backend``'s class; ``algorithm.loss`` may not
        set the temperature (``rollout.temperature`` does)."""
        algorithm = data.get("algorithm")
        loss = algorithm.get("loss") if isinstance(algorithm, dict) else None
        if isinstance(loss, dict) and "temperature" in loss:
            raise ConfigError(
                "algorithm.loss.temperature: set rollout.temperature (the loss uses it)"
            )
        return {"algorithm.optim": optim_class(data.get("backend", "torch"))}

    @property
    def out_dir(self) -> Path:
        return Path(self.out) if self.out else Path("runs") / self.name

    def loss_config(self) -> LossConfig:
        """``algorithm.loss`` at ``rollout.temperature``."""
        try:
            return dataclasses.replace(self.algorithm.loss, temperature=self.rollout.temperature)
        except ValueError as e:
            raise ConfigError(f"algorithm.loss: {e}") from None

    def gold_steps_per_iteration(self) -> int:
        """Gold SFT steps after each RL iteration's steps: ``sft.steps_per_iteration``
        when the run has SFT (gold to train on), else 0."""
        sft = self.sft
        return sft.steps_per_iteration if sft.trajectories and sft.steps else 0

    def sample_config(self) -> SampleConfig:
        """``algorithm.sample``, its token budget ``model.context_length`` unless set."""
        return self.algorithm.sample.resolve(self.model.context_length)

    def optim_config(self) -> TorchTrainerConfig | MegatronTrainerConfig:
        """``algorithm.optim``, checked to be ``backend``'s class."""
        want = optim_class(self.backend)
        if not isinstance(self.algorithm.optim, want):
            raise ConfigError(
                f"algorithm.optim: a {type(self.algorithm.optim).__name__}, but backend "
                f"{self.backend!r} trains with a {want.__name__}"
            )
        return dataclasses.replace(self.algorithm.optim)

    def _check_rollout_engine(self) -> None:
        """``rollout.engine`` and its ``[rollout.sglang]`` table, without I/O (the servers
        themselves are checked by ``train.engines.preflight`` before any work)."""
        r = self.rollout
        if r.engine not in ROLLOUT_ENGINES:
            raise ConfigError(f"rollout.engine must be one of {ROLLOUT_ENGINES}, got {r.engine!r}")
        s = r.sglang
        if r.engine != "sglang":
            if s != SGLangRolloutConfig():
                raise ConfigError(
                    "rollout.sglang is set but rollout.engine is "
                    f"{r.engine!r}: set rollout.engine = 'sglang' to use it"
                )
            return
        if bool(s.urls) == s.launch:
            raise ConfigError(
                "rollout.sglang: give urls (attach to running servers) or launch = true "
                "(start them here), one of the two"
                + (f"; got urls {s.urls} and launch = true" if s.launch else "")
            )
        if self.elastic.enabled and s.urls and len(s.urls) != self.elastic.cells:
            raise ConfigError(
                f"rollout.sglang.urls: {len(s.urls)} servers for {self.elastic.cells} elastic "
                "cells; give one server per cell"
            )
        if self.elastic.enabled and self.elastic.ray is not None:
            raise ConfigError(
                "rollout.engine = 'sglang' with elastic.ray (--ray): SGLang cells run with "
                "their trainers in the gyre train process for now; leave out --ray"
            )

    def _check_env_kwargs(self) -> None:
        """``tasks.env_kwargs`` checked against the NL2Repo env's options (a custom env,
        registered with another entry point, checks its own when it is made)."""
        env = self._env_config()
        if env is None:
            return
        from gyre_env.sandbox import SandboxConfig, SandboxError, choose_backend
        from gyre_env.sandbox.bwrap import require_bwrap

        # the sandboxes' options, read by the env only when it starts one
        for key, options in (("sandbox", env.sandbox), ("grading.sandbox", env.grading.sandbox)):
            try:
                SandboxConfig.from_dict(options)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"tasks.env_kwargs.{key}: {e}") from None
        try:
            for backend in {env.sandbox_backend, env.grading.backend}:
                # auto resolves at run time, to what is there
                if backend != "auto" and choose_backend(backend) == "bwrap":
                    require_bwrap()
        except (ValueError, SandboxError) as e:
            raise ConfigError(f"tasks.env_kwargs: {e}") from None

    def check_sandboxes(self) -> None:
        """Before any work (``gyre train``, ``--elastic``): the sandbox backends the
        episodes and their grading will use are there, and none of them is the ``local``
        backend, which isolates nothing, unless the config names it.

        A Docker backend needs a daemon that answers (without one every episode would be
        an ``infra_error`` and SFT would blame the tasks' gold); ``auto`` resolves here as
        the env will resolve it, and resolving to ``local`` (no daemon, no bubblewrap) is
        refused: a policy trained against an unisolated workspace can reach the host.
        ``sandbox_backend = "local"`` (or ``GYRE_SANDBOX=local``) asks for it by name."""
        env = self._env_config()
        if env is None:
            return
        from gyre_env.sandbox import SandboxError, require_isolation

        try:
            require_isolation(
                {f"tasks.env_kwargs.{k}": v for k, v in env.backends().items()},
                command="gyre train",
                by_name_hint="--set tasks.env_kwargs.sandbox_backend='local'",
            )
        except SandboxError as e:
            raise ConfigError(str(e)) from None

    def _check_agent_tools(self) -> None:
        """mini-swe-agent acts only through a ``bash`` tool: refuse an env that has none
        (``tasks.env_kwargs.tools``, else the env id's registered default)."""
        if self.rollout.agent != "mini-swe-agent":
            return
        import gymnasium as gym

        import gyre_env  # noqa: F401  (registers the Gyre env ids)

        spec = gym.registry.get(self.tasks.env_id)
        tools = {**(spec.kwargs if spec else {}), **self.tasks.env_kwargs}.get("tools")
        if tools is not None and "bash" not in tools:
            raise ConfigError(
                f"rollout.agent = 'mini-swe-agent' acts through the env's bash tool; "
                f"{self.tasks.env_id} offers {list(tools)}: add 'bash' to tasks.env_kwargs.tools"
            )

    def _env_config(self):
        """``tasks.env_kwargs`` as the NL2Repo env reads them (``NL2RepoConfig``), None for
        an env registered with another entry point."""
        import gymnasium as gym

        import gyre_env  # noqa: F401  (registers the Gyre env ids)
        from gyre_env.envs.nl2repo.registration import ENTRY_POINT

        spec = gym.registry.get(self.tasks.env_id)
        if spec is None or spec.entry_point != ENTRY_POINT:
            return None
        from gyre_env.envs.nl2repo.env import NL2RepoConfig

        try:
            return NL2RepoConfig.from_kwargs(**self.tasks.env_kwargs)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"tasks.env_kwargs: {e}") from None

    def _check_words(self) -> None:
        from gyre_env.engines.tiny import check_words

        words = self.model.word_list()
        try:
            check_words(words)
        except ValueError as e:
            raise ConfigError(f"model.{e}") from None

    def validate(self) -> None:
        """Checks that need no I/O: ranges and the nested component configs."""
        optim_class(self.backend)  # a backend that is not one: refused by name
        if self.backend == "megatron" and importlib.util.find_spec("megatron") is None:
            raise ConfigError("backend 'megatron' needs: pip install 'gyre-env[megatron]'")
        positive = {
            "rollout.group_size": self.rollout.group_size,
            "rollout.tasks_per_iteration": self.rollout.tasks_per_iteration,
            "rollout.parallel": self.rollout.parallel,
            "rollout.max_new_tokens": self.rollout.max_new_tokens,
            "rollout.max_steps": self.rollout.max_steps,
            "rollout.eval_attempts": self.rollout.eval_attempts,
            "schedule.optimizer_steps": self.schedule.optimizer_steps,
            "schedule.epochs": self.schedule.epochs,
            "schedule.eval_every": self.schedule.eval_every,
            "schedule.checkpoint_every": self.schedule.checkpoint_every,
            "tasks.train_count": self.tasks.train_count,
            "tasks.heldout_count": self.tasks.heldout_count,
            "sft.batch_size": self.sft.batch_size,
            "model.context_length": self.model.context_length,
            "elastic.cells": self.elastic.cells,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")
        for key, value in {
            "schedule.iterations": self.schedule.iterations,
            "sft.trajectories": self.sft.trajectories,
            "sft.steps": self.sft.steps,
            "sft.steps_per_iteration": self.sft.steps_per_iteration,
        }.items():
            if value < 0:
                raise ConfigError(f"{key} must be >= 0, got {value}")
        self._check_words()
        if self.sft.lr_schedule not in ("constant", "cosine"):
            raise ConfigError(
                f'sft.lr_schedule must be "constant" or "cosine", got {self.sft.lr_schedule!r}'
            )
        if not 0 <= self.sft.lr_min <= self.sft.lr:
            raise ConfigError(
                f"sft.lr_min must be in [0, sft.lr = {self.sft.lr}], got {self.sft.lr_min}"
            )
        share = self.tasks.rl_no_gold_share
        if share is not None and not 0 <= share <= 1:
            raise ConfigError(f"tasks.rl_no_gold_share must be in [0, 1], got {share}")
        if self.rollout.temperature <= 0:
            raise ConfigError(f"rollout.temperature must be > 0, got {self.rollout.temperature}")
        if not 0 <= self.rollout.min_p < 1:
            raise ConfigError(
                f"rollout.min_p must be in [0, 1) (0 disables it), got {self.rollout.min_p}"
            )
        if self.rollout.agent not in ROLLOUT_AGENTS:
            raise ConfigError(
                f"rollout.agent must be one of {', '.join(ROLLOUT_AGENTS)}, "
                f"got {self.rollout.agent!r}"
            )
        if self.elastic.ray is not None and not self.elastic.enabled:
            raise ConfigError(
                f"elastic.ray = {self.elastic.ray!r} needs elastic.enabled = true "
                "(--ray needs --elastic)"
            )
        self._check_rollout_engine()
        self._check_env_kwargs()
        self._check_agent_tools()
        if self.rollout.group_size < 2 and self.schedule.iterations:
            raise ConfigError("rollout.group_size must be >= 2: GRPO compares attempts")
        if not self.schedule.rl_updates and self.elastic.enabled:
            raise ConfigError(
                "schedule.rl_updates = false is the synchronous loop's gold-steps-only "
                "control; the elastic driver trains on rollouts alone (drop --elastic)"
            )
        if not self.schedule.rl_updates and not self.gold_steps_per_iteration():
            raise ConfigError(
                "schedule.rl_updates = false leaves each iteration only its gold steps, and "
                "this run has none (set sft.steps_per_iteration, sft.trajectories, sft.steps)"
            )
        self.loss_config()
        self.sample_config()
        self.optim_config()


# ---- loading ----------------------------------------------------------------------------
def load_config(
    path: str | Path | None = None, *, preset: str | None = None, overrides: list[str] = ()
) -> TrainConfig:
    """A ``TrainConfig`` from a TOML file or a named preset, with ``overrides`` (as in
    ``apply_overrides``) applied before it is validated: an override can mend what the
    file alone would be refused for (a sandbox backend this machine lacks). The file's
    keys and types are checked as it is read, every table's (``algorithm.optim``'s
    against its ``backend``'s class)."""
    import tomllib

    if (path is None) == (preset is None):
        raise ConfigError("give a config file or --preset NAME (one of them)")
    if preset is not None:
        path = PRESETS_DIR / f"{preset}.toml"
        if not path.is_file():
            known = sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))
            raise ConfigError(f"no preset {preset!r}; known presets: {known}")
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no config file at {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    try:
        cfg = from_dict(TrainConfig, data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    if overrides:
        return apply_overrides(cfg, list(overrides))
    try:
        cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    return cfg


def apply_overrides(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """``key.sub=value`` overrides (the value parsed as a TOML value, else a string), on
    ``cfg`` as a table (``as_table``) read back as a new ``TrainConfig``."""
    import tomllib

    data = as_table(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
        key, raw = item.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"override {key!r}: {part!r} is not a table")
            node = node[part]
        node[parts[-1]] = value
    cfg = from_dict(TrainConfig, data)
    cfg.validate()
    return cfg


def as_table(cfg: TrainConfig) -> dict:
    """``cfg`` as the table ``from_dict`` reads back into an equal ``TrainConfig``:
    ``dataclasses.asdict``, less ``algorithm.loss.temperature`` (``rollout.temperature``'s),
    and with ``algorithm.optim`` holding only what differs from its class's defaults, so
    that a ``backend`` override reads it as the other backend's class (the options both
    have carry over; one the other lacks is refused by name)."""
    data = dataclasses.asdict(cfg)
    data["algorithm"]["loss"].pop("temperature", None)
    data["algorithm"]["optim"] = _changed(cfg.algorithm.optim)
    return data


def _changed(config) -> dict:
    """The fields of dataclass ``config`` that differ from its class's defaults."""
    values, defaults = dataclasses.asdict(config), dataclasses.asdict(type(config)())
    return {k: v for k, v in values.items() if v != defaults[k]}
