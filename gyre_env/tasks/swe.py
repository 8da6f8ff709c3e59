"""SWE-style tasks: a repository at a base commit, an issue, and the tests that decide.

A task is a folder (or a ``.tar.gz``/``.tgz``/``.tar`` archive of one), with nothing
fetched at run time::

    instance.json     the SWE-bench instance fields Gyre reads (others are ignored):
                      instance_id, problem_statement (or issue.md), FAIL_TO_PASS,
                      PASS_TO_PASS (lists of pytest node ids, or JSON strings of them, as
                      the dataset ships them), base_commit (optional), patch and
                      test_patch (optional; or the files below), requirements (optional
                      pip lines installed into the task's own image when it is built)
    issue.md          the issue text, when instance.json has no problem_statement
    repo/ | repo.tar.gz   the repository at its base commit (a ``.git`` folder, when
                      present, must be at ``base_commit``)
    gold.patch        optional reference change (unified diff, ``-p1``); default ``patch``
    test.patch        optional change to the tests; default ``test_patch``

The agent's workspace starts as the repository; its spec is the issue. The hidden tests
are the test files the node ids name (and every ``conftest.py`` above them), taken from
the repository with the test patch applied, so the agent cannot change what decides.
Grading runs the named node ids with pytest; the score is ``passed(FAIL_TO_PASS) /
(len(FAIL_TO_PASS) + failed(PASS_TO_PASS))`` (``Task.fail_to_pass``): the unchanged
repository scores 0, the gold change 1, and each PASS_TO_PASS regression is a failure.
Patches are applied on the host with ``patch -p1`` into a cache folder named by a digest
of the inputs; ``git`` is only asked for the commit of a ``.git`` checkout.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from gyre_env.tasks.archive import publish, safe_extract
from gyre_env.tasks.task import Task, TaskFormatError, list_files

EXAMPLES = Path(__file__).resolve().parent / "swe_examples"
"""SWE-style tasks shipped with Gyre (``load_suite("swe")``)."""
_ARCHIVES = (".tar.gz", ".tgz", ".tar")


def is_swe_task(folder: Path) -> bool:
    """Whether ``folder`` looks like an SWE-style task (it holds ``instance.json``)."""
    return (folder / "instance.json").is_file()


def load_swe_suite(
    path: str | Path = EXAMPLES,
    *,
    cache_dir: str | Path | None = None,
    image: str = "gyre-base:latest",
) -> list[Task]:
    """Every SWE-style task under ``path`` (task folders or archives), or ``path`` itself."""
    root = Path(path).expanduser()
    if root.is_file() or is_swe_task(root):
        return [load_swe_task(root, cache_dir=cache_dir, image=image)]
    if not root.is_dir():
        raise TaskFormatError(f"{root}: no such folder or archive of SWE-style tasks")
    entries = [
        p
        for p in sorted(root.iterdir())
        if is_swe_task(p) or (p.is_file() and p.name.endswith(_ARCHIVES))
    ]
    if not entries:
        raise TaskFormatError(f"{root}: no SWE-style tasks (folders with instance.json)")
    return [load_swe_task(p, cache_dir=cache_dir, image=image) for p in entries]


def load_swe_task(
    path: str | Path, *, cache_dir: str | Path | None = None, image: str = "gyre-base:latest"
) -> Task:
    """One SWE-style task from a folder or an archive of one (see the module docstring)."""
    src = Path(path).expanduser().resolve()
    cache = Path(cache_dir or Path.home() / ".cache" / "gyre" / "swe").expanduser()
    if src.is_file():
        src = _unpacked(src, cache / "archives")
    if not src.is_dir():
        raise TaskFormatError(f"{src}: not a folder or task archive")
    if not is_swe_task(src):
        raise TaskFormatError(f"{src}: missing instance.json (an SWE-style task's metadata)")
    meta = _read_instance(src / "instance.json")
    task_id = meta["instance_id"]
    spec = meta.get("problem_statement") or _read_text(
        src / "issue.md", "the issue text (instance.json has no problem_statement)"
    )
    f2p, p2p = _node_ids(meta, "FAIL_TO_PASS", src), _node_ids(meta, "PASS_TO_PASS", src)
    if not f2p:
        raise TaskFormatError(f"{src / 'instance.json'}: FAIL_TO_PASS is empty")
    requirements = meta.get("requirements", [])
    if not isinstance(requirements, list) or not all(isinstance(r, str) for r in requirements):
        raise TaskFormatError(f"{src / 'instance.json'}: requirements must be a list of strings")
    if requirements:  # installed into an image of the task's own when it is built
        image = f"gyre-swe-{re.sub(r'[^a-z0-9_.-]+', '-', task_id.lower()).strip('-.')}:latest"
    digest = _digest(src)
    work = cache / task_id / digest
    if not work.is_dir():
        _prepare(src, meta, f2p + p2p, work)
    return Task(
        id=task_id,
        tier="repo",
        domain="swe",
        title=f"SWE: {task_id}",
        spec=spec,
        image=image,
        test_commands=["python -m pytest -p no:cacheprovider -q " + shlex.join(f2p + p2p)],
        hidden_tests_dir=work / "hidden",
        hidden_test_paths=list_files(work / "hidden"),
        test_count=len(f2p) + len(p2p),
        workspace_dir=work / "repo",
        gold_dir=work / "gold" if (work / "gold").is_dir() else None,
        requirements=list(requirements),
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        grading_timeout_s=float(meta.get("grading_timeout_s", 600.0)),
        source=str(src),
    )


def _read_instance(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TaskFormatError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(meta, dict):
        raise TaskFormatError(f"{path}: expected a JSON object")
    if not isinstance(meta.get("instance_id"), str) or not meta["instance_id"]:
        raise TaskFormatError(f"{path}: missing instance_id")
    return meta


def _read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise TaskFormatError(f"{path.parent}: missing {path.name}: {what}")
    return path.read_text(encoding="utf-8")


def _node_ids(meta: dict, key: str, src: Path) -> list[str]:
    value = meta.get(key, [])
    if isinstance(value, str):  # the dataset stores these lists as JSON strings
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{src / 'instance.json'}: {key} is not a JSON list") from e
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TaskFormatError(f"{src / 'instance.json'}: {key} must be a list of test ids")
    for nodeid in value:
        path = PurePosixPath(nodeid.split("::", 1)[0])
        if "::" not in nodeid or path.is_absolute() or ".." in path.parts:
            raise TaskFormatError(
                f"{src / 'instance.json'}: {key} entry {nodeid!r} is not a pytest node id "
                "(path/to/test_file.py::test_name) inside the repository"
            )
    return list(value)


def _unpacked(archive: Path, cache: Path) -> Path:
    """An archive of a task folder, extracted (safely) under ``cache``; its task folder."""
    if not archive.name.endswith(_ARCHIVES):
        raise TaskFormatError(f"{archive}: not a task folder or a .tar.gz/.tgz/.tar archive")
    h = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    dest = cache / h
    if not dest.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
        try:
            with tarfile.open(archive) as tf:
                safe_extract(tf, staging, skip_escaping_links=False)
            publish(staging, dest)
        except (tarfile.TarError, OSError) as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise TaskFormatError(f"{archive}: cannot extract ({e})") from e
    if is_swe_task(dest):
        return dest
    inner = [p for p in dest.iterdir() if is_swe_task(p)]
    if len(inner) != 1:
        raise TaskFormatError(f"{archive}: missing instance.json (no task folder inside)")
    return inner[0]


def _digest(src: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(src.rglob("*")):
        if f.is_file() and ".git" not in f.relative_to(src).parts:
            h.update(f"{f.relative_to(src).as_posix()}\0".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def _prepare(src: Path, meta: dict, node_ids: list[str], work: Path) -> None:
    """Build ``work/{repo,gold,hidden}`` from the task folder, atomically."""
    work.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=work.parent))
    try:
        repo = staging / "repo"
        _copy_repo(src, meta, repo)
        gold_patch = _patch_text(src, meta, "gold.patch", "patch")
        test_patch = _patch_text(src, meta, "test.patch", "test_patch")
        tested = staging / "tested"
        shutil.copytree(repo, tested, symlinks=True)
        if test_patch:
            _apply(test_patch, tested, src / "test.patch")
        _copy_hidden(tested, node_ids, staging / "hidden", src)
        if gold_patch:
            shutil.copytree(repo, staging / "gold", symlinks=True)
            _apply(gold_patch, staging / "gold", src / "gold.patch")
        shutil.rmtree(tested)
        publish(staging, work)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_repo(src: Path, meta: dict, dest: Path) -> None:
    folder, archives = src / "repo", [src / f"repo{s}" for s in _ARCHIVES]
    archive = next((a for a in archives if a.is_file()), None)
    if folder.is_dir():
        _check_commit(folder, meta.get("base_commit"))
        shutil.copytree(folder, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    elif archive is not None:
        unpacked = dest.parent / "_unpacked"
        try:
            with tarfile.open(archive) as tf:
                safe_extract(tf, unpacked, skip_escaping_links=False)
        except (tarfile.TarError, OSError) as e:
            raise TaskFormatError(f"{archive}: cannot extract ({e})") from e
        entries = list(unpacked.iterdir())
        top = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked
        _check_commit(top, meta.get("base_commit"))
        shutil.copytree(top, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        shutil.rmtree(unpacked)
    else:
        raise TaskFormatError(
            f"{src}: missing repo/ or repo.tar.gz: the repository at its base commit"
        )


def _check_commit(repo: Path, base_commit: str | None) -> None:
    """A git checkout must be at ``base_commit``; a plain tree is taken as it is."""
    if not base_commit or not (repo / ".git").exists():
        return
    run = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    head = run.stdout.strip()
    if run.returncode != 0 or not head.startswith(base_commit.strip()):
        raise TaskFormatError(
            f"{repo}: checked out at {head or '?'}, but instance.json's base_commit is "
            f"{base_commit}"
        )


def _patch_text(src: Path, meta: dict, filename: str, key: str) -> str:
    if (src / filename).is_file():
        return (src / filename).read_text(encoding="utf-8")
    value = meta.get(key) or ""
    if not isinstance(value, str):
        raise TaskFormatError(f"{src / 'instance.json'}: {key} must be a unified diff string")
    return value


def _apply(diff: str, tree: Path, where: Path) -> None:
    if shutil.which("patch") is None:
        raise TaskFormatError("applying a task's patch needs `patch` (apt-get install patch)")
    run = subprocess.run(
        ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-d", str(tree)],
        input=diff,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise TaskFormatError(f"{where}: does not apply to the repository: {run.stdout[-800:]}")


def _copy_hidden(tested: Path, node_ids: list[str], dest: Path, src: Path) -> None:
    """The named test files and every conftest.py above them (the grader deletes the
    workspace's own conftest files), from the tested tree into ``dest``."""
    files: set[str] = set()
    for nodeid in node_ids:
        rel = nodeid.split("::", 1)[0]
        if not (tested / rel).is_file():
            raise TaskFormatError(f"{src}: test file {rel!r} (of {nodeid!r}) is not in the repo")
        files.add(rel)
        parts = PurePosixPath(rel).parts[:-1]
        for depth in range(len(parts) + 1):
            conftest = PurePosixPath(*parts[:depth], "conftest.py").as_posix()
            if (tested / conftest).is_file():
                files.add(conftest)
    for rel in sorted(files):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tested / rel, dest / rel)
