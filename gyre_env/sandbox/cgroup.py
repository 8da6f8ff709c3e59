"""A cgroup per sandbox with pids and memory limits (cgroup v1 controllers or unified v2),
for the backends that are not containers (bubblewrap, local). Needs a writable
``/sys/fs/cgroup`` (root, or a delegated subtree); where there is none, ``try_cgroup``
returns None and the backend falls back to rlimits."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from gyre_env.sandbox.base import SandboxConfig
from gyre_env.sandbox.shell import shell_quote

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


class Cgroup:
    """A per-sandbox cgroup with pids and memory limits (v1 controllers or unified v2)."""

    def __init__(self, name: str, pids: int, memory_bytes: int):
        self.dirs: list[Path] = []
        if (CGROUP_ROOT / "cgroup.controllers").exists():  # v2
            parent = CGROUP_ROOT / "gyre"
            parent.mkdir(exist_ok=True)
            for level in (CGROUP_ROOT, parent):  # let children use the controllers
                (level / "cgroup.subtree_control").write_text("+pids +memory")
            d = parent / name
            d.mkdir()
            self.dirs = [d]
            (d / "pids.max").write_text(str(pids))
            (d / "memory.max").write_text(str(memory_bytes))
            (d / "memory.swap.max").write_text("0")
            self.events = d / "memory.events"
        else:  # v1
            pdir, mdir = (
                CGROUP_ROOT / "pids" / "gyre" / name,
                CGROUP_ROOT / "memory" / "gyre" / name,
            )
            pdir.mkdir(parents=True)
            self.dirs.append(pdir)
            mdir.mkdir(parents=True)
            self.dirs.append(mdir)
            (pdir / "pids.max").write_text(str(pids))
            (mdir / "memory.limit_in_bytes").write_text(str(memory_bytes))
            try:
                (mdir / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            except OSError:
                pass  # no swap accounting
            self.events = mdir / "memory.oom_control"

    def enter_prefix(self) -> list[str]:
        """argv prefix that moves the process into this cgroup, then execs the rest."""
        moves = "; ".join(f"echo $$ > {shell_quote(str(d / 'cgroup.procs'))}" for d in self.dirs)
        return ["sh", "-c", f'{moves}; exec "$@"', "gyre-cgroup"]

    def oom_kills(self) -> int:
        try:
            for line in self.events.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill what is left in the cgroup, wait until it is empty, then remove it (a
        cgroup with tasks still exiting refuses rmdir with EBUSY)."""
        deadline = time.monotonic() + timeout
        for d in self.dirs:
            while True:
                try:
                    pids = (d / "cgroup.procs").read_text().split()
                except OSError:
                    break  # already gone
                for pid in pids:
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
                try:
                    d.rmdir()
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s: %s", d, e)
                        break
                    time.sleep(0.01)


def try_cgroup(name: str, config: SandboxConfig, fallback: str) -> Cgroup | None:
    """The sandbox's cgroup, or None (logged with what limits apply instead, ``fallback``)
    where cgroups are not writable."""
    try:
        return Cgroup(name, config.pids, config.memory_mb << 20)
    except OSError as e:
        log.warning("cgroups not writable (%s): %s", e, fallback)
        return None
