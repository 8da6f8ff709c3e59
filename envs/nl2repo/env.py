"""``Gyre/NL2Repo-v0``: build a repository from a natural-language spec, with tool calls.

How a runner drives it::

    env = gym.make("Gyre/NL2Repo-v0")                   # after `import gyre_env`
    obs, info = env.reset(seed=0, options={"task_id": "micro-lru-cache"})
    # obs: the prompt (instructions + spec); info["tools"]: the tools' JSON schemas
    while True:
        action = {"name": "write_file", "arguments": '{"path": "lru.py", "content": "..."}'}
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break                                        # info["outcome"], info["grading"]
    env.close()

Each episode gets its own sandbox, started at ``reset`` with an empty workspace (plus
``SPEC.md`` and the task's visible tests) and closed when the episode ends; the hidden
tests never enter it. ``submit``, or the step/wall-clock limit, grades a copy of the
workspace in a fresh evaluator sandbox (``gyre_env.scoring.final``).

``info`` keys: ``tools`` (reset only), ``task`` (id, tier, domain, title, limits...),
``step``, ``tool`` / ``tool_ok`` / ``error`` (what the last call did), ``reward``
(``mode``, ``value``, ``potential`` breakdown, ``final_score``), ``outcome`` (None while
running; then one of ``gyre_env.scoring.OUTCOMES``), ``reward_valid`` (False only for
``infra_error``), ``grading`` (a digest of the hidden-test run, at the end). Timings are
kept out of ``info`` so equal seeds and actions give equal infos; the full grading run
with timings and logs is ``env.unwrapped.last_grading``, and the seconds the last step
spent scoring are ``env.unwrapped.last_scoring_s``.

An agent that works inside the sandbox with its own process (a CLI agent) uses two more
methods: ``sandbox_handle()`` (the episode's sandbox) and ``interim_reward()`` (score the
workspace now and pay the change, at the agent's model-turn boundaries). ``task_spec()``
is the episode's full ``Task`` (gold and hidden-test paths included) for host-side tooling
such as the gold agent; it is never shown to the model.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gyre_env.envs.nl2repo import tools as T

from gyre_env.scoring import (
    REWARD_MODES,
    GradingConfig,
    GradingResult,
    PotentialConfig,
    PotentialScorer,
    RewardTracker,
    grade_sandbox,
    run_visible_tests,
)
from gyre_env.spaces import ToolCallSpace, UnicodeText, action_shape_error
from gyre_env.tasks import TIERS, Task, load_suite, load_task_folder
from gyre_env.tasks.task import TaskSetupError

log = logging.getLogger(__name__)


class EnvInfraError(RuntimeError):
    """The env could not set up an episode for reasons outside the agent (no sandbox, a
    failing setup command). Raised from ``reset``; a runner should retry or skip."""


@dataclass(kw_only=True)
class NL2RepoConfig:
    """Everything an ``NL2RepoEnv`` can be configured with (``gym.make`` kwargs)."""

    suite: str = "builtin"
    """A registered suite name (``builtin``, ``nl2repo``, ``nano``, ``harbor``, ``swe``) or
    a folder of task folders (Gyre, Harbor, terminal-bench or SWE-style)."""
    suite_kwargs: dict = field(default_factory=dict)
    """Passed to ``load_suite``, e.g. ``{"checkout": ..., "tests": ...}`` for ``nl2repo``."""
    task_path: str | None = None
    """A task folder, or a folder of task folders; overrides ``suite``."""
    tier: str | None = None
    """Only tasks of this tier (``micro``, ``small``, ``repo``)."""
    task_ids: list[str] | None = None
    """Only these task ids."""
    reward_mode: str = "potential"
    """``potential`` (return == final score), ``interim`` or ``sparse``; see scoring.rewards."""
    sandbox_backend: str = "auto"
    """``auto``, ``docker``, ``bwrap`` or ``local`` (agent and evaluator sandboxes)."""
    sandbox: dict = field(default_factory=dict)
    """``SandboxConfig`` fields for the agent's sandbox (``image`` comes from the task)."""
    warm_pool: int = 0
    """Started sandboxes kept ready per image (shared by the envs of a process), so a
    reset does not pay a container start; 0 starts each episode's sandbox on reset."""
    max_steps: int | None = None
    """Step limit; default: the task's ``max_steps``."""
    wall_clock_s: float | None = None
    """Wall-clock limit per episode; default: the task's ``wall_clock_s``."""
    bash_timeout_s: float = 120.0
    """Longest a single ``bash`` call may run."""
    max_output_chars: int = T.DEFAULT_MAX_OUTPUT_CHARS
    """The one limit on a step's observation: one longer than this many characters keeps
    its head and tail around a marker stating how many characters were omitted and this
    limit (``tools.clip``). The tools' descriptions state it; the sandbox's byte cap is
    raised to hold it; the observation space is sized from it."""
    tools: list[str] | None = None
    """Only these tools (names from ``tools.TOOLS``), e.g. ``["write_file", "submit"]``;
    None offers all. ``info["tools"]`` carries only these; others are refused like
    unknown tools."""
    write_spec: bool = True
    """Also put the spec in the workspace as ``SPEC.md`` (CLI agents read files)."""
    success_threshold: float = 1.0
    """A submission scoring at least this is a ``success``."""
    potential: PotentialConfig = field(default_factory=PotentialConfig)
    grading: GradingConfig = field(default_factory=GradingConfig)

    def __post_init__(self) -> None:
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode {self.reward_mode!r} is not one of {REWARD_MODES}")
        if self.tier is not None and self.tier not in TIERS:
            raise ValueError(f"tier {self.tier!r} is not one of {TIERS}")
        T.select_tools(self.tools)  # unknown names fail here, naming the known ones
        if self.max_output_chars < T.MIN_OUTPUT_CHARS:
            raise ValueError(
                f"max_output_chars must be >= {T.MIN_OUTPUT_CHARS}, got {self.max_output_chars}"
            )
        cap = self.sandbox.get("output_limit")
        if cap is not None and cap < T.sandbox_output_limit(self.max_output_chars):
            raise ValueError(
                f"sandbox output_limit {cap} bytes cannot hold max_output_chars="
                f"{self.max_output_chars} at both ends of a stream; leave it unset or make "
                f"it >= {T.sandbox_output_limit(self.max_output_chars)}"
            )
        if isinstance(self.potential, dict):
            self.potential = _nested(
                PotentialConfig, self.potential, "NL2RepoEnv potential options"
            )
        if isinstance(self.grading, dict):
            self.grading = _nested(GradingConfig, self.grading, "NL2RepoEnv grading options")

    def backends(self) -> dict[str, str]:
        """``{setting: backend}`` of the agent's sandbox and of grading's evaluator (whose
        ``auto`` follows the agent's): what a run checks before its first episode."""
        grading = self.grading.backend
        return {
            "sandbox_backend": self.sandbox_backend,
            "grading.backend": self.sandbox_backend if grading == "auto" else grading,
        }

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> NL2RepoConfig:
        return _nested(cls, kwargs, "NL2RepoEnv options")


def _nested(cls, values: dict, what: str):
    """``cls(**values)``, refusing unknown keys by name (a typo must not pass silently)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"unknown {what} {unknown}; known: {sorted(known)}")
    return cls(**values)


def load_tasks(config: NL2RepoConfig, tasks: list[Task] | None = None) -> list[Task]:
    """The env's tasks: ``tasks`` or those ``config`` names, filtered by tier and ids."""
    if tasks is None:
        if config.task_path is not None:
            tasks = load_task_folder(config.task_path)
        else:
            tasks = load_suite(config.suite, **config.suite_kwargs)
    chosen = [t for t in tasks if config.tier is None or t.tier == config.tier]
    if config.task_ids is not None:
        missing = sorted(set(config.task_ids) - {t.id for t in chosen})
        if missing:
            raise ValueError(f"task ids {missing} are not in the selected tasks")
        chosen = [t for t in chosen if t.id in set(config.task_ids)]
    if not chosen:
        raise ValueError(f"no tasks left after filtering (tier={config.tier!r})")
    return sorted(chosen, key=lambda t: t.id)


class NL2RepoEnv(gym.Env):
    """Tool-call env over a suite of repository-building tasks (see the module docstring)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        config: NL2RepoConfig | None = None,
        *,
        tasks: list[Task] | None = None,
        render_mode: str | None = None,
        **options: Any,
    ):
        if config is not None and options:
            raise TypeError("pass either config= or keyword options, not both")
        self.config = config or NL2RepoConfig.from_kwargs(**options)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'ansi' or None")
        self.render_mode = render_mode
        self.tasks = load_tasks(self.config, tasks)
        offered = T.select_tools(self.config.tools)
        self.tool_schemas = [{k: v for k, v in t.items() if k != "examples"} for t in offered]
        self.action_space = ToolCallSpace(offered)
        # A step's observation is cut to max_output_chars; a reset's is the task's prompt,
        # never cut. The space holds the longest of either, so it rejects no observation.
        longest_prompt = max(len(self._prompt(t, *self._limits(t))) for t in self.tasks)
        self.observation_space = UnicodeText(max(self.config.max_output_chars, longest_prompt))
        self.sandbox = None
        self.task: Task | None = None
        self.last_grading: GradingResult | None = None
        self.last_scoring_s = 0.0
        """Seconds the last ``step`` (or ``interim_reward``) spent scoring: the interim
        scorer, and the grading run when the step ended the episode."""
        self._last_obs = ""
        self._done = True
        self._closed = False

    # -- tasks -------------------------------------------------------------------------

    def _pick(self, options: dict) -> Task:
        unknown = sorted(set(options) - {"task_id", "tier"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; known: ['task_id', 'tier']")
        pool = self.tasks
        if options.get("tier") is not None:
            pool = [t for t in pool if t.tier == options["tier"]]
        if options.get("task_id") is not None:
            pool = [t for t in pool if t.id == options["task_id"]]
        if not pool:
            raise ValueError(f"no task matches reset options {options}")
        return pool[int(self.np_random.integers(len(pool)))]

    # -- episode -----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self._closed:
            raise RuntimeError("this env is closed")
        self._release()
        self._done = True  # until the new sandbox is up: a failed reset leaves no episode
        task = self._pick(dict(options or {}))
        self.task, self.last_grading = task, None
        self.sandbox = self._start(task)
        self.steps = 0
        self.max_steps, self.wall_clock_s = self._limits(task)
        self.rewards = RewardTracker(self.config.reward_mode)
        self.scorer = None
        if self.config.reward_mode != "sparse":
            self.scorer = PotentialScorer.for_sandbox(
                self.sandbox, task, self.config.potential, self.config.grading.pytest_plugins
            )
        self._potential = None
        self._done = False
        self._started = time.monotonic()
        self._last_obs = self._prompt(task, self.max_steps, self.wall_clock_s)
        info = self._info(tool=None, ok=True, error=None, reward=0.0, outcome=None)
        info["tools"] = copy.deepcopy(self.tool_schemas)
        return self._last_obs, info

    def _start(self, task: Task):
        from gyre_env.sandbox import ImageNotFoundError, SandboxConfig, make_sandbox
        from gyre_env.sandbox.pool import shared_pool

        config = SandboxConfig.from_dict(
            {
                "output_limit": T.sandbox_output_limit(self.config.max_output_chars),
                **self.config.sandbox,
                "image": task.image,
            }
        )
        try:
            if self.config.warm_pool > 0:
                pool = shared_pool(config, self.config.sandbox_backend, self.config.warm_pool)
                sandbox = pool.acquire()
            else:
                sandbox = make_sandbox(config, self.config.sandbox_backend)
        except ImageNotFoundError as e:
            raise EnvInfraError(self._missing_image(task, e)) from e
        except Exception as e:
            raise EnvInfraError(f"could not start a sandbox for {task.id!r}: {e}") from e
        try:
            task.prepare_workspace(sandbox, spec=self.config.write_spec)
        except TaskSetupError as e:
            sandbox.close()
            raise EnvInfraError(str(e)) from e
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def _missing_image(self, task: Task, error) -> str:
        """The error for a task image that was never built, with the command that builds it."""
        from gyre_env.sandbox.images import DEFAULT_TAG
        from gyre_env.sandbox.task_images import build_command

        if task.image == DEFAULT_TAG:
            command = "gyre images build"
        elif self.config.task_path is not None:
            command = build_command(self.config.task_path, {}, task.id)
        else:
            command = build_command(self.config.suite, self.config.suite_kwargs, task.id)
        return f"image {error.image!r} of task {task.id!r} not found; build it with `{command}`"

    def _limits(self, task: Task) -> tuple[int, float]:
        """An episode's step and wall-clock limits: the config's, else the task's."""
        return (
            self.config.max_steps or task.max_steps,
            self.config.wall_clock_s or task.wall_clock_s,
        )

    def _prompt(self, task: Task, max_steps: int, wall_clock_s: float) -> str:
        names = ", ".join(t["name"] for t in self.tool_schemas)
        if task.tier == "nano":  # every prompt token costs a tiny model's trainer time
            return f"Use the tools ({names}) to do this, then submit.\n\n{task.spec}"
        visible = ""
        if task.has_visible_tests:
            runs = "; `run_tests` runs them" if "run_tests" in self.action_space.tool_names else ""
            visible = f"Some tests are provided in the workspace{runs}. "
        return (
            # No absolute path here: it differs between sandboxes, the prompt must not.
            "You are in an empty workspace (commands and file paths start there). Implement "
            "the specification below as files in this workspace. Hidden tests will grade your "
            f"work when you call `submit` (or when the limits run out: {max_steps} "
            f"steps, {wall_clock_s:.0f} seconds). {visible}Tools: {names}. There is "
            "no network access.\n\n# Specification\n\n" + task.spec
        )

    def step(self, action: Any):
        """Run one tool call. Whatever the agent ran, this returns (an exception here is
        only for misuse: a closed env, a finished episode, an action of the wrong shape):
        a sandbox that fails or cannot recover, or a crash while scoring, ends the episode
        with ``outcome="infra_error"`` and the reason in ``info["error"]``; a command that
        ends its own sandbox ends it as ``agent_error``, scored 0."""
        if self._closed:
            raise RuntimeError("this env is closed")
        if self._done:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        shape_error = action_shape_error(action)
        if shape_error is not None:
            raise TypeError(
                f"invalid action: {shape_error}. Expected "
                '{"name": str, "arguments": JSON str or dict}'
            )
        self.steps += 1
        self.last_scoring_s = 0.0
        args, error = self.action_space.validate_call(action)
        name = action["name"]
        from gyre_env.sandbox import SandboxEndedByCommand, SandboxError

        try:
            if error is not None:
                out = T.ToolOutput(f"Error: {error}", ok=False)
            elif name == "submit":
                return self._finish(submitted=True, tool=name)
            elif name == "run_tests":
                out = self._run_tests()
            else:
                out = T.HANDLERS[name](self.sandbox, args, self)
            if self._over_limits():
                return self._finish(submitted=False, tool=name, tool_output=out)
            phi = None
            if self.scorer is not None and (name in T.MUTATING_TOOLS or self._potential is None):
                self._potential = self._score(visible=out.visible)
                phi = self._potential.phi
            reward = self.rewards.step(phi)
        except SandboxEndedByCommand as e:  # e.g. its container's main process killed
            return self._agent_ended_sandbox(str(e), tool=name)
        except SandboxError as e:
            return self._infra_failure(f"the agent's sandbox failed: {e}", tool=name)
        except Exception as e:  # a step returns an outcome; a crash of ours is infra's
            log.exception("step %d of %s crashed", self.steps, self.task.id)
            return self._infra_failure(
                f"the env crashed running {name!r}: {type(e).__name__}: {e}", tool=name
            )
        self._last_obs = self._observe(out.text, out.omitted)
        info = self._info(
            tool=name,
            ok=out.ok,
            error=None if out.ok else self._last_obs,
            reward=reward,
            outcome=None,
        )
        return self._last_obs, reward, False, False, info

    def _score(self, **kwargs):
        start = time.monotonic()
        try:
            return self.scorer.update(**kwargs)
        finally:
            self.last_scoring_s += time.monotonic() - start

    # -- the agent API beyond step: the task, and for an agent acting inside the sandbox -

    def task_spec(self) -> Task:
        """The ``Task`` of the current (or last) episode, with its gold and hidden-test
        paths: for host-side tooling (the gold agent), not for the model."""
        if self.task is None:
            raise RuntimeError("no episode has started: call reset() first")
        return self.task

    def sandbox_handle(self):
        """The running episode's sandbox, for an agent that runs its own process in it;
        its tool calls bypass ``step``, so it reports model turns with ``interim_reward``."""
        if self._done or self.sandbox is None:
            raise RuntimeError("no episode is running: call reset() first")
        return self.sandbox

    def interim_reward(self) -> tuple[float, dict]:
        """Score the workspace as it is now and pay the step reward for it (the change in
        potential in ``potential`` mode, so the return still sums to the final score): what
        an agent acting outside ``step`` calls at a model-turn boundary. Returns
        ``(reward, info)`` with ``info["reward"]`` shaped like a step's; ``(0.0, {})`` with
        sparse rewards."""
        if self._done:
            raise RuntimeError("no episode is running: call reset() first")
        self.last_scoring_s = 0.0
        if self.scorer is None:
            return 0.0, {}
        potential = self._score()
        reward = self.rewards.step(potential.phi)
        return reward, {"reward": {"potential": potential.as_dict(), "value": reward}}

    def _run_tests(self) -> T.ToolOutput:
        if not self.task.has_visible_tests:
            return T.ToolOutput("Error: this task has no visible tests.", ok=False)
        run = run_visible_tests(
            self.sandbox,
            self.task,
            self.config.potential.tests_timeout_s,
            plugins=self.config.grading.pytest_plugins,
        )
        return T.ToolOutput(run.render(), ok=not run.problems, visible=run)

    # -- limits ------------------------------------------------------------------------

    @property
    def bash_timeout_s(self) -> float:
        return self.config.bash_timeout_s

    def _observe(self, text: str, omitted: int = 0) -> str:
        """A step's observation: ``text`` cut to ``max_output_chars``, the one place a tool's
        output is cut (``omitted``: characters the sandbox already dropped from it)."""
        return T.clip(text, self.config.max_output_chars, omitted)

    def time_left_s(self) -> float:
        return self.wall_clock_s - (time.monotonic() - self._started)

    def _over_limits(self) -> bool:
        return self.steps >= self.max_steps or self.time_left_s() <= 0

    # -- the end of an episode ---------------------------------------------------------

    def _finish(self, *, submitted: bool, tool: str, tool_output=None):
        start = time.monotonic()
        grading = grade_sandbox(self.task, self.sandbox, self._grading_config())
        self.last_scoring_s += time.monotonic() - start
        self.last_grading = grading
        self._release()
        self._done = True
        if grading.status == "infra_error":
            return self._infra_failure(grading.reason, tool=tool, grading=grading)
        if not submitted:
            outcome = "timeout"
        elif grading.status == "workspace_error":
            outcome = "agent_error"
        else:
            outcome = "success" if grading.score >= self.config.success_threshold else "failure"
        reward = self.rewards.final(grading.score)
        text = (tool_output.text + "\n\n") if tool_output is not None else ""
        omitted = tool_output.omitted if tool_output is not None else 0
        why = "Submitted." if submitted else "Limit reached: the episode was cut and graded."
        text += (
            f"{why} Hidden tests: {grading.passed} of {grading.declared} passed; "
            f"score {grading.score:.4f}."
        )
        if grading.status == "workspace_error":
            text += f" The workspace broke the grading run: {grading.reason}"
        self._last_obs = self._observe(text, omitted)
        info = self._info(
            tool=tool, ok=True, error=None, reward=reward, outcome=outcome, grading=grading
        )
        return self._last_obs, reward, submitted, not submitted, info

    def _agent_ended_sandbox(self, reason: str, *, tool: str):
        """The agent's own command ended its sandbox: the episode ends, scored 0 as an
        ``agent_error``. Never ``infra_error``, which would leave it out of training and so
        make breaking the sandbox an escape from a low score."""
        log.info("agent_error in %s: %s", self.task.id, reason)
        grading = GradingResult(
            status="workspace_error",
            score=0.0,
            declared=self.task.test_count,
            reason=f"the agent's command ended its sandbox: {reason}",
        )
        self.last_grading = grading
        reward = self.rewards.final(0.0)
        self._release()
        self._done = True
        self._last_obs = self._observe(
            f"The episode ended: your command ended the sandbox itself ({reason}). Score 0."
        )
        info = self._info(
            tool=tool, ok=False, error=reason, reward=reward, outcome="agent_error", grading=grading
        )
        return self._last_obs, reward, True, False, info

    def _infra_failure(self, reason: str, *, tool: str, grading=None):
        log.warning("infra_error in %s: %s", self.task.id if self.task else "?", reason)
        self._release()
        self._done = True
        self._last_obs = self._observe(
            f"The episode stopped because of an infrastructure failure: {reason}"
        )
        info = self._info(
            tool=tool, ok=False, error=reason, reward=0.0, outcome="infra_error", grading=grading
        )
        info["reward_valid"] = False
        return self._last_obs, 0.0, False, True, info

    def _grading_config(self) -> GradingConfig:
        cfg = self.config.grading
        if cfg.backend == "auto" and self.config.sandbox_backend != "auto":
            cfg = dataclasses.replace(cfg, backend=self.config.sandbox_backend)
        return cfg

    def _info(self, *, tool, ok, error, reward, outcome, grading=None) -> dict:
        t = self.task
        potential = self._potential.as_dict() if getattr(self, "_potential", None) else None
        info = {
            "task": {
                "id": t.id,
                "tier": t.tier,
                "domain": t.domain,
                "title": t.title,
                "test_count": t.test_count,
                "has_visible_tests": t.has_visible_tests,
                "max_steps": self.max_steps,
                "wall_clock_s": self.wall_clock_s,
                "image": t.image,
                "source": t.source,
            },
            "step": self.steps,
            "tool": tool,
            "tool_ok": ok,
            "error": error,
            "reward": {
                "mode": self.config.reward_mode,
                "value": reward,
                "potential": potential,
                "final_score": grading.score if grading is not None and grading.valid else None,
                "return": self.rewards.paid,
            },
            "outcome": outcome,
            "reward_valid": True,
        }
        if grading is not None:
            info["grading"] = grading.summary()
        return info

    # -- rendering and cleanup ---------------------------------------------------------

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_obs
        return None

    def _release(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            try:
                sandbox.close()
            except Exception as e:
                log.warning("closing sandbox %s failed: %s", getattr(sandbox, "id", "?"), e)

    def close(self) -> None:
        """Free the sandbox; idempotent."""
        self._release()
        self._done = True
        self._closed = True
