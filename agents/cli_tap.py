"""The CLI tap: an existing agent CLI put to work inside the episode's sandbox.

The CLI runs in the sandbox's workspace as a background process group, with its base URL
pointed at the episode's proxy session through the sandbox's proxy-only route
(``ModelEndpoint.sandbox_base_url``), so every model call it makes is recorded like any
other. While it runs, the tap:

- watches the proxy's record tap: each finished model call is a model-turn boundary, where
  the interim reward of the workspace is computed (``interim_rewards``);
- marks the episode as waiting on the model while one of its calls is in flight (for the
  waterlevel), and afterwards corrects the split with the calls' exact durations;
- stops the CLI (TERM, then KILL to its process group) when the episode is cancelled or
  its time limit hits. The final score is computed by the runner once the tap returns.

``ClaudeCodeAgent`` runs ``claude -p ... --output-format json`` as documented in
``shared/reference/claude-code-wire.md`` (root needs ``IS_SANDBOX=1``). Where the sandbox
image has no Claude Code, ``claude_code_image()`` derives an image that bind-mounts the
host's installed package read-only (its ``bin/claude.exe`` is a self-contained binary that
needs only glibc), so nothing is downloaded into the sandbox.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from gyre_env.agents.base import AgentResult, AgentStop, EndReason
from gyre_env.agents.context import EpisodeContext

log = logging.getLogger(__name__)

STATE_DIR = "/tmp/gyre-cli"
"""Folder inside the sandbox (outside the graded workspace) for the prompt, output and pid."""
CLAUDE_MOUNT = "/opt/gyre-claude-code"
"""Where ``claude_code_image`` mounts the host's Claude Code package."""


@dataclass(kw_only=True)
class CliAgentConfig:
    """What to run and how to watch it."""

    command: str
    """Shell command run in the workspace. The prompt is in the file ``$GYRE_PROMPT_FILE``;
    ``$GYRE_BASE_URL`` (no ``/v1``), ``$OPENAI_BASE_URL`` (with ``/v1``),
    ``$ANTHROPIC_BASE_URL``, ``$OPENAI_API_KEY``, ``$ANTHROPIC_API_KEY`` and ``$GYRE_MODEL``
    point at the episode's proxy session; ``$GYRE_API`` is the endpoint's API (``openai`` or
    ``anthropic``)."""
    name: str = "cli"
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the CLI."""
    poll_s: float = 0.2
    """How often the tap checks the CLI and the proxy."""
    interim_rewards: bool = True
    """Compute the interim reward at each model-turn boundary."""
    stop_grace_s: float = 5.0
    """Seconds between TERM and KILL when the CLI must stop."""
    output_chars: int = 20000
    """CLI stdout/stderr kept in the result."""
    state_dir: str = STATE_DIR
    """Folder in the sandbox (outside the graded workspace, no spaces) for the prompt, output
    and pid."""


class CliAgent:
    """Runs ``config.command`` in the episode's sandbox (see the module docstring)."""

    api: str | None = None
    """The model API the CLI speaks (None: either; it gets both APIs' variables)."""

    def __init__(self, config: CliAgentConfig):
        if not config.command.strip():
            raise ValueError("CliAgentConfig.command is empty")
        self.config = config
        self.name = config.name

    # ------------------------------------------------------------------ run

    def run(self, ctx: EpisodeContext) -> AgentResult:
        if ctx.endpoint is None or not ctx.endpoint.sandbox_base_url:
            raise ValueError(f"{self.name}: needs a model endpoint reachable from the sandbox")
        sandbox = ctx.sandbox()
        self._start(ctx, sandbox)
        tap, session = ctx.endpoint.calls, ctx.endpoint.session
        seen, rc, stop = 0, None, None
        phase = _ModelPhase(ctx)
        try:
            while rc is None:
                try:
                    ctx.check_live()
                except AgentStop as e:
                    stop = e
                    break
                if tap is not None:
                    phase.update(tap.inflight(session))
                    n = tap.wait_for(session, seen, self.config.poll_s)
                    if n > seen and self.config.interim_rewards:
                        seen = n
                        ctx.interim_reward()
                    seen = n
                else:
                    time.sleep(self.config.poll_s)
                rc = self._exit_code(sandbox)
        finally:
            phase.update(0)
            if rc is None:
                self._kill(sandbox)
        calls = tap.calls(session) if tap is not None else []
        self._correct_model_time(ctx, calls)
        result = AgentResult(
            reason=stop.reason if stop else EndReason.CLI_EXITED,
            message=str(stop) if stop else f"exit code {rc}",
            model_calls=len(calls),
            tokens=sum(c["prompt_tokens"] + c["output_tokens"] for c in calls),
            extra=self._outputs(sandbox, rc),
        )
        return result

    def _env(self, ctx: EpisodeContext) -> dict[str, str]:
        ep, state = ctx.endpoint, self.config.state_dir
        base = ep.sandbox_base_url.rstrip("/")
        env = {
            "GYRE_API": ep.api,
            "GYRE_BASE_URL": base,
            "GYRE_MODEL": ep.model,
            "GYRE_PROMPT_FILE": f"{state}/prompt.md",
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_KEY": ep.api_key,
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": ep.api_key,
            "HOME": f"{state}/home",
        }
        env.update(self.config.env)
        return env

    def _start(self, ctx: EpisodeContext, sandbox) -> None:
        state = self.config.state_dir
        prompt = base64.b64encode(str(ctx.observation).encode()).decode()
        setup = f"mkdir -p {state}/home && echo {prompt} | base64 -d > {state}/prompt.md"
        # The inner bash leads its own session: its pid is the process group to kill.
        inner = f"echo $$ > {state}/pid\n{self.config.command}\necho $? > {state}/rc"
        launch = (
            f"{setup} || exit 1\nsetsid bash -c {shlex.quote(inner)} < /dev/null "
            f"> {state}/stdout 2> {state}/stderr &\n"
            f"for i in $(seq 100); do [ -s {state}/pid ] && exit 0; sleep 0.05; done; exit 1"
        )
        with ctx.clock.phase("tool"):
            # The CLI outlives this command (the sandbox kills what commands leave behind).
            res = sandbox.exec(launch, timeout=30, env=self._env(ctx), keep_background=True)
        if not res.ok:
            raise AgentStop(f"could not start the CLI: {res.output[-2000:]}", EndReason.AGENT_ERROR)
        ctx.clock.enter("tool")  # the CLI's own work counts as tool time until it ends

    def _exit_code(self, sandbox) -> int | None:
        state = self.config.state_dir
        res = sandbox.exec(f"cat {state}/rc 2>/dev/null || true", timeout=30)
        text = res.stdout.strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def _kill(self, sandbox) -> None:
        g, state = self.config.stop_grace_s, self.config.state_dir
        cmd = (
            f'p=$(cat {state}/pid 2>/dev/null); [ -n "$p" ] || exit 0; '
            f"kill -TERM -- -$p 2>/dev/null; for i in $(seq {int(g * 10)}); do "
            f"kill -0 -- -$p 2>/dev/null || exit 0; sleep 0.1; done; kill -KILL -- -$p 2>/dev/null; true"
        )
        try:
            sandbox.exec(cmd, timeout=g + 10)
        except Exception as e:  # the sandbox may be gone (hard time limit)
            log.warning("could not stop the CLI: %s", e)

    def _outputs(self, sandbox, rc: int | None) -> dict:
        n, state = self.config.output_chars, self.config.state_dir
        out = {"exit_code": rc}
        for name in ("stdout", "stderr"):
            try:
                res = sandbox.exec(f"tail -c {n} {state}/{name} 2>/dev/null", timeout=30)
                out[name] = res.stdout
            except Exception as e:  # the sandbox may be gone
                out[name] = f"(unreadable: {e})"
        return out

    # ------------------------------------------------------------------ time and rewards

    def _correct_model_time(self, ctx: EpisodeContext, calls: list[dict]) -> None:
        """Replace the polled model time with the calls' exact durations from the records."""
        ctx.clock.leave()  # leave the CLI's "tool" phase
        exact = sum(c["seconds"] for c in calls)
        polled = ctx.clock.totals["model"]
        if exact > polled:
            ctx.clock.reattribute("tool", "model", exact - polled)
        elif polled > exact:
            ctx.clock.reattribute("model", "tool", polled - exact)


class _ModelPhase:
    """Switches an episode's clock to ``model`` while one of its calls is in flight."""

    def __init__(self, ctx: EpisodeContext):
        self.ctx = ctx
        self.active = False

    def update(self, inflight: int) -> None:
        if inflight > 0 and not self.active:
            self.ctx.clock.enter("model")
            self.active = True
        elif inflight == 0 and self.active:
            self.ctx.clock.leave()
            self.active = False


# ---------------------------------------------------------------------------- Claude Code


def claude_code_command(max_turns: int | None = None, binary: str = "claude") -> str:
    """The headless Claude Code command line (JSON result on stdout)."""
    turns = f" --max-turns {int(max_turns)}" if max_turns else ""
    return (
        f'{binary} -p "$(cat "$GYRE_PROMPT_FILE")" --output-format json '
        f"--dangerously-skip-permissions{turns}"
    )


class ClaudeCodeAgent(CliAgent):
    """Claude Code in the sandbox, talking Anthropic's API to the episode's proxy session.

    ``binary``: the ``claude`` executable in the sandbox; ``max_turns``: its ``--max-turns``;
    ``max_output_tokens``: its per-reply limit (``CLAUDE_CODE_MAX_OUTPUT_TOKENS``; it asks
    for 32k by default, long for a small local model); ``env``: more variables; other
    keyword arguments are ``CliAgentConfig`` fields."""

    api = "anthropic"

    def __init__(
        self,
        *,
        binary: str = "claude",
        max_turns: int | None = None,
        max_output_tokens: int | None = None,
        env: dict[str, str] | None = None,
        **kwargs,
    ):
        wire = {
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "IS_SANDBOX": "1",  # root in the sandbox: allow --dangerously-skip-permissions
            "DISABLE_AUTOUPDATER": "1",
        }
        if max_output_tokens is not None:
            wire["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(int(max_output_tokens))
        wire.update(env or {})
        super().__init__(
            CliAgentConfig(
                command=claude_code_command(max_turns, binary),
                name="claude-code",
                env=wire,
                **kwargs,
            )
        )

    def _env(self, ctx: EpisodeContext) -> dict[str, str]:
        env = super()._env(ctx)
        env.setdefault("ANTHROPIC_MODEL", ctx.endpoint.model)
        return env

    def _outputs(self, sandbox, rc: int | None) -> dict:
        out = super()._outputs(sandbox, rc)
        try:
            out["result"] = json.loads(out.get("stdout") or "")
        except (json.JSONDecodeError, TypeError):
            pass
        return out


def npm_global_root() -> str:
    """Where ``npm install -g`` puts packages on the host (``npm root -g``)."""
    root = None
    npm = shutil.which("npm")
    if npm:
        root = subprocess.run(
            [npm, "root", "-g"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    return root or "/usr/lib/node_modules"


def host_claude_code_dir() -> str:
    """The host's installed ``@anthropic-ai/claude-code`` package folder."""
    path = os.path.join(npm_global_root(), "@anthropic-ai", "claude-code")
    if not os.path.isfile(os.path.join(path, "bin", "claude.exe")):
        raise FileNotFoundError(
            f"Claude Code is not installed on the host (looked for {path}/bin/claude.exe); "
            "install it with: npm install -g @anthropic-ai/claude-code"
        )
    return path


def claude_code_image(base: str = "gyre-base:latest", tag: str | None = None) -> str:
    """A Docker image that is ``base`` plus a read-only bind of the host's Claude Code at
    ``CLAUDE_MOUNT`` (see :func:`host_mount_image`); returns its tag. Run it as
    ``ClaudeCodeAgent(binary=f"{CLAUDE_MOUNT}/bin/claude.exe")``."""
    tag = tag or f"{base.split(':')[0]}-claude:latest"
    return host_mount_image(base, host_claude_code_dir(), CLAUDE_MOUNT, tag)


def host_mount_image(base: str, host_dir: str, mount: str, tag: str) -> str:
    """A Docker image that is ``base`` plus a read-only bind of the host folder
    ``host_dir`` at ``mount`` (via the ``gyre.host_mounts`` label DockerSandbox honours),
    so an agent CLI installed on the host runs in the sandbox without a download. Built
    locally from ``base`` (no network); returns ``tag``."""
    import io

    from gyre_env.sandbox.docker import MOUNTS_LABEL, docker_client

    client = docker_client()
    base_image = client.images.get(base)
    mounts = json.loads((base_image.labels or {}).get(MOUNTS_LABEL, "[]"))
    mounts = [m for m in mounts if m[1] != mount] + [[host_dir, mount]]
    dockerfile = f"FROM {base}\nLABEL {MOUNTS_LABEL}={json.dumps(json.dumps(mounts))}\n"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, pull=False)
    return tag
