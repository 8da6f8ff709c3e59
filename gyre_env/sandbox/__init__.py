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
    "ImageNotFoundError",
    "SandboxError",
    "SandboxPool",
    "choose_backend",
    "make_sandbox",
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
