"""Sandboxes: where agent-written code runs. See ``base.py`` for what each backend covers.

``make_sandbox(config, backend="auto")`` picks Docker if a daemon answers, else
bubblewrap, else the local backend (which isolates nothing and says so). The choice can
be forced with ``backend=`` or the ``GYRE_SANDBOX`` environment variable.
"""

from __future__ import annotations

import logging
import os

from gyre_env.sandbox.base import (
    ExecResult,
    ImageNotFoundError,
    PathOutsideWorkspaceError,
    Sandbox,
    SandboxClosedError,
    SandboxConfig,
    SandboxEndedByCommand,
    SandboxError,
)
from gyre_env.sandbox.pool import SandboxPool

log = logging.getLogger(__name__)

BACKENDS = ("docker", "bwrap", "local")

__all__ = [
    "BACKENDS",
    "ExecResult",
    "PathOutsideWorkspaceError",
    "Sandbox",
    "SandboxClosedError",
    "SandboxConfig",
    "SandboxEndedByCommand",
    "ImageNotFoundError",
    "SandboxError",
    "SandboxPool",
    "choose_backend",
    "make_sandbox",
    "require_isolation",
]


def choose_backend(backend: str | None = "auto") -> str:
    """Resolve ``auto`` (or ``$GYRE_SANDBOX``) to a concrete backend name."""
    backend = backend or "auto"
    if backend == "auto":
        backend = os.environ.get("GYRE_SANDBOX", "auto")
    if backend == "auto":
        from gyre_env.sandbox.bwrap import bwrap_available
        from gyre_env.sandbox.docker import daemon_available

        try:
            if daemon_available():
                return "docker"
        except ImportError:
            pass
        if bwrap_available():
            return "bwrap"
        log.warning("no Docker daemon and no bubblewrap: falling back to the local sandbox")
        return "local"
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS} or 'auto'")
    return backend


def make_sandbox(config: SandboxConfig | None = None, backend: str | None = "auto") -> Sandbox:
    """Start a sandbox with the chosen backend."""
    name = choose_backend(backend)
    if name == "docker":
        from gyre_env.sandbox.docker import DockerSandbox

        return DockerSandbox(config)
    if name == "bwrap":
        from gyre_env.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(config)
    from gyre_env.sandbox.local import LocalSandbox

    return LocalSandbox(config)


def require_isolation(wanted: dict[str, str], *, command: str, by_name_hint: str) -> None:
    """Before a run's first episode: every backend in ``wanted`` (``{setting: backend}``)
    resolves as the env will resolve it, a Docker one has a daemon that answers, and none
    resolves to ``local`` (which isolates nothing) unless it is asked for by name (the
    setting says ``local``, or ``GYRE_SANDBOX=local``). ``SandboxError`` names the setting
    and the fix; ``by_name_hint`` says how ``command`` asks for ``local`` by name."""
    from gyre_env.sandbox.docker import require_docker

    for key, backend in wanted.items():
        try:
            name = choose_backend(backend)
            if name == "docker":
                require_docker()
        except (ValueError, SandboxError) as e:
            raise SandboxError(f"{key}: {e}") from None
        by_name = backend == "local" or os.environ.get("GYRE_SANDBOX") == "local"
        if name == "local" and not by_name:
            raise SandboxError(
                f"{key} = {backend!r} resolved to the 'local' sandbox (no Docker daemon "
                "answers and bubblewrap is not installed), which isolates nothing: "
                f"{command} refuses to run an agent's code against the host. Start Docker "
                "(`sudo systemctl start docker`) or install bubblewrap (`apt install "
                "bubblewrap`); or, knowing the agent's code runs on this machine "
                f"unconfined, ask for it by name: {by_name_hint}"
            )
