"""mini-swe-agent (PyPI ``mini-swe-agent``) playing a Gyre episode.

mini-swe-agent's own loop (``DefaultAgent``: query → execute → observe, ending with its
``Submitted`` / ``LimitsExceeded`` exceptions) runs unchanged, with Gyre on both sides:

- its **model** is its ``LitellmModel`` pointed at the episode's proxy session
  (``openai/<model>`` at ``ModelEndpoint.base_url``), so every call is recorded as TITO
  records like any other agent's; :class:`ProxyModel` times the calls as ``model`` and
  maps endpoint failures to Gyre's typed stops;
- its **environment** is :class:`SandboxEnvironment`, which implements mini-swe-agent's
  ``Environment`` protocol over the env's ``bash`` tool: each command is one ``env.step``
  in the episode's sandbox (rewarded, traced and output-limited like any tool call).
  The command ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (mini-swe-agent's way to
  finish) becomes the env's ``submit``, which grades the work.

What is not covered: mini-swe-agent's other environments (its Docker, Singularity, ...)
and its interactive agents; its cost tracking (a local policy has no price: costs are 0
and ``cost_limit`` is off). Installed with ``pip install 'gyre-env[mini-swe-agent]'``.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre_env.agents.base import AgentResult, AgentStop, EndReason, ModelFailure, episode_seed
from gyre_env.agents.context import SUBMIT, EpisodeContext

from gyre_env._optional import require

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The first output line with which a mini-swe-agent command says the work is done."""

SYSTEM_TEMPLATE = (
    "You are a software engineer working alone in a Linux sandbox with no network. You act "
    "only through the `bash` tool: every reply must call it. Each command runs in a fresh "
    "shell in the workspace (`cd` and variables do not persist; chain them with `&&`)."
)
INSTANCE_TEMPLATE = """{{task}}

Work in the current directory: write the files the task asks for (for example with
`cat <<'EOF' > file.py`), run them and their tests, and fix what fails.
When the work is complete, run exactly `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
on its own; after it you cannot act any more.

<system_information>{{system}} {{release}} {{machine}}</system_information>"""

_EXIT_CODE = re.compile(r"\[exit code (-?\d+)\]\s*\Z")
_EXIT_REASONS = {
    "Submitted": EndReason.SUBMITTED,
    "LimitsExceeded": EndReason.STEP_BUDGET,
    "TimeExceeded": EndReason.TIME_LIMIT,
    "RepeatedFormatError": EndReason.NO_TOOL_CALL,
    "EnvEnded": EndReason.ENV_ENDED,
}
"""mini-swe-agent's ``exit_status`` values (and ours, ``EnvEnded``) as Gyre end reasons."""


@dataclass(kw_only=True)
class MiniSweAgentConfig:
    """Budgets and knobs of mini-swe-agent in Gyre."""

    max_steps: int = 60
    """Model calls per episode (mini-swe-agent's ``step_limit``; each reply runs a command)."""
    max_new_tokens: int = 512
    """Completion tokens per model call."""
    temperature: float = 1.0
    min_p: float = 0.0
    """Min-p filter (SGLang's and vLLM's ``min_p``, sent as an extra body field); 0: none,
    and the field is not sent."""
    seed: int | None = None
    """Sampling seed: an episode's calls use this plus a stable hash of its episode id; None
    samples with fresh randomness."""
    max_format_errors: int = 3
    """Replies in a row without a valid ``bash`` call before the episode ends
    (``no_tool_call``); mini-swe-agent's ``max_consecutive_format_errors``."""
    command_timeout_s: int | None = None
    """Seconds per command (the env caps it); None: the env's own limit."""
    request_timeout_s: float = 300.0
    model_retries: int = 2
    """Retries of a failed HTTP call (done by the OpenAI client under litellm)."""
    config_file: str | None = None
    """A mini-swe-agent YAML config (as its ``mini.yaml``): its ``agent`` section (templates,
    limits) and ``model`` section (observation and format-error templates) are used; its
    model name, API keys and ``environment`` section are not (the model is the episode's
    proxy session, the environment its sandbox). None: Gyre's templates above."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_new_tokens", "request_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MiniSweAgentConfig.{name} must be > 0")
        if self.max_format_errors < 1:
            raise ValueError("MiniSweAgentConfig.max_format_errors must be >= 1")
        if self.model_retries < 0:
            raise ValueError("MiniSweAgentConfig.model_retries must be >= 0")
        if not 0 <= self.min_p < 1:
            raise ValueError("MiniSweAgentConfig.min_p must be in [0, 1) (0 disables it)")
        if self.config_file is not None and not Path(self.config_file).is_file():
            raise ValueError(f"MiniSweAgentConfig.config_file: no such file {self.config_file}")


def import_minisweagent():
    """Import mini-swe-agent (and litellm) quietly: no start-up banner, and litellm's model
    price map read from its package instead of fetched over the network."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    require("litellm", "mini-swe-agent")
    require("minisweagent.models.litellm_model", "mini-swe-agent")
    return require("minisweagent.agents.default", "mini-swe-agent")


class MiniSweAgent:
    """mini-swe-agent's ``DefaultAgent`` per episode (see the module docstring)."""

    name = "mini-swe-agent"
    api = "openai"
    """It calls the model through litellm's OpenAI provider."""

    def __init__(self, config: MiniSweAgentConfig | None = None):
        self.config = config or MiniSweAgentConfig()
        import_minisweagent()  # fail here, not in every episode, when it is not installed
        self.agent_settings, self.model_settings = _settings(self.config)

    def run(self, ctx: EpisodeContext) -> AgentResult:
        ctx.model_endpoint(self.api, "mini-swe-agent")
        if "bash" not in {t.get("function", t).get("name") for t in ctx.tools}:
            raise ValueError("mini-swe-agent needs the env's `bash` tool; this env offers none")
        from minisweagent.agents.default import DefaultAgent

        model = ProxyModel(ctx, self.config, self.model_settings)
        env = SandboxEnvironment(ctx, timeout=self.config.command_timeout_s)
        agent = DefaultAgent(model, env, **self.agent_settings)
        try:
            exit_info = agent.run(task=str(ctx.observation))
        except AgentStop as stop:
            return AgentResult(
                reason=stop.reason,
                message=str(stop),
                model_calls=model.calls,
                tokens=model.tokens,
            )
        status = str(exit_info.get("exit_status", ""))
        return AgentResult(
            reason=_EXIT_REASONS.get(status, EndReason.AGENT_ERROR),
            message=status,
            model_calls=model.calls,
            tokens=model.tokens,
            extra={"exit_status": status, "submission": exit_info.get("submission", "")},
        )


def _settings(cfg: MiniSweAgentConfig) -> tuple[dict, dict]:
    """(``DefaultAgent`` keyword arguments, ``LitellmModel`` template settings)."""
    agent: dict[str, Any] = {
        "system_template": SYSTEM_TEMPLATE,
        "instance_template": INSTANCE_TEMPLATE,
    }
    model: dict[str, Any] = {}
    if cfg.config_file is not None:
        import yaml

        data = yaml.safe_load(Path(cfg.config_file).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{cfg.config_file}: expected a mapping with an 'agent' section")
        agent.update(data.get("agent") or {})
        for key in ("observation_template", "format_error_template"):
            if key in (data.get("model") or {}):
                model[key] = data["model"][key]
    agent.update(
        step_limit=cfg.max_steps,
        cost_limit=0,  # a local policy has no price
        max_consecutive_format_errors=cfg.max_format_errors,
        output_path=None,
    )
    agent.pop("mode", None)  # the interactive agent's setting; DefaultAgent has none
    return agent, model


class ProxyModel:
    """mini-swe-agent's ``Model`` protocol: its ``LitellmModel`` at the episode's proxy
    session, each call timed as ``model`` and its failures turned into Gyre stops."""

    def __init__(self, ctx: EpisodeContext, cfg: MiniSweAgentConfig, settings: dict):
        from minisweagent.models.litellm_model import LitellmModel

        ep = ctx.endpoint
        kwargs: dict[str, Any] = {
            "api_base": ep.base_url,
            "api_key": ep.api_key,
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_new_tokens,
            "timeout": cfg.request_timeout_s,
            "max_retries": cfg.model_retries,
        }
        if cfg.seed is not None:
            kwargs["seed"] = episode_seed(cfg.seed, ctx.episode_id)
        if cfg.min_p:
            kwargs["extra_body"] = {"min_p": cfg.min_p}
        self.inner = LitellmModel(
            model_name=f"openai/{ep.model}",
            model_kwargs=kwargs,
            cost_tracking="ignore_errors",
            **settings,
        )
        # Retries are the OpenAI client's (``max_retries``); mini-swe-agent's own retry
        # loop (10 attempts, >= 4 s apart) would hide a dead endpoint for minutes.
        self.inner.abort_exceptions = [Exception]
        self.ctx = ctx
        self.config = self.inner.config
        self.calls = 0
        self.tokens = 0

    def query(self, messages: list[dict], **kwargs) -> dict:
        import openai
        from minisweagent.exceptions import FormatError

        self.ctx.check_live()
        try:
            with self.ctx.clock.phase("model"):
                message = self.inner.query(messages, **kwargs)
        except FormatError as e:  # the call happened; its reply had no valid bash call
            self._count(e.messages[0].get("extra", {}).get("response"))
            raise
        except openai.BadRequestError as e:
            text = str(e).lower()
            if "context" in text or "too long" in text:
                raise AgentStop(f"context full: {e}", EndReason.CONTEXT_FULL) from e
            raise ModelFailure(f"the model endpoint rejected the request: {e}") from e
        except openai.APIError as e:  # litellm's errors subclass the OpenAI SDK's
            raise ModelFailure(f"model call failed: {type(e).__name__}: {e}") from e
        self._count(message.get("extra", {}).get("response"))
        return message

    def _count(self, response: Any) -> None:
        self.calls += 1
        usage = response.get("usage") if isinstance(response, dict) else None
        if isinstance(usage, dict):
            self.tokens += int(usage.get("total_tokens") or 0)

    def format_message(self, **kwargs) -> dict:
        return self.inner.format_message(**kwargs)

    def format_observation_messages(
        self, message: dict, outputs: list[dict], template_vars: dict | None = None
    ) -> list[dict]:
        return self.inner.format_observation_messages(message, outputs, template_vars)

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return self.inner.get_template_vars(**kwargs)

    def serialize(self) -> dict:
        return self.inner.serialize()


@dataclass(kw_only=True)
class SandboxEnvironmentConfig:
    """What ``serialize`` reports of :class:`SandboxEnvironment`."""

    timeout: int | None = None
    tool: str = "bash"


class SandboxEnvironment:
    """mini-swe-agent's ``Environment`` protocol over the episode's env: ``execute`` is one
    ``bash`` step in the sandbox through ``EpisodeContext.step``."""

    def __init__(self, ctx: EpisodeContext, timeout: int | None = None):
        self.ctx = ctx
        self.config = SandboxEnvironmentConfig(timeout=timeout)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        from minisweagent.exceptions import InterruptAgentFlow, Submitted

        command = action.get("command", "") if isinstance(action, dict) else str(action)
        if cwd:
            from gyre_env.sandbox.shell import shell_quote

            command = f"cd {shell_quote(cwd)} && {command}"
        args: dict[str, Any] = {"command": command}
        limit = timeout or self.config.timeout
        if limit:
            args["timeout"] = int(limit)
        obs, _, _, _, _ = self.ctx.step({"name": "bash", "arguments": args})
        output, code = split_exit_code(str(obs))
        result = {"output": output, "returncode": code, "exception_info": ""}
        lines = output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and code == 0:
            if not self.ctx.done:
                self.ctx.step(SUBMIT)
            submission = "".join(lines[1:])
            raise Submitted(_exit("Submitted", submission))
        if self.ctx.done:  # the env ended the episode (its step or time limit)
            raise InterruptAgentFlow(_exit("EnvEnded", ""))
        return result

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        # The sandbox (Docker, bubblewrap or local) shares this host's kernel and CPU.
        uname = platform.uname()
        return {
            "system": uname.system,
            "release": uname.release,
            "version": uname.version,
            "machine": uname.machine,
            **kwargs,
        }

    def serialize(self) -> dict:
        return {
            "info": {
                "config": {
                    "environment": {"timeout": self.config.timeout, "tool": self.config.tool},
                    "environment_type": f"{__name__}.{type(self).__name__}",
                }
            }
        }


def split_exit_code(text: str) -> tuple[str, int]:
    """The env's ``bash`` observation (output, then ``[exit code N]``) as (output, N); -1
    where it carries no exit code (a refused call)."""
    m = _EXIT_CODE.search(text)
    if m is None:
        return text, -1
    return text[: m.start()], int(m.group(1))


def _exit(status: str, submission: str) -> dict:
    return {
        "role": "exit",
        "content": submission or status,
        "extra": {"exit_status": status, "submission": submission},
    }
