"""OpenAI's Codex CLI (npm ``@openai/codex``) as a CLI-tap agent.

``codex exec`` runs headless in the episode's sandbox and speaks the Responses API
(``POST /v1/responses``, streamed) to the episode's proxy session through the sandbox's
proxy route: a model provider ``gyre`` whose ``base_url`` is ``$OPENAI_BASE_URL`` and
whose key is ``$OPENAI_API_KEY`` is set with ``-c`` overrides, so no config file or login
is needed. Its own sandbox and approvals are off (``--dangerously-bypass-approvals-and-
sandbox``): the Gyre sandbox is the boundary. Sessions are not written to disk
(``--ephemeral``); the JSONL event log (``--json``) is the CLI's stdout.

The npm package is a launcher; the CLI itself is a static (musl) binary in the platform
package, which needs nothing from the image. ``codex_image()`` derives an image that
bind-mounts the host's binary folder read-only at ``CODEX_MOUNT``, so nothing is
downloaded into the sandbox.
"""

from __future__ import annotations

import json
import os
import platform
import shlex

from gyre_env.agents.base import AgentStop, EndReason
from gyre_env.agents.cli_tap import (
    CliAgent,
    CliAgentConfig,
    host_mount_image,
    npm_global_root,
)
from gyre_env.agents.context import EpisodeContext

CODEX_VERSION = "0.171.0"
"""The Codex CLI release Gyre is tested with (``.ci/setup`` installs it)."""
CODEX_INSTALL = f"npm install -g @openai/codex@{CODEX_VERSION}"
CODEX_MOUNT = "/opt/gyre-codex"
"""Where ``codex_image`` mounts the host's Codex binary folder (``bin/codex`` inside)."""
_TRIPLES = {"x86_64": "x86_64-unknown-linux-musl", "aarch64": "aarch64-unknown-linux-musl"}


def codex_command(binary: str = "codex") -> str:
    """The headless ``codex exec`` command line (JSONL events on stdout; the prompt is read
    from ``$GYRE_PROMPT_FILE`` on stdin, whatever its length or first character)."""
    provider = (
        'model_providers.gyre={name="gyre", base_url="$OPENAI_BASE_URL", '
        'env_key="OPENAI_API_KEY", wire_api="responses"}'
    ).replace('"', '\\"')
    helpers = ""
    if binary.startswith("/"):  # the binary's helper tools (rg) sit beside its bin/
        helpers = f'export PATH="$PATH:{os.path.dirname(os.path.dirname(binary))}/codex-path"; '
    return (
        f'{helpers}mkdir -p "$CODEX_HOME" && {shlex.quote(binary)} exec --json --ephemeral '
        "--skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "
        f'-m "$GYRE_MODEL" -c model_provider=gyre -c "{provider}" '
        '-c "model_context_window=$GYRE_CONTEXT_LENGTH" '
        '-o "$GYRE_STATE_DIR/last_message" - < "$GYRE_PROMPT_FILE"'
    )


class CodexAgent(CliAgent):
    """Codex CLI in the sandbox, talking the Responses API to the episode's proxy session.

    ``binary``: the ``codex`` executable in the sandbox (``f"{CODEX_MOUNT}/bin/codex"``
    with :func:`codex_image`); ``env``: more variables; other keyword arguments are
    ``CliAgentConfig`` fields."""

    api = "openai"

    def __init__(self, *, binary: str = "codex", env: dict[str, str] | None = None, **kwargs):
        self.binary = binary
        wire = {"NO_COLOR": "1", "RUST_LOG": "error"}
        wire.update(env or {})
        super().__init__(
            CliAgentConfig(command=codex_command(binary), name="codex", env=wire, **kwargs)
        )

    def _env(self, ctx: EpisodeContext) -> dict[str, str]:
        env = super()._env(ctx)
        state = self.config.state_dir
        env.setdefault("CODEX_HOME", f"{state}/home/.codex")
        env["GYRE_STATE_DIR"] = state
        env["GYRE_CONTEXT_LENGTH"] = str(int(ctx.endpoint.context_length))
        return env

    def _start(self, ctx: EpisodeContext, sandbox) -> None:
        found = sandbox.exec(f"command -v {shlex.quote(self.binary)}", timeout=30)
        if not found.ok:
            raise AgentStop(
                f"codex: no {self.binary!r} in the sandbox image. Install the Codex CLI on "
                f"the host with: {CODEX_INSTALL}; then run tasks in codex_image(<image>) "
                f"with CodexAgent(binary='{CODEX_MOUNT}/bin/codex')",
                EndReason.AGENT_ERROR,
            )
        super()._start(ctx, sandbox)

    def _outputs(self, sandbox, rc: int | None) -> dict:
        out = super()._outputs(sandbox, rc)
        events = []
        for line in (out.get("stdout") or "").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by the output limit
        out["events"] = events
        try:
            res = sandbox.exec(f"cat {self.config.state_dir}/last_message", timeout=30)
            out["last_message"] = res.stdout if res.ok else None
        except Exception:  # the sandbox may be gone
            out["last_message"] = None
        return out


def host_codex_dir() -> str:
    """The host's Codex binary folder (``bin/codex`` inside) of the installed npm package."""
    triple = _TRIPLES.get(platform.machine())
    package = os.path.join(npm_global_root(), "@openai", "codex")
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), "?")
    candidates = [
        os.path.join(
            package, "node_modules", "@openai", f"codex-linux-{arch}", "vendor", str(triple)
        ),
        os.path.join(package, "vendor", str(triple)),  # older releases: one package
    ]
    for path in candidates:
        if triple and os.path.isfile(os.path.join(path, "bin", "codex")):
            return path
    raise FileNotFoundError(
        f"the Codex CLI is not installed on the host (looked for bin/codex under {package}); "
        f"install it with: {CODEX_INSTALL}"
    )


def codex_image(base: str = "gyre-base:latest", tag: str | None = None) -> str:
    """A Docker image that is ``base`` plus a read-only bind of the host's Codex binary
    folder at ``CODEX_MOUNT``; returns its tag. Run it as
    ``CodexAgent(binary=f"{CODEX_MOUNT}/bin/codex")``."""
    tag = tag or f"{base.split(':')[0]}-codex:latest"
    return host_mount_image(base, host_codex_dir(), CODEX_MOUNT, tag)
