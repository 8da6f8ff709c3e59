"""LocalSandbox: a bash subprocess in a temporary folder. For development only.

It isolates NOTHING: the agent's commands run as your user, see your files, your network
and your processes. After each command only its process group is killed: a process that
leaves it (``setsid``) keeps running. It exists so that Gyre runs where neither Docker nor bubblewrap is
available; every start logs a loud warning.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid

from gyre_env.sandbox.base import SandboxConfig
from gyre_env.sandbox.files import ShellSandbox
from gyre_env.sandbox.shell import PersistentShell

log = logging.getLogger(__name__)

WARNING = (
    "LocalSandbox isolates NOTHING: agent commands run on this host as this user, with "
    "its files and network. Use Docker or bubblewrap for anything but development."
)


class LocalSandbox(ShellSandbox):
    """Runs commands in a temporary folder on the host."""

    backend = "local"

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        log.warning(WARNING)
        self.id = f"gyre-local-{uuid.uuid4().hex[:12]}"
        self.workspace = tempfile.mkdtemp(prefix="gyre-ws-")
        self._closed = False
        self.shell = PersistentShell(
            ["bash", "--noprofile", "--norc"],
            workdir=self.workspace,
            env={"HOME": self.workspace, **self.config.env},
            output_limit=self.config.output_limit,
            popen_kwargs={"start_new_session": True, "cwd": self.workspace},
        )

    def _release(self) -> None:
        shutil.rmtree(self.workspace, ignore_errors=True)
