"""Task images: a task's requirements installed on top of the base image, offline.

Episodes have no network, so whatever a task's tests import is installed into the task's
own image (``Task.image``, e.g. ``gyre-nl2repo-jsonlines:latest``) when it is built:

    gyre images build --suite nl2repo -o checkout=PATH -o tests=PATH [--task ID ...]

For each task the host's pip resolves ``Task.requirements`` on their own and builds wheels
of all of them (``pip wheel``: the host's index, proxy and CA settings apply); a
``docker build --network none`` then installs those wheels into ``FROM <base image>``
with ``--no-index``. The task's pins win in the task's environment: a task pinning
``pytest==8.4.1`` replaces the base image's pytest in its own image instead of colliding
with it. The grader needs nothing newer (its launcher and JUnit parsing work with the
pytest the task brings), and it stays as tamper-proof as on the base image: everything
it imports comes from the image, never from the workspace.

An image is reused when its ``gyre.task.recipe`` label (a hash of the base image's id and
the requirements) is current, so a second run only checks. Tasks that run on the base
image itself (no requirements, ``image`` = the base tag) need nothing built.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gyre_env.sandbox.images import (
    DEFAULT_TAG,
    LABEL_HOST_MOUNTS,
    ImageBuildError,
    _client,
    _first_line,
    _image,
    _remove_quietly,
    _split_ref,
    docker_build,
    staged_build,
)

LABEL_TASK_RECIPE = "gyre.task.recipe"
LABEL_TASK_ID = "gyre.task.id"
TASK_RECIPE_VERSION = "1"  # bump when this module changes what goes into a task image
PIP_TIMEOUT_S = 1800.0

_DOCKERFILE = """\
FROM {base}
COPY wheels /tmp/gyre-wheels
COPY requirements.txt /tmp/gyre-requirements.txt
RUN python3 -m pip install --no-cache-dir --disable-pip-version-check \\
        --root-user-action=ignore --no-index --find-links /tmp/gyre-wheels \\
        -r /tmp/gyre-requirements.txt \\
    && rm -rf /tmp/gyre-wheels /tmp/gyre-requirements.txt /root/.cache \\
    && python3 -c "import pytest"
"""

Progress = Callable[[str], None]


@dataclass(kw_only=True)
class TaskImage:
    """What building one task's image did."""

    task_id: str
    tag: str
    status: str
    """``built``, ``up to date``, ``base`` (the task runs on the base image) or ``failed``."""
    seconds: float
    requirements: int
    message: str = ""
    """Why it failed (the failing step and its output's tail); empty otherwise."""

    @property
    def ok(self) -> bool:
        return self.status != "failed"


def task_recipe(base_id: str, requirements: Sequence[str]) -> str:
    """The content hash a task image is labelled with (``gyre.task.recipe``)."""
    h = hashlib.sha256(TASK_RECIPE_VERSION.encode())
    h.update(base_id.encode())
    h.update(json.dumps(list(requirements)).encode())
    return h.hexdigest()[:16]


def build_task_image(
    task,
    *,
    base: str = DEFAULT_TAG,
    force: bool = False,
    pip_index_url: str | None = None,
    progress: Progress = print,
    client=None,
) -> TaskImage:
    """Build ``task.image`` from ``base`` plus ``task.requirements`` (or reuse it)."""
    start = time.monotonic()
    reqs = list(task.requirements)

    def result(status: str, message: str = "") -> TaskImage:
        return TaskImage(
            task_id=task.id,
            tag=task.image,
            status=status,
            seconds=time.monotonic() - start,
            requirements=len(reqs),
            message=message,
        )

    if getattr(task, "dockerfile", None) is not None:
        return _from_dockerfile(task, client or _client(), force, result, progress)
    if task.image == base and not reqs:
        return result("base")
    if task.image == base:
        return result(
            "failed",
            f"task {task.id!r} has requirements but its image is the base image {base}; give "
            "it an image of its own (Task.image) so they can be installed there",
        )
    client = client or _client()
    base_image = _image(client, base)
    if base_image is None:
        raise ImageBuildError(f"no base image {base}; build it first with `gyre images build`")
    if LABEL_HOST_MOUNTS in (base_image.labels or {}):
        raise ImageBuildError(
            f"{base} is a host-usr image (the host's Python): install task requirements in the "
            "host Python, or build the base with --method debootstrap or dockerfile"
        )
    recipe = task_recipe(base_image.id, reqs)
    old = _image(client, task.image)
    if old is not None and not force and (old.labels or {}).get(LABEL_TASK_RECIPE) == recipe:
        return result("up to date")
    try:
        with tempfile.TemporaryDirectory(prefix="gyre-task-image-") as ctx:
            _fetch_wheels(Path(ctx), reqs, pip_index_url)
            (Path(ctx) / "Dockerfile").write_text(_DOCKERFILE.format(base=base))
            labels = {LABEL_TASK_RECIPE: recipe, LABEL_TASK_ID: task.id}
            _build(client, ctx, task.image, labels)
    except ImageBuildError as e:
        return result("failed", str(e))
    if old is not None and old.id != client.images.get(task.image).id:
        _remove_quietly(client, old.id)
    return result("built")


def _from_dockerfile(task, client, force: bool, result, progress) -> TaskImage:
    """A task image from the task's own Dockerfile (``task_dockerfile``), or reused."""
    from gyre_env.sandbox.task_dockerfile import build_dockerfile_image, recipe

    current = recipe(task.dockerfile, client)
    old = _image(client, task.image)
    if old is not None and not force and (old.labels or {}).get(LABEL_TASK_RECIPE) == current:
        return result("up to date")
    try:
        labels = {LABEL_TASK_RECIPE: current, LABEL_TASK_ID: task.id}
        build_dockerfile_image(task, client, labels)
    except ImageBuildError as e:
        return result("failed", str(e))
    if old is not None and old.id != client.images.get(task.image).id:
        _remove_quietly(client, old.id)
    return result("built")


def _fetch_wheels(ctx: Path, reqs: list[str], index: str | None) -> None:
    """Wheels of ``reqs`` and everything they need, resolved on their own, under ctx/wheels.

    Built by the host's Python, so compiled wheels fit the image only when both are the
    same Python version (``check_python`` says so before any build)."""
    (ctx / "wheels").mkdir()
    (ctx / "requirements.txt").write_text("".join(f"{r}\n" for r in reqs))
    if not reqs:
        return
    cmd = [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q"]
    cmd += ["--wheel-dir", str(ctx / "wheels"), "-r", str(ctx / "requirements.txt")]
    if index:
        cmd += ["--index-url", index]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise ImageBuildError(f"pip wheel timed out after {PIP_TIMEOUT_S:.0f} s") from e
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
        raise ImageBuildError(f"pip could not resolve or build the requirements {reqs}:\n{tail}")


def _build(client, ctx: str, tag: str, labels: dict) -> None:
    """``docker build --network none`` under a staging name, tagged only once it worked."""
    repo, name = _split_ref(tag)
    staging = f"{repo}:gyre-staging-{labels[LABEL_TASK_RECIPE]}"
    with staged_build(client, staging, tag):
        docker_build(client, ctx, staging, labels, "none", None)
        client.images.get(staging).tag(repo, name)


def build_task_images(
    tasks: Sequence,
    *,
    base: str = DEFAULT_TAG,
    jobs: int = 2,
    force: bool = False,
    pip_index_url: str | None = None,
    progress: Progress = print,
) -> list[TaskImage]:
    """Build the images of ``tasks`` (one per distinct image), ``jobs`` at a time, with a
    progress line per task; failures are reported, not raised, so one bad task does not
    stop the others."""
    client = _client()
    if any(t.requirements and getattr(t, "dockerfile", None) is None for t in tasks):
        check_python(client, base)
    by_image: dict[str, object] = {}
    for task in tasks:
        by_image.setdefault(task.image, task)
    todo = list(by_image.values())
    done, lock = 0, threading.Lock()

    def one(task) -> TaskImage:
        nonlocal done
        try:
            r = build_task_image(
                task, base=base, force=force, pip_index_url=pip_index_url, client=client
            )
        except ImageBuildError as e:
            r = TaskImage(
                task_id=task.id,
                tag=task.image,
                status="failed",
                seconds=0.0,
                requirements=len(task.requirements),
                message=str(e),
            )
        with lock:
            done += 1
            line = f"[{done}/{len(todo)}] {r.task_id}: {r.status}"
        if r.status in ("built", "up to date"):
            line += f" ({r.tag}, {r.requirements} requirements, {r.seconds:.1f} s)"
        if r.message:
            line += f"\n    {r.message.replace(chr(10), chr(10) + '    ')}"
        progress(line)
        return r

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(one, todo))


def check_python(client, base: str) -> None:
    """Raise unless the host's Python is the base image's (the wheels are built here)."""
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        out = client.containers.run(
            base,
            ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            network_mode="none",
            remove=True,
        )
    except Exception as e:
        raise ImageBuildError(f"cannot run python3 in {base}: {_first_line(e)}") from e
    image = out.decode().strip()
    if image != host:
        raise ImageBuildError(
            f"{base} has Python {image} but gyre runs on Python {host}: task wheels are built "
            f"by this Python, so run `gyre images build --suite ...` from a Python {image}"
        )


def build_command(suite: str, suite_kwargs: Mapping, task_id: str | None = None) -> str:
    """The ``gyre images build --suite ...`` command that builds a suite's images."""
    parts = ["gyre", "images", "build", "--suite", str(suite)]
    for key, value in suite_kwargs.items():
        if isinstance(value, (str, Path, int, float, bool)):
            parts += ["-o", f"{key}={value}"]
    if task_id is not None:
        parts += ["--task", task_id]
    return shlex.join(parts)
