"""Debian root filesystems for the offline (``debootstrap``) image build.

``run_debootstrap`` makes a minimal bookworm tree from the host's apt mirror
(``debian_mirror``); ``download_wheels`` fetches wheels for its Python with the host's own
pip (so the host's index, proxy and CA settings apply); ``run_setup`` runs the image's setup
script in it under ``chroot`` with a clean environment, installing those wheels with no
network. ``gyre_env.sandbox.images`` imports the result into Docker.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
PYTHON = "3.11"  # the python3 of SUITE, for which wheels are fetched
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class RootfsError(RuntimeError):
    """A step of making the root filesystem failed; the message names the step."""


def problem() -> str | None:
    """Why ``run_debootstrap`` cannot work on this host, or None."""
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (apt-get install debootstrap debian-archive-keyring)"
    if os.geteuid() != 0:
        return "debootstrap needs root (it chroots and creates device files)"
    if not os.path.exists(KEYRING):
        return f"{KEYRING} is missing (apt-get install debian-archive-keyring)"
    return None


def run_debootstrap(
    rootfs: str, mirror: str, packages: list[str], progress: Callable[[str], None]
) -> None:
    """``debootstrap --variant=minbase --include=packages SUITE rootfs mirror``; downloaded
    packages are kept in ``~/.cache/gyre/debs`` for the next build."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gyre" / "debs"
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        f"--keyring={KEYRING}",
        f"--cache-dir={cache}",
        SUITE,
        rootfs,
        mirror,
    ]
    progress(f"$ {shlex.join(cmd)}")
    start = time.monotonic()
    seen: set[str] = set()
    shown = [0.0]

    def emit(line: str) -> None:
        # The first line of each phase (Retrieving, Extracting, ...) and one every 10 s,
        # rather than one line per package.
        words = line.split()
        phase = words[1] if line.startswith("I: ") and len(words) > 1 else line
        now = time.monotonic() - start
        if phase not in seen or now - shown[0] > 10:
            seen.add(phase)
            shown[0] = now
            progress(f"  [{now:5.1f} s] debootstrap {line}")

    stream(cmd, emit, f"debootstrap from {mirror} (log: {rootfs}/debootstrap/debootstrap.log)")
    progress(f"  debootstrap done in {time.monotonic() - start:.1f} s")


def download_wheels(dest: str, reqs: list[str], index_url: str | None, progress) -> None:
    """Wheels for the image's Python (Debian's 3.11), fetched by the host's pip, so the
    host's index, proxy and certificate settings apply and the chroot needs no network."""
    machine = platform.machine()
    plats = [f"manylinux_2_{v}_{machine}" for v in range(36, 4, -1)]
    plats += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--dest",
        dest,
        "--python-version",
        PYTHON,
        "--implementation",
        "cp",
        "--abi",
        f"cp{PYTHON.replace('.', '')}",
    ]
    cmd += [f for plat in plats for f in ("--platform", plat)]
    cmd += ["--index-url", index_url] if index_url else []
    progress(f"  pip download (host pip config) {' '.join(reqs)}")
    stream(cmd + reqs, lambda line: progress(f"  pip: {line}"), "pip download")
    progress(f"  {len(os.listdir(dest))} wheels in {dest}")


def stream(cmd: list[str], emit: Callable[[str], None], what: str) -> None:
    """Run ``cmd``, passing its output lines to ``emit``; raise naming ``what`` on failure."""
    tail: list[str] = []
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-30:]
            emit(line.rstrip())
    if proc.returncode != 0:
        raise RootfsError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def debian_mirror(
    sources: Sequence[str] = ("/etc/apt/sources.list", "/etc/apt/sources.list.d"),
) -> str:
    """The first apt source on this host that serves Debian ``bookworm``, else deb.debian.org.

    Reads both one-line (``deb URI suite ...``) and deb822 (``URIs:``/``Suites:``) files.
    """
    for path in _source_files(sources):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for uris, suites in _parse_sources(text, path.endswith(".sources")):
            if SUITE in suites and uris:
                return uris[0].rstrip("/")
    return DEFAULT_MIRROR


def _source_files(sources: Sequence[str]) -> Iterator[str]:
    for src in sources:
        if os.path.isdir(src):
            yield from (
                os.path.join(src, n)
                for n in sorted(os.listdir(src))
                if n.endswith((".list", ".sources"))
            )
        elif os.path.isfile(src):
            yield src


def _parse_sources(text: str, deb822: bool) -> Iterator[tuple[list[str], list[str]]]:
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.lstrip().startswith("#"):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"]) != ["no"]:
                yield fields.get("uris", []), fields.get("suites", [])
        return
    for line in text.splitlines():
        words = re.sub(r"\[[^\]]*\]", " ", line.split("#")[0]).split()
        if len(words) >= 3 and words[0] == "deb":
            yield [words[1]], [words[2]]


def remove_tree(path: str) -> None:
    """Remove a build folder, first unmounting anything a failed debootstrap left mounted."""
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        mounted = [ln.split()[1] for ln in f if ln.split()[1].startswith(real + "/")]
    for point in sorted(mounted, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    with open("/proc/mounts") as f:
        if any(ln.split()[1].startswith(real + "/") for ln in f):
            print(f"gyre: left {path} in place: something is mounted under it", file=sys.stderr)
            return
    shutil.rmtree(path, ignore_errors=True)


def run_setup(rootfs: str, script: Path, env: dict[str, str], progress) -> None:
    """Run ``script`` as root inside ``rootfs`` (chroot) with only ``env`` set."""
    inside = f"/tmp/{script.name}"
    shutil.copy(script, rootfs + inside)
    env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", **env}
    cmd = ["chroot", rootfs, "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items())]
    progress(f"  chroot {rootfs} sh {inside}")
    stream([*cmd, "sh", inside], lambda line: progress(f"  setup: {line}"), "the setup script")
