"""Fixtures for the sandbox tests: a Docker image, backend parameters, a sandbox factory.

The Docker image is ``gyre-base:latest`` when it has been built (``gyre images build``),
else a tiny development image made here in about a second: a root filesystem holding only
mount points, ``/etc/passwd`` and ``/etc/group``, that runs on the host's ``/usr``
bind-mounted read-only (declared by the ``gyre.host_mounts`` label DockerSandbox reads).
``GYRE_TEST_IMAGE`` overrides both.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile

import pytest

from gyre_env.sandbox import SandboxConfig

BASE_IMAGE = "gyre-base:latest"
DEV_IMAGE = "gyre-test-hostusr:latest"
_DEV_LABEL = 'LABEL gyre.host_mounts="[[\\"/usr\\",\\"/usr\\"]]"'

ISOLATED = [
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("bwrap", marks=pytest.mark.bwrap),
]
ALL = [*ISOLATED, "local"]

# Small limits so that attacks hit them fast; tests override what they attack.
TEST_LIMITS = {"memory_mb": 512, "pids": 128, "cpus": 1.0}


def _image_exists(tag: str) -> bool:
    from gyre_env.sandbox.docker import docker_client

    try:
        docker_client().images.get(tag)
        return True
    except Exception:
        return False


def _dev_rootfs_tar() -> bytes:
    """A root filesystem of mount points and symlinks into the host's /usr."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("etc", "tmp", "workspace", "root", "proc", "sys", "dev", "run", "sbin", "usr"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for link in ("bin", "lib", "lib64"):  # docker-init needs a real /sbin, not a link
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{link}"
            tar.addfile(info)
        for path in ("/etc/passwd", "/etc/group"):
            tar.add(path, arcname=path.lstrip("/"))
    return buf.getvalue()


def build_dev_image(tag: str = DEV_IMAGE) -> str:
    """Import the development image (idempotent: an existing image is reused)."""
    if not _image_exists(tag):
        subprocess.run(
            ["docker", "import", "-c", _DEV_LABEL, "-", tag],
            input=_dev_rootfs_tar(),
            check=True,
            capture_output=True,
        )
    return tag


@pytest.fixture(scope="session")
def docker_image() -> str:
    override = os.environ.get("GYRE_TEST_IMAGE")
    if override:
        return override
    return BASE_IMAGE if _image_exists(BASE_IMAGE) else build_dev_image()


@pytest.fixture
def make(request):
    """``make(backend, **config)`` starts a sandbox that is closed when the test ends."""
    created = []

    def start(backend: str, **overrides):
        from gyre_env.sandbox import make_sandbox

        fields = {**TEST_LIMITS, **overrides}
        if backend == "docker":
            fields.setdefault("image", request.getfixturevalue("docker_image"))
        sandbox = make_sandbox(SandboxConfig(**fields), backend=backend)
        created.append(sandbox)
        return sandbox

    yield start
    for sandbox in created:
        sandbox.close()


@pytest.fixture(params=ISOLATED)
def isolated_backend(request) -> str:
    return request.param


@pytest.fixture(params=ALL)
def any_backend(request) -> str:
    return request.param
