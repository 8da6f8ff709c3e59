"""DockerSandbox: one container per episode, driven through one persistent shell.

Covers: the container's own filesystem, pid, IPC and network namespaces (network
``none`` by default, so only loopback exists inside); memory (no swap), CPU and pids
limits from cgroups; ``init=True`` so orphans are reaped; after each command, every
process it left behind in the container is killed (``setsid`` and fork bombs included;
see ``gyre_env.sandbox.shell``); an image's read-only host binds (``gyre.host_mounts``,
host-usr images) with every folder of task data under them covered by an empty tmpfs
(``hostusr.masks``); labels naming the owner
process, creation time and TTL so ``reap()`` can remove leaked containers. Does not
cover: kernel exploits or a daemon shared with untrusted users.

The container must outlive whatever the agent runs: its main process (``docker-init``,
pid 1, and the ``sleep`` it keeps) is what keeps it running. Pid 1 ignores signals from
inside its namespace; the ``sleep`` runs as ``nobody`` (65534), and an agent's container
(not an evaluator's) drops ``CAP_KILL``, ``CAP_SETUID`` and ``CAP_SETGID``, so its root
(the commands run as root, ``docker exec -u 0``) can signal only its own uid's processes:
``kill -9 -1`` kills the agent's processes and its shell (started again) but not the
container. Should a container still stop while an agent command runs (it was not removed
and the daemon answers), ``exec`` raises ``SandboxEndedByCommand``: the agent's doing,
scored, not an infrastructure failure. An evaluator container (``evaluator=True``) keeps
Docker's default capabilities: its grader switches the tests to a fresh uid itself.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
import uuid

from gyre_env._optional import require
from gyre_env.sandbox import hostusr, lifecycle, route
from gyre_env.sandbox.base import (
    WORKSPACE,
    ExecResult,
    ImageNotFoundError,
    SandboxClosedError,
    SandboxConfig,
    SandboxEndedByCommand,
    SandboxError,
)
from gyre_env.sandbox.files import ShellSandbox
from gyre_env.sandbox.shell import PersistentShell

log = logging.getLogger(__name__)

LABEL_KIND = "gyre.sandbox"
MOUNTS_LABEL = "gyre.host_mounts"  # JSON [[host, container], ...] read-only binds an image needs
KEEPALIVE_USER = "65534:65534"
"""Who runs the container's main process: nobody, whom an agent's root cannot signal."""
AGENT_CAP_DROP = ("KILL", "SETUID", "SETGID")
"""Capabilities an agent's container drops, so that its root cannot end the keep-alive."""
_client = None
_client_lock = threading.Lock()
_reaped = False


def docker_client():
    """The shared docker SDK client (thread-safe; created on first use)."""
    global _client
    with _client_lock:
        if _client is None:
            docker = require("docker", "the Docker sandbox")
            _client = docker.from_env(timeout=120)
        return _client


def daemon_available() -> bool:
    try:
        docker_client().ping()
        return True
    except Exception:
        return False


def require_docker() -> None:
    """Raise ``SandboxError`` naming the start or install command when no Docker daemon
    answers: checked before a run's first episode, since without a daemon every episode
    would end as ``infra_error`` and the failure would surface far from its cause."""
    import os

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        docker_client().ping()
        return
    except ImportError as e:  # the docker SDK itself (MissingExtraError names the pip install)
        raise SandboxError(f"sandbox backend 'docker': {e}") from e
    except Exception as e:  # noqa: BLE001 - any failure to reach the daemon is this one
        reason = f"{type(e).__name__}: {e}"
    installed = shutil.which("docker") is not None or shutil.which("dockerd") is not None
    fix = (
        "start it (`sudo systemctl start docker`, or `sudo dockerd &`; in this repository's "
        "CI image `bash .ci/setup`)"
        if installed
        else "install Docker (https://docs.docker.com/engine/install/) and start it "
        "(`sudo systemctl start docker`)"
    )
    raise SandboxError(
        f"sandbox backend 'docker': the Docker daemon is not reachable at {where} ({reason}): "
        f"{fix}; or choose sandbox_backend = 'bwrap'"
    )


class DockerSandbox(ShellSandbox):
    """A container started from ``config.image`` with a persistent ``docker exec`` shell."""

    backend = "docker"

    def __init__(self, config: SandboxConfig | None = None, *, evaluator: bool = False):
        self.config = config or SandboxConfig()
        self.evaluator = evaluator
        self.workspace = WORKSPACE
        self.id = f"gyre-{uuid.uuid4().hex[:12]}"
        self._closed = False
        _reap_once()
        self.container = self._create()
        lifecycle.track(self)
        try:
            self.shell = PersistentShell(
                [
                    _docker_cli(),
                    "exec",
                    "-i",
                    "-u",
                    "0:0",
                    "-w",
                    WORKSPACE,
                    self.container.id,
                    "bash",
                    "--noprofile",
                    "--norc",
                ],
                workdir=WORKSPACE,
                env=self.config.env,
                output_limit=self.config.output_limit,
                start_timeout=self.config.start_timeout_s,
                reap="container",
            )
            if self.config.proxy_socket:
                self._start_forwarder()
        except BaseException:
            self.close()
            raise

    def _create(self):
        client = docker_client()
        errors = require("docker.errors", "the Docker sandbox")
        cfg = self.config
        try:
            image = client.images.get(cfg.image)
        except errors.ImageNotFound as e:
            raise ImageNotFoundError(
                cfg.image, f"image {cfg.image!r} not found; build it with `gyre images build`"
            ) from e
        raw_mounts = (image.labels or {}).get(MOUNTS_LABEL, "[]")
        try:
            binds = [(str(host), str(inside)) for host, inside in json.loads(raw_mounts)]
        except (ValueError, TypeError) as e:
            raise SandboxError(
                f"image {cfg.image!r} has a malformed {MOUNTS_LABEL} label {raw_mounts!r}; "
                "expected JSON [[host, container], ...]"
            ) from e
        volumes = {host: {"bind": inside, "mode": "ro"} for host, inside in binds}
        try:  # host binds show no task data: an empty read-only tmpfs over each such folder
            hidden = {path: hostusr.MASK_OPTIONS for path in hostusr.masks(binds)}
        except ValueError as e:
            raise SandboxError(f"image {cfg.image!r}: {e}") from e
        if cfg.proxy_socket:
            host_dir, inside = route.socket_mount(cfg.proxy_socket)
            volumes[host_dir] = {"bind": inside, "mode": "ro"}  # not replaceable
        try:
            return client.containers.run(
                cfg.image,
                command=["sleep", "infinity"],
                name=self.id,
                detach=True,
                init=True,
                user=KEEPALIVE_USER,
                cap_drop=[] if self.evaluator else list(AGENT_CAP_DROP),
                network_mode="bridge" if cfg.network else "none",
                mem_limit=f"{cfg.memory_mb}m",
                memswap_limit=f"{cfg.memory_mb}m",
                nano_cpus=int(cfg.cpus * 1e9),
                pids_limit=cfg.pids,
                working_dir=WORKSPACE,
                volumes=volumes,
                tmpfs=hidden,
                labels={LABEL_KIND: "1", **lifecycle.owner_labels(cfg.ttl_s)},
                auto_remove=False,
            )
        except errors.DockerException as e:
            try:  # `run` creates before it starts: do not leave a created container behind
                client.containers.get(self.id).remove(force=True)
            except errors.DockerException:
                pass
            raise SandboxError(f"could not start a container from {cfg.image!r}: {e}") from e

    def _oom_kills(self) -> int:
        """The memory cgroup's OOM-kill counter (cgroup v1 and v2); 0 where unreadable."""
        cid = self.container.id
        for path, key in (
            (f"/sys/fs/cgroup/memory/docker/{cid}/memory.oom_control", "oom_kill"),
            (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.events", "oom_kill"),
            (f"/sys/fs/cgroup/docker/{cid}/memory.events", "oom_kill"),
        ):
            try:
                with open(path) as fh:
                    for line in fh:
                        name, _, value = line.partition(" ")
                        if name == key:
                            return int(value)
            except OSError:
                continue
        return 0

    def exec(self, cmd: str, timeout: float = 60.0, cwd=None, env=None, keep_background=False):
        try:
            return super().exec(
                cmd, timeout=timeout, cwd=cwd, env=env, keep_background=keep_background
            )
        except SandboxClosedError:
            raise
        except SandboxError as e:
            why = self._stopped_by_itself()
            if why is None:
                raise
            raise SandboxEndedByCommand(f"sandbox {self.id}: {why}") from e

    def _stopped_by_itself(self) -> str | None:
        """Why the container stopped, if it did so on its own while we held it: it was not
        closed or removed, the daemon answers, and its state is exited. None otherwise
        (removed, or the daemon is gone: not the agent's doing)."""
        if self._closed:
            return None
        try:
            self.container.reload()
            state = self.container.attrs.get("State", {})
        except Exception:
            return None
        if self.container.status not in ("exited", "dead"):
            return None
        return (
            f"the container stopped while a command ran (main process exit "
            f"{state.get('ExitCode')}, OOM-killed {bool(state.get('OOMKilled'))})"
        )

    def alive(self) -> bool:
        if self._closed:
            return False
        try:
            self.container.reload()
            return self.container.status == "running"
        except Exception:
            return False

    def _release(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception as e:
            log.debug("container %s already gone: %s", self.id, e)


def _docker_cli() -> str:
    cli = shutil.which("docker")
    if cli is None:
        raise SandboxError("the `docker` command-line client is needed (apt-get install docker.io)")
    return cli


def reap(dry_run: bool = False) -> list[str]:
    """Remove Gyre containers whose owner process is gone or whose TTL passed."""
    removed = []
    # ignore_removed: another run (or its own close) may remove a listed container
    # before it is inspected; that is not a failure of the reaper.
    listed = docker_client().containers.list(
        all=True, filters={"label": LABEL_KIND}, ignore_removed=True
    )
    for container in listed:
        labels = container.labels or {}
        if lifecycle.owner_gone(labels) or lifecycle.expired(labels):
            removed.append(container.name)
            if not dry_run:
                try:
                    container.remove(force=True)
                except Exception as e:
                    log.debug("could not remove %s: %s", container.name, e)
    if removed:
        log.info("reaped %d leaked sandbox container(s): %s", len(removed), removed)
    return removed


def _reap_once() -> None:
    global _reaped
    with _client_lock:
        if _reaped:
            return
        _reaped = True
    try:
        reap()
    except Exception as e:
        log.warning("sandbox reaper failed: %s", e)


def docker_exec_once(sandbox: DockerSandbox, cmd: str) -> ExecResult:
    """One command through a fresh `docker exec` (the baseline the persistent shell beats)."""
    import time

    start = time.monotonic()
    proc = subprocess.run(
        [_docker_cli(), "exec", "-u", "0:0", sandbox.container.id, "bash", "-c", cmd],
        capture_output=True,
    )
    return ExecResult(
        exit_code=proc.returncode,
        stdout=proc.stdout.decode(errors="replace"),
        stderr=proc.stderr.decode(errors="replace"),
        duration_s=time.monotonic() - start,
    )
