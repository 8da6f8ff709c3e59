"""The ``host-usr`` image layout: a tiny root filesystem run with the host's ``/usr`` bound in.

The image holds only ``/etc`` (passwd, group, nsswitch), ``/tmp``, ``/workspace``, home folders
and mount points; everything executable comes from read-only binds of the host (``mounts()``).
It builds in under a second and needs no network, but the sandbox sees the host's toolchain
and nothing else (pytest and ruff must be installed in the host Python running gyre), and
the image is not self-contained: it cannot be moved to another machine. Built by
``gyre_env.sandbox.images``; the binds travel in the image label ``gyre.host_mounts``.

Task data is never visible through these binds (nor through bubblewrap's, which bind the
same host folders): ``task_data_folders`` finds, when a sandbox starts, every host folder
under a bind that holds task data, and the sandbox covers each with an empty read-only
tmpfs. Those are: every ``gyre_env`` package in a Python folder under a bind (a
non-editable ``pip install gyre-env`` ships the built-in tasks' hidden tests and gold in
site-packages, and the ``nano`` generator renders any nano task's hidden tests and gold),
the source checkout of the running ``gyre_env`` when it lies under a bind (an editable
install, e.g. ``pip install -e git+...`` into a venv's ``src/``), and Gyre's cache folders
(``cache_root()``: generated nano tasks; ``~/.cache/gyre``: NL2Repo overlays and gold
trees). Not covered: task folders of your own (an NL2RepoBench checkout or its ``tests=``,
a ``cache_dir=`` of ``load_nl2repo``, ``load_suite("/some/folder")``) placed under ``/usr``,
``/etc`` or the Python prefix: keep them elsewhere (e.g. in your home folder, which no
sandbox binds). No sandbox needs ``gyre_env`` itself: the grader copies in the files it runs.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

from gyre_env.paths import cache_root

# Top-level folders that are symlinks into /usr on merged-/usr hosts (else bound). /sbin is
# always a real folder: Docker mounts its init at /sbin/docker-init, which cannot land in
# the read-only /usr; PATH has /usr/sbin.
SYSTEM_TOPS = ("bin", "lib", "lib32", "lib64", "libx32")
LAYOUT_VERSION = "2"  # bump when the tiny rootfs below changes
_DIRS = [
    ("etc", 0o755, 0),
    ("tmp", 0o1777, 0),
    ("var", 0o755, 0),
    ("var/tmp", 0o1777, 0),
    ("run", 0o755, 0),
    ("root", 0o700, 0),
    ("home", 0o755, 0),
    ("home/gyre", 0o755, 1000),
    ("workspace", 0o755, 1000),
    ("proc", 0o755, 0),
    ("sys", 0o755, 0),
    ("dev", 0o755, 0),
    ("sbin", 0o755, 0),
]
_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/bash\ngyre:x:1000:1000::/home/gyre:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\ngyre:x:1000:\nnogroup:x:65534:\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}


def mounts() -> list[tuple[str, str]]:
    """Read-only binds ``(host, container)`` a ``host-usr`` sandbox runs with: ``/usr``, the
    top-level system folders that are not symlinks into it, ``/etc/alternatives`` and
    ``/etc/ld.so.cache`` (they belong to ``/usr``'s contents), and the prefix of the Python
    running gyre when it lives outside ``/usr`` (pyenv, conda, a venv)."""
    binds = [("/usr", "/usr")]
    for top in SYSTEM_TOPS + ("sbin",):
        if os.path.isdir(f"/{top}") and not os.path.islink(f"/{top}"):
            binds.append((f"/{top}", f"/{top}"))
    for path in ("/etc/alternatives", "/etc/ld.so.cache"):
        if os.path.exists(path):
            binds.append((path, path))
    for prefix in dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)):
        if prefix != "/usr" and not prefix.startswith("/usr/"):
            binds.append((prefix, prefix))
    for host, _ in binds:
        if re.search(r"[\s:,\"'\\]", host):
            raise ValueError(f"cannot bind {host!r} into a host-usr image: odd characters")
    return binds


def _package_dir() -> Path:
    """The folder of the running ``gyre_env`` package (site-packages or a checkout)."""
    return Path(__file__).resolve().parent.parent


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def task_data_folders(roots: Iterable[str]) -> list[str]:
    """Host folders (real paths) at or under ``roots`` (host folders a sandbox binds) that
    hold task data, outermost only, sorted: see the module docstring for which.

    Computed from where the data really is on this host: the import location of the
    running ``gyre_env``, the site folders under each root (any Python version) and of
    ``sys.path``, and ``cache_root()``. A root that lies inside one of them cannot be bound
    without showing task data: ``ValueError`` names it."""
    roots = [os.path.realpath(r) for r in roots]
    package = _package_dir()
    candidates = [package]
    # A checkout (its .git, tests and build/ hold the tasks too), unless a root lies inside
    # it: a project's own .venv is bound, the checkout around it is not.
    checkout = str(package.parent)
    if (package.parent / "pyproject.toml").is_file() and not any(
        _within(root, checkout) for root in roots
    ):
        candidates.append(package.parent)
    for root in roots:
        for pattern in (
            "lib*/python3*/*-packages/gyre_env",
            "local/lib*/python3*/*-packages/gyre_env",
        ):
            candidates += Path(root).glob(pattern)
    candidates += [Path(entry or ".") / "gyre_env" for entry in sys.path]
    candidates += [cache_root(), Path.home() / ".cache" / "gyre"]
    found: set[str] = set()
    for candidate in candidates:
        if not candidate.is_dir():
            continue
        real = os.path.realpath(candidate)
        for root in roots:
            if _within(root, real):
                raise ValueError(
                    f"refusing to bind {root} into a sandbox: it lies inside {real}, which "
                    "holds task data (hidden tests, gold); move the task data or the Python"
                )
            if _within(real, root):
                found.add(real)
    return sorted(f for f in found if not any(f != o and _within(f, o) for o in found))


MASK_OPTIONS = "ro,size=4k"
"""The tmpfs each mask is: empty, read-only, 4 KiB."""


def masks(binds: Iterable[tuple[str, str]]) -> list[str]:
    """Container paths to cover with an empty read-only tmpfs so that ``binds``
    (``(host, container)`` pairs) show no task data (``task_data_folders``)."""
    binds = [(os.path.realpath(h), c) for h, c in binds]
    out = []
    for folder in task_data_folders(h for h, _ in binds):
        host, inside = max((b for b in binds if _within(folder, b[0])), key=lambda b: len(b[0]))
        out.append(inside.rstrip("/") + folder[len(host) :])
    return out


def image_env() -> dict[str, str]:
    """Environment of a host-usr image: the host Python's folder first on PATH, and pip set
    to install into the user site, since the bound ``/usr`` and Python prefix are read-only."""
    python_bin = os.path.dirname(sys.executable)
    path = [
        "/root/.local/bin",
        "/home/gyre/.local/bin",
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    # In a virtualenv, tools of the base interpreter (a system-site ruff) sit in its bin.
    for folder in (os.path.join(sys.base_prefix, "bin"), python_bin):
        if folder not in path:
            path.insert(0, folder)
    return {
        "PATH": ":".join(path),
        "LANG": "C.UTF-8",
        "PIP_USER": "1",
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
    }


def rootfs_tar() -> bytes:
    """The tiny rootfs of a host-usr image, as a tar (owners set here, not by who runs us)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(
            name: str,
            kind: bytes,
            mode: int = 0o755,
            uid: int = 0,
            data: bytes = b"",
            link: str = "",
        ) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = kind, mode, uid, uid
            info.linkname, info.size, info.mtime = link, len(data), 0
            tar.addfile(info, io.BytesIO(data) if data else None)

        for name, mode, uid in _DIRS:
            add(name, tarfile.DIRTYPE, mode, uid)
        for top in SYSTEM_TOPS:
            if os.path.islink(f"/{top}"):
                add(top, tarfile.SYMTYPE, 0o777, link=os.readlink(f"/{top}"))
            elif os.path.isdir(f"/{top}"):
                add(top, tarfile.DIRTYPE)
        for name, text in _FILES.items():
            add(name, tarfile.REGTYPE, 0o644, data=text.encode())
        for host, inside in mounts():  # mount points of every bind
            if inside.startswith("/etc/") or inside == "/usr":
                add(
                    inside.lstrip("/"),
                    tarfile.REGTYPE if os.path.isfile(host) else tarfile.DIRTYPE,
                    0o644 if os.path.isfile(host) else 0o755,
                )
    return buf.getvalue()
