"""Building Gyre's base sandbox image, with a registry or without one.

``gyre images build`` makes the image that DockerSandbox starts (``gyre-base:latest``): Python
3.11, pytest, ruff, and setuptools + wheel so a task's workspace package installs with
``pip install --no-build-isolation -e .`` and no network. Three ways to get it:

- ``dockerfile``: ``docker build`` of the shipped ``Dockerfile`` on ``python:3.11-slim``.
  Needs a reachable registry.
- ``debootstrap``: a Debian bookworm root filesystem made locally with ``debootstrap`` from
  the host's apt mirror; the Dockerfile's setup script runs in it under ``chroot`` and
  installs wheels the host's own pip downloaded (so the host's index, proxy and CA settings
  apply and the chroot needs no network); the result is imported as one layer (``docker
  import``) with the Dockerfile's ENV/WORKDIR/CMD. Needs root, ``debootstrap``, a Debian
  mirror and a package index; no registry. Self-contained and portable. 75-95 s here.
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
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gyre_env._optional import require
from gyre_env.sandbox import debian, hostusr

DEFAULT_TAG = "gyre-base:latest"
METHODS = ("auto", "dockerfile", "debootstrap", "host-usr")
LABEL_METHOD = "gyre.image.method"
LABEL_RECIPE = "gyre.image.recipe"
LABEL_HOST_MOUNTS = "gyre.host_mounts"
RECIPE_VERSION = "1"  # bump when this module changes what goes into an image
DOCKERFILE = Path(__file__).with_name("Dockerfile")
SETUP_SCRIPT = Path(__file__).with_name("gyre-image-setup.sh")
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
    "python -c 'import pytest, setuptools, wheel' && ruff --version >/dev/null"
    ' && test "$(echo Z3lyZQ== | base64 -d)" = gyre && ps -p 1 >/dev/null'
    " && tar --version >/dev/null && command -v kill >/dev/null && echo gyre-image-ok"
)

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
    old = _image(client, tag)
    existing = (old.labels or {}) if old is not None else {}
    known = method if method != "auto" else existing.get(LABEL_METHOD, "")
    if known in METHODS[1:] and not force:
        recipe = recipe_hash(known, extra)
        if existing.get(LABEL_RECIPE) == recipe:
            progress(f"{tag}: up to date ({known}, recipe {recipe}); --force rebuilds")
            return _result(client, tag, known, recipe, True, start)
    if method == "auto":
        method = choose_method(client, progress)
    recipe = recipe_hash(method, extra)
    labels = {LABEL_METHOD: method, LABEL_RECIPE: recipe}
    # Built under a staging name and tagged only once its tools check out, so a failed
    # build never replaces a working image.
    repo, name = _split_ref(tag)
    staging = f"{repo}:gyre-staging-{recipe}"
    progress(f"{tag}: building with method {method} (recipe {recipe})")
    if method == "host-usr":
        _build_host_usr(client, staging, labels, progress)
    elif method == "debootstrap":
        mirror = mirror or debian.debian_mirror()
        _build_debootstrap(client, staging, labels, extra, mirror, pip_index_url, progress)
    else:
        _docker_build(client, staging, labels, extra, pip_index_url, progress)
    progress(f"{tag}: checking the tools inside (network none)")
    try:
        smoke_check(staging)
        client.images.get(staging).tag(repo, name)
    finally:
        _remove_quietly(client, staging)
    result = _result(client, tag, method, recipe, False, start)
    if old is not None and old.id != result.image_id:
        _remove_quietly(client, old.id)  # the image this one replaced, unless still in use
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
    problem = debian.problem()
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
        parts += [
            json.dumps(hostusr.mounts()),
            json.dumps(hostusr.image_env()),
            hostusr.LAYOUT_VERSION,
        ]
    else:
        parts += [_without_comments(DOCKERFILE), _without_comments(SETUP_SCRIPT)]
    if method == "debootstrap":
        parts.append(debian.SUITE)
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def _without_comments(path: Path) -> str:
    """A recipe file minus comment and blank lines: editing a comment does not rebuild."""
    lines = (ln.strip() for ln in path.read_text().splitlines())
    return "\n".join(ln for ln in lines if ln and not ln.startswith("#"))


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
    """The ``docker run`` flags an image needs beyond the usual ones, as ``DockerSandbox``
    applies them: its read-only ``-v`` binds, then an empty read-only ``--tmpfs`` over
    every folder of task data under them on this host (``hostusr.masks``; ``ValueError``
    when a bind cannot be made without showing task data)."""
    binds = host_mounts_from_labels(labels)
    flags = [f for host, inside in binds for f in ("-v", f"{host}:{inside}:ro")]
    return flags + [
        f for path in hostusr.masks(binds) for f in ("--tmpfs", f"{path}:{hostusr.MASK_OPTIONS}")
    ]


def smoke_check(tag: str) -> str:
    """Run the tools a task relies on inside ``tag`` with no network; raise if one fails."""
    client = _client()
    labels = _image_labels(client, tag)
    if labels is None:
        raise ImageBuildError(f"no image {tag}; build it with `gyre images build`")
    volumes = {h: {"bind": c, "mode": "ro"} for h, c in host_mounts_from_labels(labels)}
    container = client.containers.create(
        tag, ["bash", "-c", _SMOKE_CHECK], network_mode="none", volumes=volumes
    )
    try:
        container.start()
        status = container.wait(timeout=300).get("StatusCode")
        out = container.logs(stdout=True, stderr=True).decode(errors="replace")
    except Exception as e:
        raise ImageBuildError(f"image {tag} lacks a tool Gyre needs (bash?): {e}") from e
    finally:
        container.remove(force=True)
    if status != 0 or "gyre-image-ok" not in out:
        raise ImageBuildError(f"image {tag} lacks a tool Gyre needs (exit {status}): {out[-2000:]}")
    return out


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


def _build_debootstrap(client, tag, labels, extra, mirror, pip_index_url, progress) -> None:
    """debootstrap a rootfs, run the setup script in it (chroot, no network: pip installs
    from wheels the host downloaded with its own pip config), import it as one layer."""
    problem = debian.problem()
    if problem:
        raise ImageBuildError(f"cannot build the offline image: {problem}")
    args = _dockerfile_args()
    work = tempfile.mkdtemp(prefix="gyre-rootfs-", dir=os.environ.get("GYRE_BUILD_DIR"))
    rootfs = os.path.join(work, "rootfs")
    try:
        debian.run_debootstrap(rootfs, mirror, args["GYRE_APT_PACKAGES"].split(), progress)
        wheels = os.path.join(rootfs, "tmp", "gyre-wheels")
        reqs = args["GYRE_PIP_REQUIREMENTS"].split() + extra
        debian.download_wheels(wheels, reqs, pip_index_url, progress)
        env = {k: args[k] for k in ("GYRE_APT_PACKAGES", "GYRE_PIP_REQUIREMENTS")}
        env.update(GYRE_WHEELS="/tmp/gyre-wheels", GYRE_EXTRA_PIP=" ".join(extra))
        debian.run_setup(rootfs, SETUP_SCRIPT, env, progress)
        changes = [f"ENV PATH={debian.DEFAULT_PATH}", *_dockerfile_runtime_changes()]
        changes += [f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()]
        progress(f"  importing {rootfs} as {tag}")
        _import_dir(client, rootfs, tag, changes)
    except debian.RootfsError as e:
        raise ImageBuildError(str(e)) from e
    finally:
        debian.remove_tree(work)


def _dockerfile_runtime_changes() -> list[str]:
    """The Dockerfile's ENV, WORKDIR, USER and CMD instructions (continuation lines joined),
    applied by ``docker import --change`` so both methods give the same runtime settings."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    keep = ("ENV ", "WORKDIR ", "USER ", "CMD ")
    return [line.strip() for line in text.splitlines() if line.strip().startswith(keep)]


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
    labels: dict,
    extra: list[str],
    pip_index_url: str | None,
    progress: Progress,
    base: str | None = None,
) -> None:
    """``docker build --network host`` of the shipped Dockerfile (on ``base`` if given)."""
    args = {"GYRE_EXTRA_PIP": " ".join(extra)}
    if base:
        args["BASE"] = base
    if pip_index_url:
        args["PIP_INDEX_URL"] = pip_index_url
    with tempfile.TemporaryDirectory(prefix="gyre-build-") as ctx:
        for src in (DOCKERFILE, SETUP_SCRIPT):
            shutil.copy(src, ctx)
        # Host network: the build installs from PyPI, and CI daemons run with --bridge=none.
        docker_build(client, ctx, tag, labels, "host", progress, buildargs=args)


def docker_build(
    client, ctx: str, tag: str, labels: dict, network: str, progress: Progress | None, **kw
) -> None:
    """``docker build`` of the folder ``ctx`` as ``tag``; each output line goes to
    ``progress`` (if any) and a failure raises ``ImageBuildError`` with the output's tail."""
    tail: list[str] = []
    stream = client.api.build(
        path=ctx,
        tag=tag,
        labels=labels,
        network_mode=network,
        rm=True,
        forcerm=True,
        pull=False,
        decode=True,
        **kw,
    )
    for chunk in stream:
        for line in str(chunk.get("stream", "")).splitlines():
            if line.strip():
                tail = (tail + [line])[-30:]
                if progress is not None:
                    progress(f"  build: {line}")
        if "error" in chunk:
            raise ImageBuildError(
                f"docker build of {tag} failed: {chunk['error']}\n" + "\n".join(tail[-15:])
            )


def _build_host_usr(client, tag: str, labels: dict, progress: Progress) -> None:
    mounts = hostusr.mounts()
    missing = [h for h, _ in mounts if not os.path.exists(h)]
    if missing:
        raise ImageBuildError(f"host-usr needs {missing}, which this host does not have")
    labels = {**labels, LABEL_HOST_MOUNTS: json.dumps(mounts)}
    progress(f"  tiny rootfs + read-only host binds: {' '.join(docker_run_flags(labels))}")
    changes = [f"ENV {k}={v}" for k, v in hostusr.image_env().items()]
    changes += ["WORKDIR /workspace", 'CMD ["bash"]']
    changes += [f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()]
    repo, name = _split_ref(tag)
    client.api.import_image(src=hostusr.rootfs_tar(), repository=repo, tag=name, changes=changes)


def _client():
    """A Docker client with a long timeout: imports and builds take minutes."""
    docker = require("docker", "building sandbox images")
    try:
        client = docker.from_env(timeout=1800)
        client.ping()
    except docker.errors.DockerException as e:
        raise ImageBuildError(f"no Docker daemon answers ({_first_line(e)}); start one") from e
    return client


def _image(client, ref: str):
    """The image named ``ref``, or None."""
    docker = require("docker", "building sandbox images")
    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


@contextmanager
def staged_build(client, staging: str, tag: str):
    """Around building ``tag`` under the ``staging`` name: the Docker API's own errors
    become an ``ImageBuildError`` naming ``tag``, and the staging name is removed after,
    whatever happened."""
    try:
        yield
    except ImageBuildError:
        raise
    except Exception as e:  # the Docker API's own errors
        raise ImageBuildError(f"docker build of {tag} failed: {_first_line(e)}") from e
    finally:
        _remove_quietly(client, staging)


def _remove_quietly(client, image_id: str) -> None:
    """Remove an image (or untag a name) unless Docker refuses because it is in use."""
    docker = require("docker", "building sandbox images")
    try:
        client.images.remove(image_id)
    except docker.errors.APIError:
        pass  # tagged elsewhere or used by a container: leave it


def _image_labels(client, ref: str) -> dict | None:
    """An image's labels ({} when it has none), or None if there is no such image."""
    image = _image(client, ref)
    return None if image is None else (image.labels or {})


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
    suite = build.add_argument_group(
        "task images", "with --suite: the base image, then every loaded task's own image"
    )
    suite.add_argument("--suite", help="a task suite (nl2repo, a folder, ...): build its images")
    from gyre_env.tasks.cli import add_option_arg

    add_option_arg(suite)
    suite.add_argument("--task", action="append", default=[], help="only this task (repeatable)")
    suite.add_argument("--jobs", type=int, default=2, help="task images built at once (default 2)")
    build.set_defaults(func=_cmd_build, tier=None)
    show = isub.add_parser("show", help="an image's method, recipe and docker run flags")
    show.add_argument("--tag", default=DEFAULT_TAG, help=f"default: {DEFAULT_TAG}")
    show.set_defaults(func=_cmd_show)


def _raw_help():
    import argparse

    return argparse.RawDescriptionHelpFormatter


def _cmd_build(args) -> int:
    if args.suite is None and (args.option or args.task):
        print("gyre images build: -o/--task need --suite", file=sys.stderr)
        return 2
    tasks = None
    if args.suite is not None:  # bad suite options fail here, before any build
        from gyre_env.tasks.cli import load_tasks_from_args

        tasks = load_tasks_from_args(args, prog="gyre images build")
    try:
        build_base_image(
            args.tag,
            method=args.method,
            extra_requirements=args.extra,
            force=args.force,
            mirror=args.mirror,
            pip_index_url=args.pip_index_url,
        )
    except (ImageBuildError, ValueError, ImportError) as e:
        print(f"gyre images build: {e}", file=sys.stderr)
        return 1
    return 0 if tasks is None else _build_suite(args, tasks)


def _build_suite(args, tasks) -> int:
    from gyre_env.sandbox.task_images import build_task_images

    print(f"{len(tasks)} task(s) of suite {args.suite}; building their images on {args.tag}")
    try:
        results = build_task_images(
            tasks, base=args.tag, jobs=args.jobs, force=args.force, pip_index_url=args.pip_index_url
        )
    except ImageBuildError as e:
        print(f"gyre images build: {e}", file=sys.stderr)
        return 1
    failed = [r.task_id for r in results if not r.ok]
    counts = {s: sum(r.status == s for r in results) for s in ("built", "up to date", "base")}
    print(
        f"task images: {counts['built']} built, {counts['up to date']} up to date, "
        f"{counts['base']} on the base image, {len(failed)} failed"
        + (f": {' '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


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
    try:
        flags = shlex.join(docker_run_flags(labels)) or "(none)"
    except ValueError as e:  # a bind that would show task data: sandboxes refuse it too
        print(f"{args.tag}: {e}", file=sys.stderr)
        return 1
    print("docker run flags:", flags)
    return 0
