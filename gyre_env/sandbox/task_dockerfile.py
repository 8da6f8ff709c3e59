"""Task images built from a task's own Dockerfile (Harbor / terminal-bench), offline.

``build_dockerfile_image(task)`` builds ``task.image`` from ``task.dockerfile`` with its
folder as the build context and ``--network none``: no registry and no package index are
reached. Before anything runs, ``offline_problems`` reads the Dockerfile and names each
line that cannot work here: a ``FROM`` of an image this daemon does not have (nothing is
pulled), a ``RUN`` that installs from the network (``apt-get install``, ``pip install``
without ``--no-index``, ``curl``, ``git clone``, ...) or an ``ADD`` of a URL. A build that
still fails names the Dockerfile line whose command failed.

On top of the task's image a last layer makes it a Gyre sandbox image: the files of its
``WORKDIR`` (``/app``) move to ``/workspace`` and the WORKDIR becomes a link to
``gyre_env.tasks.harbor.WORKDIR_LINK``, which each sandbox points at its own workspace;
the grader's ``python3 -c "import pytest"`` must work (base such images on
``gyre-base:latest``). The image is labelled with a hash of the build context and of
the ``FROM`` images' ids, and reused while that is current.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gyre_env.sandbox.images import (
    ImageBuildError,
    _image,
    _split_ref,
    docker_build,
    staged_build,
)

RECIPE_VERSION = "1"
WORKDIR_LINK = "/tmp/gyre-workdir"  # gyre_env.tasks.harbor.WORKDIR_LINK (tasks is data)

_NETWORK_RUN = [
    (
        re.compile(
            r"\b(apt-get|apt|aptitude|apk|yum|dnf|microdnf|zypper)\b[^;&|]*\b"
            r"(install|update|upgrade|add|dist-upgrade)\b"
        ),
        "installs system packages",
    ),
    (
        re.compile(r"\bpip[0-9.]*\s+(install|download|wheel)\b(?![^;&|]*--no-index)"),
        "installs Python packages from an index",
    ),
    (
        re.compile(r"\buv\s+(pip\s+install|sync|add|tool\s+install|python\s+install)\b|\buvx\b"),
        "installs with uv",
    ),
    (re.compile(r"\b(curl|wget)\b"), "downloads"),
    (re.compile(r"\bgit\s+(clone|fetch|pull|submodule)\b"), "fetches a git repository"),
    (re.compile(r"\b(npm|yarn|pnpm)\s+(install|i|add|ci)\b"), "installs npm packages"),
    (
        re.compile(r"\b(conda|mamba|micromamba)\s+(install|create|update)\b"),
        "installs conda packages",
    ),
    (
        re.compile(r"\bgo\s+(get|install|mod\s+download)\b|\bcargo\s+(install|fetch)\b"),
        "fetches modules",
    ),
]


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    line: int
    """1-based line number where it starts."""
    keyword: str
    args: str

    def where(self, path: Path) -> str:
        return f"{path}:{self.line}: `{self.keyword} {self.args}`"


def parse_dockerfile(path: Path) -> list[Instruction]:
    """The instructions of a Dockerfile (comments and blank lines dropped)."""
    out: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        start = start if pending else number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        keyword, _, args = text.partition(" ")
        out.append(Instruction(start, keyword.upper(), " ".join(args.split())))
    if pending:
        keyword, _, args = pending.strip().partition(" ")
        out.append(Instruction(start, keyword.upper(), " ".join(args.split())))
    return out


def from_images(instructions: list[Instruction]) -> list[tuple[Instruction, str]]:
    """``(FROM instruction, image)`` for every FROM that names an image (not an earlier
    stage), with ``ARG`` defaults before the first FROM substituted."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    out = []
    for ins in instructions:
        if ins.keyword == "ARG" and not stages and not out:
            name, _, default = ins.args.partition("=")
            args[name.strip()] = default.strip().strip("\"'")
        if ins.keyword != "FROM":
            continue
        words = [w for w in ins.args.split() if not w.startswith("--")]
        if not words:
            continue
        ref = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
        if len(words) >= 3 and words[1].lower() == "as":
            stages.add(words[2].lower())
        if ref.lower() not in stages and ref != "scratch":
            out.append((ins, ref))
    return out


def offline_problems(dockerfile: Path, client) -> list[str]:
    """Why this Dockerfile cannot be built here with no network, one line each, naming
    the Dockerfile line; empty when nothing is seen."""
    instructions = parse_dockerfile(dockerfile)
    problems = []
    for ins, ref in from_images(instructions):
        if _image(client, ref) is None:
            problems.append(
                f"{ins.where(dockerfile)}: no image {ref!r} on this Docker daemon, and "
                "images are built offline (nothing is pulled); build or load it first, or "
                "base the task on gyre-base:latest"
            )
    for ins in instructions:
        if ins.keyword == "RUN":
            for pattern, what in _NETWORK_RUN:
                if pattern.search(ins.args):
                    problems.append(
                        f"{ins.where(dockerfile)}: {what}, which needs the network; images "
                        "are built with --network none (put the files in the build context "
                        "or in the base image)"
                    )
                    break
        elif ins.keyword == "ADD" and re.search(r"(^|\s)(https?|ftp)://", ins.args):
            problems.append(f"{ins.where(dockerfile)}: downloads a URL; images are built offline")
    if not any(i.keyword == "FROM" for i in instructions):
        problems.append(f"{dockerfile}: no FROM instruction")
    return problems


def recipe(dockerfile: Path, client) -> str:
    """A hash of the build context's files and of the FROM images' ids."""
    h = hashlib.sha256(RECIPE_VERSION.encode())
    context = dockerfile.parent
    for f in sorted(context.rglob("*")):
        if f.is_file():
            h.update(f"{f.relative_to(context).as_posix()}\0".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    for _, ref in from_images(parse_dockerfile(dockerfile)):
        image = _image(client, ref)
        h.update((image.id if image is not None else ref).encode())
    return h.hexdigest()[:16]


_GYRE_LAYER = """\
FROM {staging}
USER root
RUN set -e; w={workdir}; mkdir -p /workspace; \\
    if [ -n "$w" ] && [ "$w" != / ] && [ "$w" != /workspace ]; then \\
        if [ -d "$w" ] && [ ! -L "$w" ]; then cp -a "$w"/. /workspace/ && rm -rf "$w"; fi; \\
        mkdir -p "$(dirname "$w")" && ln -sfn {link} "$w"; \\
    fi; \\
    if id gyre >/dev/null 2>&1; then chown -R gyre:gyre /workspace; fi; \\
    command -v python3 >/dev/null && python3 -c "import pytest" \\
    || {{ echo "gyre: the task image has no python3 with pytest (the grader needs it); \
base the Dockerfile on gyre-base:latest" >&2; exit 1; }}
WORKDIR /workspace
"""


def build_dockerfile_image(task, client, labels: dict, progress=None) -> None:
    """Build ``task.image`` from ``task.dockerfile`` offline (see the module docstring);
    raise ``ImageBuildError`` naming the Dockerfile line that cannot be built."""
    dockerfile = Path(task.dockerfile)
    problems = offline_problems(dockerfile, client)
    if problems:
        raise ImageBuildError(
            f"task {task.id!r}: its Dockerfile cannot be built offline:\n" + "\n".join(problems)
        )
    from gyre_env.sandbox.task_images import _build

    repo, _ = _split_ref(task.image)
    staging = f"{repo}:gyre-staging-task-{labels['gyre.task.recipe']}"
    with staged_build(client, staging, task.image):
        try:
            docker_build(
                client,
                str(dockerfile.parent),
                staging,
                {},
                "none",
                progress,
                dockerfile=dockerfile.name,
            )
        except ImageBuildError as e:
            raise ImageBuildError(_name_failed_line(str(e), dockerfile)) from e
        workdir = client.images.get(staging).attrs.get("Config", {}).get("WorkingDir") or ""
        with tempfile.TemporaryDirectory(prefix="gyre-task-layer-") as ctx:
            layer = _GYRE_LAYER.format(
                staging=staging, workdir=shlex.quote(workdir), link=WORKDIR_LINK
            )
            (Path(ctx) / "Dockerfile").write_text(layer)
            _build(client, ctx, task.image, labels)  # tagged only once it built


def _name_failed_line(message: str, dockerfile: Path) -> str:
    """Add the Dockerfile line of the RUN whose command the build error quotes."""
    m = re.search(r"The command '(?:/bin/sh -c )?(.*?)' returned a non-zero code", message)
    if m is None:
        m = re.search(r"process \"/bin/sh -c (.*?)\" did not complete", message)
    if m is not None:
        failed = " ".join(m.group(1).split())
        for ins in parse_dockerfile(dockerfile):
            if ins.keyword == "RUN" and (failed in ins.args or ins.args in failed):
                return f"{ins.where(dockerfile)} failed:\n{message}"
    return message
