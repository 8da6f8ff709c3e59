"""Building Gyre's base sandbox image, with a registry or without one.

``gyre images build`` makes the image that DockerSandbox starts (``gyre-base:latest``): Python
3.11, pytest, ruff, and setuptools + wheel so a task's workspace package installs with
``pip install --no-build-isolation -e .`` and no network. Three ways to get it:

- ``dockerfile``: ``docker build`` of the shipped ``Dockerfile`` on ``python:3.11-slim``.
  Needs a reachable registry.
- ``debootstrap``: a Debian bookworm root filesystem made locally with ``debootstrap`` from
  the host's apt mirror, imported with the Docker API (``docker import``), then the same
  ``Dockerfile`` is built on top of it. Needs root, ``debootstrap`` and PyPI, no registry.
  Self-contained and portable (``docker save`` it anywhere). About a minute.
- ``host-usr``: a tiny root filesystem (``/etc``, ``/tmp``, ``/workspace``) that runs with the
  host's ``/usr`` (and the host Python's prefix, if outside ``/usr``) bind-mounted read-only.
  Builds in under a second, but the sandbox sees the host's toolchain (whatever is
  installed there, and only that: pytest and ruff must be installed in the host Python
  running gyre), the image is not self-contained, and it cannot be moved to another
  machine. ``pip install`` inside goes to the user site (``PIP_USER=1``) since ``/usr`` is
  read-only. For development only.

``auto`` reuses an existing image whose recipe is current, else picks ``dockerfile`` when
the daemon can reach the registry and ``debootstrap`` otherwise.

Every image carries labels: ``gyre.image.method``, ``gyre.image.recipe`` (a hash of
everything that decides its content, so a changed recipe rebuilds) and, for ``host-usr``,
``gyre.host_mounts`` (JSON ``[[host_path, container_path], ...]``, read-only binds a sandbox
must add; DockerSandbox reads it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gyre_env._optional import require

DEFAULT_TAG = "gyre-base:latest"
METHODS = ("auto", "dockerfile", "debootstrap", "host-usr")
LABEL_METHOD = "gyre.image.method"
LABEL_RECIPE = "gyre.image.recipe"
LABEL_HOST_MOUNTS = "gyre.host_mounts"
DEBIAN_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
RECIPE_VERSION = "1"  # bump when this module changes what goes into an image
DOCKERFILE = Path(__file__).with_name("Dockerfile")
SETUP_SCRIPT = Path(__file__).with_name("gyre-image-setup.sh")
_ROOTFS_REPO = "gyre-rootfs"
# Left out of the imported rootfs: Docker provides /dev, /proc, /sys; apt caches are dead weight.
_ROOTFS_EXCLUDES = (
    "./dev/*",
    "./proc/*",
    "./sys/*",
    "./var/cache/apt/archives/*.deb",
    "./var/lib/apt/lists/*",
    "./tmp/*",
)
_SMOKE_CHECK = (
    "python3 -c 'import pytest, setuptools, wheel' && ruff --version >/dev/null"
    ' && test "$(echo Z3lyZQ== | base64 -d)" = gyre && ps -p 1 >/dev/null'
    " && tar --version >/dev/null && command -v kill >/dev/null && echo gyre-image-ok"
)

# host-usr: top-level folders that are symlinks into /usr on merged-/usr hosts (else bound).
_SYSTEM_TOPS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_HOST_USR_LAYOUT = "1"  # bump when the tiny rootfs below changes
_HOST_USR_DIRS = [
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
]
_HOST_USR_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/bash\ngyre:x:1000:1000::/home/gyre:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\ngyre:x:1000:\nnogroup:x:65534:\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}

Progress = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """Building the base image failed; the message says which step and what to do."""


@dataclass(kw_only=True)
class BuiltImage:
    """What ``build_base_image`` produced (or found already built)."""

    tag: str
    """The image's name, e.g. ``gyre-base:latest``."""
    image_id: str
    method: str
    """The method that built it: ``dockerfile``, ``debootstrap`` or ``host-usr``."""
    recipe: str
    """Content hash of the recipe, also in the ``gyre.image.recipe`` label."""
    reused: bool
    """True when an image with the current recipe existed and nothing was built."""
    seconds: float
    """Wall time of this call."""
    host_mounts: list[tuple[str, str]] = field(default_factory=list)
    """Read-only binds ``(host, container)`` a sandbox must add (``host-usr`` only)."""


def build_base_image(
    tag: str = DEFAULT_TAG,
    method: str = "auto",
    extra_requirements: Sequence[str] = (),
    force: bool = False,
    progress: Progress = print,
    mirror: str | None = None,
    pip_index_url: str | None = None,
) -> BuiltImage:
    """Build Gyre's base sandbox image as ``tag``, or reuse it if its recipe is current.

    ``extra_requirements`` are pip requirement strings added to the image (not used by
    ``host-usr``, which sees the host Python's packages). ``mirror`` is the Debian mirror for
    ``debootstrap`` (default: the host's apt mirror for bookworm, else deb.debian.org);
    ``pip_index_url`` the package index the build installs from (default PyPI).
    """
    if method not in METHODS:
        raise ValueError(f"unknown image build method {method!r}; choose one of {METHODS}")
    extra = _check_requirements(extra_requirements)
    if method == "host-usr" and extra:
        raise ValueError("host-usr images use the host Python's packages; install extras there")
    start = time.monotonic()
    client = _client()
    existing = _image_labels(client, tag) or {}
    candidates = [method] if method != "auto" else [existing.get(LABEL_METHOD, "")]
    for candidate in candidates:
        if candidate in METHODS[1:] and not force:
            recipe = recipe_hash(candidate, extra)
            if existing.get(LABEL_RECIPE) == recipe:
                progress(f"{tag}: up to date ({candidate}, recipe {recipe}); --force rebuilds")
                return _result(client, tag, candidate, recipe, True, start)
    if method == "auto":
        method = choose_method(client, progress)
    recipe = recipe_hash(method, extra)
    labels = {LABEL_METHOD: method, LABEL_RECIPE: recipe}
    progress(f"{tag}: building with method {method} (recipe {recipe})")
    if method == "host-usr":
        _build_host_usr(client, tag, labels, progress)
    else:
        base = _dockerfile_args()["BASE"]
        if method == "debootstrap":
            base = _rootfs_image(client, mirror or debian_mirror(), force, progress)
        _docker_build(client, tag, base, labels, extra, pip_index_url, progress)
    progress(f"{tag}: checking the tools inside (network none)")
    smoke_check(tag)
    result = _result(client, tag, method, recipe, False, start)
    progress(f"{tag}: built in {result.seconds:.1f} s ({result.image_id[:19]})")
    return result


def choose_method(client, progress: Progress = print) -> str:
    """``dockerfile`` if the daemon can reach the registry holding the Dockerfile's base
    image (or already has it), else ``debootstrap`` (needs root and debootstrap)."""
    base = _dockerfile_args()["BASE"]
    if _image_labels(client, base) is not None:
        return "dockerfile"
    docker = require("docker", "building sandbox images")
    probe = docker.from_env(timeout=15)
    try:
        probe.api.inspect_distribution(base)
        progress(f"registry reachable for {base}: using the Dockerfile")
        return "dockerfile"
    except Exception as e:  # any failure (DNS, timeout, auth) means: no registry
        progress(f"no registry for {base} ({_first_line(e)}): building offline with debootstrap")
    finally:
        probe.close()
    problem = _debootstrap_problem()
    if problem:
        raise ImageBuildError(
            f"no registry is reachable and debootstrap cannot run here: {problem}. "
            "Use `gyre images build --method host-usr` for a development image."
        )
    return "debootstrap"


def recipe_hash(method: str, extra_requirements: Sequence[str] = ()) -> str:
    """A short hash of everything that decides the image's content for ``method``."""
    h = hashlib.sha256()
    parts = [RECIPE_VERSION, method, *extra_requirements]
    if method == "host-usr":
        parts += [json.dumps(host_usr_mounts()), json.dumps(_host_usr_env()), _HOST_USR_LAYOUT]
    else:
        parts += [DOCKERFILE.read_text(), SETUP_SCRIPT.read_text()]
    if method == "debootstrap":
        parts.append(DEBIAN_SUITE)
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def host_mounts_from_labels(labels: dict | None) -> list[tuple[str, str]]:
    """The read-only binds ``(host, container)`` an image asks for in its labels."""
    raw = (labels or {}).get(LABEL_HOST_MOUNTS)
    if not raw:
        return []
    try:
        pairs = [(str(a), str(b)) for a, b in json.loads(raw)]
    except (ValueError, TypeError) as e:
        raise ValueError(f"malformed {LABEL_HOST_MOUNTS} label {raw!r}: {e}") from e
    return pairs


def docker_run_flags(labels: dict | None) -> list[str]:
    """The ``docker run`` flags an image needs beyond the usual ones (``-v`` binds)."""
    return [
        f for host, inside in host_mounts_from_labels(labels) for f in ("-v", f"{host}:{inside}:ro")
    ]


def smoke_check(tag: str) -> str:
    """Run the tools a task relies on inside ``tag`` with no network; raise if one fails."""
    client = _client()
    labels = _image_labels(client, tag)
    if labels is None:
        raise ImageBuildError(f"no image {tag}; build it with `gyre images build`")
    volumes = {h: {"bind": c, "mode": "ro"} for h, c in host_mounts_from_labels(labels)}
    try:
        out = client.containers.run(
            tag,
            ["bash", "-c", _SMOKE_CHECK],
            network_mode="none",
            volumes=volumes,
            remove=True,
            stderr=True,
        )
    except Exception as e:
        raise ImageBuildError(f"image {tag} lacks a tool Gyre needs: {e}") from e
    return out.decode(errors="replace")


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
            if DEBIAN_SUITE in suites and uris:
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


def _dockerfile_args() -> dict[str, str]:
    """The ``ARG NAME=default`` lines of the shipped Dockerfile: the recipe's one source."""
    args = {}
    for line in DOCKERFILE.read_text().splitlines():
        m = re.match(r"\s*ARG\s+(\w+)=(.*)$", line)
        if m:
            args[m.group(1)] = shlex.split(m.group(2))[0] if m.group(2).strip() else ""
    return args


def _check_requirements(reqs: Sequence[str]) -> list[str]:
    if isinstance(reqs, str):
        raise TypeError("extra_requirements must be a list of requirement strings, not a str")
    out = []
    for r in reqs:
        if not isinstance(r, str) or not r.strip() or re.search(r"\s|['\"\\$`;]", r.strip()):
            raise ValueError(f"bad pip requirement {r!r}: one requirement per item, no spaces")
        out.append(r.strip())
    return out


def _debootstrap_problem() -> str | None:
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (apt-get install debootstrap debian-archive-keyring)"
    if os.geteuid() != 0:
        return "debootstrap needs root (it chroots and creates device files)"
    if not os.path.exists(DEBIAN_KEYRING):
        return f"{DEBIAN_KEYRING} is missing (apt-get install debian-archive-keyring)"
    return None


def _rootfs_image(client, mirror: str, force: bool, progress: Progress) -> str:
    """A ``gyre-rootfs:bookworm-<hash>`` image from debootstrap, built once and reused."""
    packages = _dockerfile_args()["GYRE_APT_PACKAGES"].split()
    key = hashlib.sha256(f"{RECIPE_VERSION} {DEBIAN_SUITE} {packages}".encode()).hexdigest()
    ref = f"{_ROOTFS_REPO}:{DEBIAN_SUITE}-{key[:12]}"
    if not force and _image_labels(client, ref) is not None:
        progress(f"reusing root filesystem image {ref}")
        return ref
    problem = _debootstrap_problem()
    if problem:
        raise ImageBuildError(f"cannot build the offline image: {problem}")
    work = tempfile.mkdtemp(prefix="gyre-rootfs-", dir=os.environ.get("GYRE_BUILD_DIR"))
    rootfs = os.path.join(work, "rootfs")
    try:
        _run_debootstrap(rootfs, mirror, packages, progress)
        progress(f"importing {rootfs} as {ref}")
        changes = [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'CMD ["bash"]',
        ]
        _import_dir(client, rootfs, ref, changes)
    finally:
        _remove_tree(work)
    return ref


def _run_debootstrap(rootfs: str, mirror: str, packages: list[str], progress: Progress) -> None:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gyre" / "debs"
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        f"--keyring={DEBIAN_KEYRING}",
        f"--cache-dir={cache}",
        DEBIAN_SUITE,
        rootfs,
        mirror,
    ]
    progress(f"$ {shlex.join(cmd)}")
    start = time.monotonic()
    tail: list[str] = []
    verb = ""
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        for line in proc.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-30:]
            # One line per phase (Retrieving, Extracting, ...) rather than one per package.
            word = line.split()[1] if line.startswith("I: ") and len(line.split()) > 1 else line
            if word != verb:
                verb = word
                progress(f"  [{time.monotonic() - start:5.1f} s] debootstrap {line}")
    if proc.returncode != 0:
        raise ImageBuildError(
            f"debootstrap failed (exit {proc.returncode}) with mirror {mirror}; last lines:\n"
            + "\n".join(tail)
            + f"\n(full log: {rootfs}/debootstrap/debootstrap.log)"
        )
    progress(f"  debootstrap done in {time.monotonic() - start:.1f} s")


def _import_dir(client, rootfs: str, ref: str, changes: list[str]) -> None:
    """``tar -C rootfs -c . | docker import`` through the Docker API, streamed."""
    cmd = ["tar", "-C", rootfs, "--numeric-owner", "--xattrs"]
    cmd += [f"--exclude={p}" for p in _ROOTFS_EXCLUDES] + ["-cf", "-", "."]
    repo, tag = _split_ref(ref)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tar:
        chunks = iter(lambda: tar.stdout.read(1 << 20), b"")
        try:
            client.api.import_image(
                src=chunks, repository=repo, tag=tag, changes=changes, stream_src=True
            )
        except Exception as e:
            tar.kill()
            raise ImageBuildError(f"docker import of {rootfs} failed: {e}") from e
        err = tar.stderr.read().decode(errors="replace")
    if tar.returncode != 0:
        raise ImageBuildError(f"tar of {rootfs} failed (exit {tar.returncode}): {err[-2000:]}")


def _docker_build(
    client,
    tag: str,
    base: str,
    labels: dict,
    extra: list[str],
    pip_index_url: str | None,
    progress: Progress,
) -> None:
    """``docker build --network host`` of the shipped Dockerfile on ``base``."""
    args = {"BASE": base, "GYRE_EXTRA_PIP": " ".join(extra)}
    if pip_index_url:
        args["PIP_INDEX_URL"] = pip_index_url
    tail: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gyre-build-") as ctx:
        for src in (DOCKERFILE, SETUP_SCRIPT):
            shutil.copy(src, ctx)
        # Host network: the build installs from PyPI, and CI daemons run with --bridge=none.
        stream = client.api.build(
            path=ctx,
            tag=tag,
            buildargs=args,
            labels=labels,
            network_mode="host",
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )
        for chunk in stream:
            for line in str(chunk.get("stream", "")).splitlines():
                if line.strip():
                    tail = (tail + [line])[-30:]
                    progress(f"  build: {line}")
            if "error" in chunk:
                raise ImageBuildError(
                    f"docker build of {tag} on {base} failed: {chunk['error']}\n" + "\n".join(tail)
                )


def _build_host_usr(client, tag: str, labels: dict, progress: Progress) -> None:
    mounts = host_usr_mounts()
    missing = [h for h, _ in mounts if not os.path.exists(h)]
    if missing:
        raise ImageBuildError(f"host-usr needs {missing}, which this host does not have")
    labels = {**labels, LABEL_HOST_MOUNTS: json.dumps(mounts)}
    progress(f"  tiny rootfs + read-only host binds: {' '.join(docker_run_flags(labels))}")
    changes = [f"ENV {k}={v}" for k, v in _host_usr_env().items()]
    changes += ["WORKDIR /workspace", 'CMD ["bash"]']
    changes += [f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()]
    repo, name = _split_ref(tag)
    client.api.import_image(src=_host_usr_tar(), repository=repo, tag=name, changes=changes)


def host_usr_mounts() -> list[tuple[str, str]]:
    """Read-only binds ``(host, container)`` a ``host-usr`` sandbox runs with: ``/usr``, the
    top-level system folders that are not symlinks into it, ``/etc/alternatives`` and
    ``/etc/ld.so.cache`` (they belong to ``/usr``'s contents), and the prefix of the Python
    running gyre when it lives outside ``/usr`` (pyenv, conda, a venv)."""
    mounts = [("/usr", "/usr")]
    for top in _SYSTEM_TOPS:
        if os.path.isdir(f"/{top}") and not os.path.islink(f"/{top}"):
            mounts.append((f"/{top}", f"/{top}"))
    for path in ("/etc/alternatives", "/etc/ld.so.cache"):
        if os.path.exists(path):
            mounts.append((path, path))
    for prefix in dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)):
        if prefix != "/usr" and not prefix.startswith("/usr/"):
            mounts.append((prefix, prefix))
    for host, _ in mounts:
        if re.search(r"[\s:,\"'\\]", host):
            raise ImageBuildError(f"cannot bind {host!r} into a host-usr image: odd characters")
    return mounts


def _host_usr_env() -> dict[str, str]:
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
    if python_bin not in path:
        path.insert(0, python_bin)
    # /usr is read-only: pip installs go to the user site (~/.local), which is writable.
    return {
        "PATH": ":".join(path),
        "LANG": "C.UTF-8",
        "PIP_USER": "1",
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
    }


def _host_usr_tar() -> bytes:
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

        for name, mode, uid in _HOST_USR_DIRS:
            add(name, tarfile.DIRTYPE, mode, uid)
        for top in _SYSTEM_TOPS:
            if os.path.islink(f"/{top}"):
                add(top, tarfile.SYMTYPE, 0o777, link=os.readlink(f"/{top}"))
            elif os.path.isdir(f"/{top}"):
                add(top, tarfile.DIRTYPE)
        for name, text in _HOST_USR_FILES.items():
            add(name, tarfile.REGTYPE, 0o644, data=text.encode())
        for host, inside in host_usr_mounts():  # mount points of every bind
            if inside.startswith("/etc/") or inside == "/usr":
                add(
                    inside.lstrip("/"),
                    tarfile.REGTYPE if os.path.isfile(host) else tarfile.DIRTYPE,
                    0o644 if os.path.isfile(host) else 0o755,
                )
    return buf.getvalue()


def _remove_tree(path: str) -> None:
    """Remove a build folder, first unmounting anything a failed debootstrap left mounted."""
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        mounted = [ln.split()[1] for ln in f if ln.split()[1].startswith(real + "/")]
    for point in sorted(mounted, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    with open("/proc/mounts") as f:
        if any(ln.split()[1].startswith(real + "/") for ln in f):
            print(
                f"gyre: left {path} in place: something is still mounted under it", file=sys.stderr
            )
            return
    shutil.rmtree(path, ignore_errors=True)


def _client():
    """A Docker client with a long timeout: imports and builds take minutes."""
    docker = require("docker", "building sandbox images")
    try:
        client = docker.from_env(timeout=1800)
        client.ping()
    except docker.errors.DockerException as e:
        raise ImageBuildError(f"no Docker daemon answers ({_first_line(e)}); start one") from e
    return client


def _image_labels(client, ref: str) -> dict | None:
    """An image's labels ({} when it has none), or None if there is no such image."""
    docker = require("docker", "building sandbox images")
    try:
        return client.images.get(ref).labels or {}
    except docker.errors.ImageNotFound:
        return None


def _result(client, tag: str, method: str, recipe: str, reused: bool, start: float) -> BuiltImage:
    image = client.images.get(tag)
    return BuiltImage(
        tag=tag,
        image_id=image.id,
        method=method,
        recipe=recipe,
        reused=reused,
        seconds=time.monotonic() - start,
        host_mounts=host_mounts_from_labels(image.labels),
    )


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _split_ref(ref: str) -> tuple[str, str]:
    """``repo[:tag]`` -> (repo, tag), ``latest`` when no tag (a registry port is not a tag)."""
    repo, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return repo, tag


def add_images_commands(sub) -> None:
    """Add ``gyre images build`` and ``gyre images show`` to the ``gyre`` parser."""
    images = sub.add_parser("images", help="build and inspect sandbox images")
    isub = images.add_subparsers(dest="images_command", required=True)
    build = isub.add_parser(
        "build",
        help="build the base sandbox image (reused when its recipe is current)",
        description=__doc__,
        formatter_class=_raw_help(),
    )
    build.add_argument("--method", choices=METHODS, default="auto", help="default: auto")
    build.add_argument("--tag", default=DEFAULT_TAG, help=f"default: {DEFAULT_TAG}")
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    build.add_argument(
        "--extra", action="append", default=[], metavar="REQ", help="extra pip requirement"
    )
    build.add_argument("--mirror", help="Debian mirror for debootstrap (default: apt's)")
    build.add_argument("--pip-index-url", help="package index for the build (default: PyPI)")
    build.set_defaults(func=_cmd_build)
    show = isub.add_parser("show", help="an image's method, recipe and docker run flags")
    show.add_argument("--tag", default=DEFAULT_TAG, help=f"default: {DEFAULT_TAG}")
    show.set_defaults(func=_cmd_show)


def _raw_help():
    import argparse

    return argparse.RawDescriptionHelpFormatter


def _cmd_build(args) -> int:
    try:
        build_base_image(
            args.tag,
            method=args.method,
            extra_requirements=args.extra,
            force=args.force,
            mirror=args.mirror,
            pip_index_url=args.pip_index_url,
        )
    except (ImageBuildError, ValueError) as e:
        print(f"gyre images build: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_show(args) -> int:
    labels = _image_labels(_client(), args.tag)
    if labels is None:
        print(f"no image {args.tag}; build it with `gyre images build`", file=sys.stderr)
        return 1
    method = labels.get(LABEL_METHOD, "?")
    recipe = labels.get(LABEL_RECIPE, "?")
    current = method in METHODS[1:] and recipe == recipe_hash(method)
    state = "the current default recipe" if current else "not the default recipe: stale or --extra"
    print(f"{args.tag}: method {method}, recipe {recipe} ({state})")
    print("docker run flags:", shlex.join(docker_run_flags(labels)) or "(none)")
    return 0
