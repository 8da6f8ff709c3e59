"""Leaks: sandboxes are removed however their owner process ends.

Each test starts a real owner process (a child Python) that creates sandboxes, ends it
(SIGKILL, SIGTERM or a normal exit) and checks what is left on the host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(120)

_OWNER = r"""
import json, sys, time
from gyre_env.sandbox import SandboxConfig, make_sandbox
backend, image, count, then = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
made = [make_sandbox(SandboxConfig(image=image), backend=backend) for _ in range(count)]
print(json.dumps([{
    "id": s.id,
    "container": getattr(getattr(s, "container", None), "id", None),
    "host_dir": getattr(s, "host_dir", None),
    "cgroups": [str(d) for d in getattr(getattr(s, "cgroup", None), "dirs", [])],
} for s in made]), flush=True)
if then == "wait":
    time.sleep(600)
"""


def _start_owner(backend: str, image: str, count: int, then: str = "wait"):
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, backend, image, str(count), then],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        raise AssertionError(f"owner process failed: {proc.stderr.read()[-3000:]}")
    return proc, json.loads(line)


def _container_exists(container_id: str) -> bool:
    from gyre_env.sandbox.docker import docker_client

    try:
        docker_client().containers.get(container_id)
        return True
    except Exception as e:
        assert type(e).__name__ == "NotFound", e
        return False


def _gyre(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gyre_env.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _wait_for(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.docker
def test_gc_removes_containers_of_an_owner_killed_with_sigkill(docker_image):
    owner, made = _start_owner("docker", docker_image, 2)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=30)
    containers = [m["container"] for m in made]
    assert all(_container_exists(c) for c in containers), "SIGKILL cannot be caught: they leak"
    dry = _gyre("sandbox", "gc", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert all(m["id"] in dry.stdout for m in made), dry.stdout
    assert all(_container_exists(c) for c in containers), "--dry-run removed something"
    gc = _gyre("sandbox", "gc")
    assert gc.returncode == 0, gc.stderr[-3000:]
    assert all(m["id"] in gc.stdout for m in made), gc.stdout
    assert not any(_container_exists(c) for c in containers)


@pytest.mark.docker
def test_reap_removes_a_container_whose_ttl_passed_while_its_owner_lives(make):
    from gyre_env.sandbox import docker

    sandbox = make("docker", ttl_s=0)
    living = make("docker")
    time.sleep(0.05)
    removed = docker.reap()
    assert sandbox.id in removed and living.id not in removed
    assert not _container_exists(sandbox.container.id)
    assert _container_exists(living.container.id)


@pytest.mark.docker
def test_reap_tolerates_a_container_removed_while_it_lists(make, monkeypatch):
    """Two runs reap at once: a container listed by one is gone before it is inspected
    (seen as 'sandbox reaper failed: 404 ... No such container'). Not a failure."""
    from gyre_env.sandbox import docker

    expired = make("docker", ttl_s=0)
    api = docker.docker_client().api
    listing = api.containers

    def with_a_vanished_one(*a, **kw):
        return [{"Id": "0" * 64}, *listing(*a, **kw)]  # listed, then already removed

    monkeypatch.setattr(api, "containers", with_a_vanished_one)
    time.sleep(0.05)
    assert expired.id in docker.reap()
    assert not _container_exists(expired.container.id)


@pytest.mark.bwrap
def test_bwrap_reap_removes_the_workspace_of_an_owner_killed_with_sigkill():
    from gyre_env.sandbox import bwrap

    owner, made = _start_owner("bwrap", "-", 1)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=30)
    host_dir, cgroups = made[0]["host_dir"], made[0]["cgroups"]
    assert os.path.isdir(host_dir)
    # --die-with-parent ends the sandbox's processes; then its cgroup can be removed.
    removed: list[str] = []
    assert _wait_for(lambda: removed.extend(bwrap.reap()) or not os.path.exists(host_dir))
    assert _wait_for(lambda: removed.extend(bwrap.reap()) or not any(map(os.path.exists, cgroups)))
    assert host_dir in removed
    assert all(c in removed for c in cgroups), (cgroups, removed)


def _gone(backend: str, made: list[dict]) -> bool:
    if backend == "docker":
        return not any(_container_exists(m["container"]) for m in made)
    paths = [m["host_dir"] for m in made] + [c for m in made for c in m["cgroups"]]
    return not any(map(os.path.exists, paths))


def test_sigterm_to_the_owner_closes_its_sandboxes(request, isolated_backend):
    image = request.getfixturevalue("docker_image") if isolated_backend == "docker" else "-"
    owner, made = _start_owner(isolated_backend, image, 2)
    assert not _gone(isolated_backend, made)
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=60) == -signal.SIGTERM  # the handler closes, then dies of it
    assert _gone(isolated_backend, made), made


def test_a_normal_exit_closes_its_sandboxes(request, isolated_backend):
    image = request.getfixturevalue("docker_image") if isolated_backend == "docker" else "-"
    owner, made = _start_owner(isolated_backend, image, 2, then="exit")
    assert owner.wait(timeout=60) == 0, owner.stderr.read()[-3000:]
    assert _gone(isolated_backend, made), made
