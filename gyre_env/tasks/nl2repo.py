"""Tasks from an NL2RepoBench checkout.

The checkout layout (one folder per task)::

    test_files/<task>/start.md               the spec (some tasks have only
                                             start.md.download_failed.txt: skipped)
    test_files/<task>/test_case_count.txt    declared number of test cases
    test_files/<task>/test_commands.json     e.g. ["pip install -e .", "pytest ... tests"]
    test_files/<task>/test_files.json        the test paths in the upstream repository

The upstream tests are not in the checkout: ``tests`` points at a folder holding, per
task, either the upstream source tree (``<tests>/<task>/``) or a source distribution
(``<tests>/<task>-<version>.tar.gz`` / ``.zip``; names compare case- and
``-_.``-insensitively), or is a mapping task -> folder or archive. Only the paths named
in ``test_files.json`` are copied into the task's hidden-test overlay (under
``cache_dir``), never the upstream implementation.

Dependencies: episodes have no network, so each task's requirements are installed into
its image at build time (``gyre images build --suite nl2repo -o checkout=... -o
tests=...``). They come from ``<requirements>/<task>.txt`` or
``test_files/<task>/requirements.txt`` when present, else from the spec's "Core
Dependency Library Versions" section; the upstream package's declared runtime
dependencies (its sdist's ``PKG-INFO``, ``pyproject.toml``, ``setup.cfg`` or
``setup.py``) are added to them, since a spec often names those only in prose. A
requirement the spec pins wins over the upstream's. ``pip install`` test commands are
rewritten to ``--no-build-isolation --no-deps`` so they work offline against that image.

Gold: the upstream source without its test paths (``Task.gold_dir``, under ``cache_dir``),
for ``gyre tasks check`` and the gold agent only. Neither the gold nor the upstream code
ever enters an agent's sandbox.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tarfile
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from gyre_env.tasks.archive import publish, safe_extract
from gyre_env.tasks.task import Task, TaskFormatError, list_files

_TOOLING = {"python", "pip", "setuptools", "wheel", "distribute"}
"""The interpreter and the image's own tooling: pinning them from a spec would break the image."""
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")


class NL2RepoSkipWarning(UserWarning):
    """A task of the checkout was skipped; the message names it and says why."""


def load_nl2repo(
    checkout: str | Path,
    tests: str | Path | Mapping[str, str | Path] | None = None,
    *,
    requirements: str | Path | None = None,
    cache_dir: str | Path | None = None,
    only: list[str] | None = None,
    image_prefix: str = "gyre-nl2repo-",
    max_steps: int = 400,
    wall_clock_s: float = 4 * 3600.0,
    offline_install: bool = True,
    strict: bool = False,
) -> list[Task]:
    """Load the tasks of an NL2RepoBench checkout (or of its ``test_files`` folder).

    Tasks with no spec, no upstream tests, or malformed files (a test path missing from
    the upstream source, a bad count) are skipped with an ``NL2RepoSkipWarning`` naming
    them and the reason; ``strict=True`` raises for malformed files instead. It is an
    error when no task at all can be loaded.
    """
    root = _test_files_dir(Path(checkout).expanduser())
    if tests is None:
        raise TypeError("load_nl2repo needs tests=: a folder or mapping of upstream tests")
    cache = Path(cache_dir or Path.home() / ".cache" / "gyre" / "nl2repo").expanduser()
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    if only is not None:
        missing = sorted(set(only) - set(names))
        if missing:
            raise KeyError(f"tasks {missing} are not in {root}")
        names = [n for n in names if n in only]
    options = {
        "image_prefix": image_prefix,
        "max_steps": max_steps,
        "wall_clock_s": wall_clock_s,
        "offline_install": offline_install,
        "tests_from": tests,
    }
    tasks, untested = [], []
    for name in names:
        try:
            source = _tests_source(tests, name)
            if source is None and (root / name / "start.md").is_file():
                untested.append(name)
                continue
            tasks.append(_load_one(root / name, source, cache / name, requirements, options))
        except (_Skip, TaskFormatError) as e:
            if strict and not isinstance(e, _Skip):
                raise
            warnings.warn(f"NL2Repo task {name!r} skipped: {e}", NL2RepoSkipWarning, stacklevel=2)
    if untested:  # one line, not one per task: a checkout has ~100 tasks, tests= a few
        shown = ", ".join(untested[:8]) + (
            f" and {len(untested) - 8} more" if len(untested) > 8 else ""
        )
        warnings.warn(
            f"{len(untested)} NL2Repo task(s) skipped: no upstream tests for them in {tests}: "
            f"{shown}",
            NL2RepoSkipWarning,
            stacklevel=2,
        )
    if not tasks:
        raise TaskFormatError(f"{root}: no NL2Repo task could be loaded (see the warnings)")
    return tasks


def _test_files_dir(checkout: Path) -> Path:
    for candidate in (checkout / "test_files", checkout):
        if candidate.is_dir() and any(
            (p / "test_commands.json").is_file() for p in candidate.iterdir() if p.is_dir()
        ):
            return candidate
    raise TaskFormatError(f"{checkout}: not an NL2RepoBench checkout (no test_files/<task>/)")


class _Skip(Exception):
    """A task that is absent rather than malformed: skipped even with strict=True."""


def _load_one(
    task_dir: Path,
    source: Path | None,
    cache: Path,
    requirements: str | Path | None,
    options: dict,
) -> Task:
    name = task_dir.name
    if not (task_dir / "start.md").is_file():
        if (task_dir / "start.md.download_failed.txt").exists():
            raise _Skip("its spec failed to download (only start.md.download_failed.txt)")
        raise _Skip("it has no start.md")
    if source is None:
        raise _Skip(f"no upstream tests for it in {options['tests_from']}")
    spec = (task_dir / "start.md").read_text(encoding="utf-8")
    commands = _read_json_list(task_dir / "test_commands.json")
    test_paths = _read_json_list(task_dir / "test_files.json")
    count_file = task_dir / "test_case_count.txt"
    try:
        count = int(count_file.read_text().strip())
    except (OSError, ValueError) as e:
        raise TaskFormatError(f"{count_file}: expected a single integer") from e
    overlay = build_overlay(source, test_paths, cache)
    gold = build_gold(source, test_paths, cache)
    requirements = merge_requirements(
        _requirements_for(task_dir, spec, requirements),
        upstream_requirements(source, parse_spec_python_version(spec))
        + upstream_build_requirements(source),
        exclude=own_distribution_names(name),
    )
    if options["offline_install"]:
        commands = [offline_pip(c) for c in commands]
    return Task(
        id=name,
        tier="repo",
        domain="nl2repo",
        title=f"NL2RepoBench: {name}",
        spec=spec,
        image=f"{options['image_prefix']}{_slug(name)}:latest",
        test_commands=commands,
        hidden_tests_dir=overlay,
        hidden_test_paths=list_files(overlay),
        test_count=count,
        remove_before_grading=[*(p.rstrip("/") for p in test_paths), "conftest.py"],
        max_steps=options["max_steps"],
        wall_clock_s=options["wall_clock_s"],
        grading_timeout_s=1800.0,
        requirements=requirements,
        gold_dir=gold,
        python_version=parse_spec_python_version(spec),
        source=str(task_dir),
    )


def _read_json_list(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TaskFormatError(f"{path}: expected a JSON list of strings ({e})") from e
    if not isinstance(data, list) or not data or not all(isinstance(x, str) for x in data):
        raise TaskFormatError(f"{path}: expected a non-empty JSON list of strings")
    return data


def offline_pip(command: str) -> str:
    """Make a ``pip install`` command work without network (no build isolation, no deps)."""
    m = re.match(r"^\s*((?:python[0-9.]*\s+-m\s+)?pip[0-9.]*\s+install)\b(.*)$", command)
    if not m:
        return command
    rest = m.group(2)
    extra = [f for f in ("--no-build-isolation", "--no-deps") if f not in rest]
    return " ".join([m.group(1), *extra]) + rest


def _tests_source(tests: str | Path | Mapping, name: str) -> Path | None:
    if isinstance(tests, Mapping):
        path = tests.get(name)
        return Path(path).expanduser() if path is not None else None
    folder = Path(tests).expanduser()
    if not folder.is_dir():
        raise TaskFormatError(f"tests={tests!s} is not a folder")
    if (folder / name).is_dir():
        return folder / name
    want = _norm(name)
    for p in sorted(folder.iterdir()):
        if p.is_dir():
            if _norm(p.name) == want:
                return p
            continue
        stem = _archive_stem(p.name)
        if stem is None:
            continue
        # "<name>" or "<name>-<version>"
        if _norm(stem) == want or re.fullmatch(re.escape(want) + r"-\d[\w.+!-]*", _norm(stem)):
            return p
    return None


def _archive_stem(filename: str) -> str | None:
    for suffix in _ARCHIVE_SUFFIXES:
        if filename.lower().endswith(suffix):
            return filename[: -len(suffix)]
    return None


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.") or "task"


def build_overlay(source: Path, test_paths: list[str], cache: Path) -> Path:
    """Copy ``test_paths`` (files or folders) from a source tree or archive into a folder
    under ``cache`` and return it.

    The folder is named by a digest of the test paths and of the source's content (the
    archive, or the files under the test paths), and is never changed once built: a second load reuses it, and a grader
    reading it is not disturbed when another process loads a changed source.
    """
    for rel in test_paths:
        if PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts:
            raise TaskFormatError(f"test path {rel!r} must be relative, inside the repository")
    overlay = cache / _source_digest(source, test_paths)
    if overlay.is_dir():
        return overlay
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
    try:
        if source.is_dir():
            tree = source
        else:
            tree = _extract(source, staging / "_src")
        out = staging / "overlay"
        out.mkdir()
        for rel in test_paths:
            src = tree / rel.rstrip("/")
            if src.is_dir():
                shutil.copytree(
                    src,
                    out / rel.rstrip("/"),
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                )
            elif src.is_file():
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, out / rel)
            else:
                raise TaskFormatError(f"test path {rel!r} not found in {source}")
        publish(out, overlay)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return overlay


_NOT_GOLD = ("__pycache__", "*.pyc", "*.egg-info", ".git", ".tox", ".eggs", "build", "dist")


def build_gold(source: Path, test_paths: list[str], cache: Path) -> Path:
    """The upstream source tree without ``test_paths``, as a folder under ``cache``
    (named by the source's digest, never changed once built), and return it."""
    gold = cache / f"gold-{_source_digest(source, test_paths, whole=True)}"
    if gold.is_dir():
        return gold
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
    try:
        tree = source if source.is_dir() else _extract(source, staging / "_src")
        out = staging / "gold"
        shutil.copytree(tree, out, ignore=shutil.ignore_patterns(*_NOT_GOLD))
        for rel in test_paths:
            target = out / rel.rstrip("/")
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        publish(out, gold)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return gold


def upstream_requirements(source: Path, python: str | None = None) -> list[str]:
    """The upstream package's declared runtime dependencies, from its source tree or
    sdist: ``PKG-INFO``'s ``Requires-Dist``, else ``pyproject.toml``'s
    ``[project] dependencies``, else ``setup.cfg``'s ``install_requires``, else a literal
    ``install_requires=[...]`` in ``setup.py``. Extras and requirements whose markers do
    not hold for ``python`` (default: this Python) on Linux are left out."""
    files = _metadata_files(source)
    for name, parse in (
        ("PKG-INFO", _requires_dist),
        ("pyproject.toml", _pyproject_dependencies),
        ("setup.cfg", _setup_cfg_requires),
        ("setup.py", _setup_py_requires),
    ):
        if name in files:
            try:
                found = parse(files[name])
            except (ValueError, SyntaxError):
                continue
            if found:
                return [r for r in (_applicable(x, python) for x in found) if r]
    return []


def upstream_build_requirements(source: Path) -> list[str]:
    """``[build-system] requires`` of the upstream's ``pyproject.toml`` (hatchling,
    setuptools_scm, ...): test commands install the workspace with
    ``--no-build-isolation``, so the build backend must already be in the image."""
    text = _metadata_files(source).get("pyproject.toml")
    if text is None:
        return []
    import tomllib

    try:
        requires = tomllib.loads(text).get("build-system", {}).get("requires", [])
    except tomllib.TOMLDecodeError:
        return []
    return [r for r in (_applicable(x, None) for x in requires if isinstance(x, str)) if r]


def _metadata_files(source: Path) -> dict[str, str]:
    """Top-level metadata files of a source tree or archive, by name."""
    names = ("PKG-INFO", "pyproject.toml", "setup.cfg", "setup.py")
    out: dict[str, str] = {}
    if source.is_dir():
        for n in names:
            if (source / n).is_file():
                out[n] = (source / n).read_text(encoding="utf-8", errors="replace")
        return out
    try:
        if source.name.lower().endswith(".zip"):
            with zipfile.ZipFile(source) as zf:
                for member in zf.namelist():
                    parts = PurePosixPath(member).parts
                    if len(parts) == 2 and parts[1] in names:
                        out[parts[1]] = zf.read(member).decode("utf-8", "replace")
        else:
            with tarfile.open(source) as tf:
                for member in tf.getmembers():
                    parts = PurePosixPath(member.name).parts
                    if member.isfile() and len(parts) == 2 and parts[1] in names:
                        data = tf.extractfile(member)
                        if data is not None:
                            out[parts[1]] = data.read().decode("utf-8", "replace")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
        raise TaskFormatError(f"{source}: cannot read ({e})") from e
    return out


def _requires_dist(text: str) -> list[str]:
    head = text.split("\n\n", 1)[0]  # the headers; the long description follows
    return [
        line.split(":", 1)[1].strip()
        for line in head.splitlines()
        if line.lower().startswith("requires-dist:")
    ]


def _pyproject_dependencies(text: str) -> list[str]:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(str(e)) from e
    deps = data.get("project", {}).get("dependencies", [])
    return [d for d in deps if isinstance(d, str)]


def _setup_cfg_requires(text: str) -> list[str]:
    import configparser

    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read_string(text)
    except configparser.Error as e:
        raise ValueError(str(e)) from e
    raw = cp.get("options", "install_requires", fallback="")
    lines = (line.split(" #", 1)[0].strip() for line in raw.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _setup_py_requires(text: str) -> list[str]:
    import ast

    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            value = ast.literal_eval(node.value)  # ValueError unless a literal list
            return [v for v in value if isinstance(v, str)]
    return []


def _applicable(requirement: str, python: str | None) -> str | None:
    """``requirement`` without its marker if the marker holds for ``python`` on Linux
    (extras never do); None otherwise."""
    req, _, marker = requirement.partition(";")
    req, marker = req.strip(), marker.strip()
    if not marker:
        return req or None
    if "extra" in marker:
        return None
    try:
        from packaging.markers import Marker
    except ImportError:  # no way to evaluate it: leave it out rather than guess
        return None
    env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}
    if python:
        env |= {"python_version": python, "python_full_version": f"{python}.0"}
    try:
        return req if Marker(marker).evaluate(env) else None
    except Exception:
        return None


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a requirement line (``Foo_Bar>=1`` -> ``foo-bar``)."""
    return _norm(re.split(r"[\s=<>!~\[;(@]", requirement.strip(), maxsplit=1)[0])


def merge_requirements(
    primary: list[str], secondary: list[str], exclude: set[str] = frozenset()
) -> list[str]:
    """``primary`` (the spec's pins: they win), then the ``secondary`` requirements whose
    distribution ``primary`` does not name; names in ``exclude`` and the image's tooling
    are left out of ``secondary``."""
    out = list(primary)
    named = {requirement_name(r) for r in primary}
    for req in secondary:
        name = requirement_name(req)
        if name and name not in named and name not in exclude and name not in _TOOLING:
            out.append(req)
            named.add(name)
    return out


def _source_digest(source: Path, test_paths: list[str], whole: bool = False) -> str:
    h = hashlib.sha256(json.dumps(sorted(test_paths)).encode())
    files = [source]
    if source.is_dir() and whole:
        files = sorted(source.rglob("*"))
    elif source.is_dir():
        roots = [source / rel.rstrip("/") for rel in test_paths]
        files = sorted(f for r in roots for f in ([r] if r.is_file() else r.rglob("*")))
    for f in files:
        if f.is_file():
            h.update(f"{f.relative_to(source) if f != source else f.name}\0".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def _extract(archive: Path, dest: Path) -> Path:
    """Extract an sdist safely and return its source root (the single top folder)."""
    dest.mkdir(parents=True)
    if archive.name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                if PurePosixPath(member).is_absolute() or ".." in PurePosixPath(member).parts:
                    raise TaskFormatError(f"{archive}: unsafe member {member!r}")
            zf.extractall(dest)
    else:
        try:
            with tarfile.open(archive) as tf:
                safe_extract(tf, dest, skip_escaping_links=False)
        except (tarfile.TarError, OSError) as e:
            raise TaskFormatError(f"{archive}: cannot extract ({e})") from e
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def _requirements_for(task_dir: Path, spec: str, requirements: str | Path | None) -> list[str]:
    candidates = [task_dir / "requirements.txt"]
    if requirements is not None:
        req = Path(requirements).expanduser()
        candidates.insert(0, req / f"{task_dir.name}.txt" if req.is_dir() else req)
    for path in candidates:
        if path.is_file():
            return parse_requirements_file(path.read_text(encoding="utf-8"))
    return parse_spec_requirements(spec, project=task_dir.name)


def parse_requirements_file(text: str) -> list[str]:
    """Requirement lines of a requirements file (comments, blanks and options dropped)."""
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            out.append(line)
    return out


_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9,._-]+\])?"
_SPECIFIER = re.compile(
    rf"^({_NAME})((?:===|==|>=|<=|~=|!=|<|>)[^,\s]+(?:,(?:===|==|>=|<=|~=|!=|<|>)[^,\s]+)*)$"
)
_PINNED = re.compile(rf"^({_NAME})\s*(?::\s*|\s+)v?(\d[\w.+!-]*)$")
_BARE = re.compile(rf"^{_NAME}$")


def parse_spec_requirements(spec: str, project: str | None = None) -> list[str]:
    """Requirements from the spec's "Core Dependency Library Versions" section.

    Understands the forms NL2RepoBench specs use, inside or outside a code fence:
    ``pip list`` lines (``name  1.2.3`` -> ``name==1.2.3``), specifiers (``name>=1``,
    ``name >= 1, != 1.5``), ``name: 1.2.3``, bare names, bullets, and ``# comments``
    (whole-line or trailing). Prose lines (``Core dependencies``, ``Package Version``)
    are skipped; so are the interpreter and the image's own tooling (python, pip,
    setuptools, wheel), standard-library modules some specs list (``json>=2.0.9``), and,
    given ``project`` (the task name), the project's own distribution: installed in the
    image it would hand the agent the upstream code it is asked to write.
    """
    own = own_distribution_names(project) if project else set()
    out: list[str] = []
    for raw in _dependency_section(spec):
        req = _requirement_of(raw)
        name = re.split(r"[=<>!~\[]", req, maxsplit=1)[0] if req else ""
        if (
            req
            and name.lower() not in _TOOLING
            and name not in sys.stdlib_module_names
            and _norm(name) not in own
            and req not in out
        ):
            out.append(req)
    return out


def own_distribution_names(project: str) -> set[str]:
    """Distribution names the task's own project may go by (``box`` -> ``python-box``)."""
    base = re.sub(r"-(master|main|stable)$", "", _norm(project))
    stripped = base.removeprefix("python-")
    return {_norm(project), base, stripped, f"python-{stripped}", f"py{stripped}"}


def parse_spec_python_version(spec: str) -> str | None:
    """The ``major.minor`` Python version a spec names ("...is: Python 3.12.4"), if any."""
    m = re.search(
        r"Python version used in the current project is:?\s*(?:Python\s*)*(\d+\.\d+)", spec, re.I
    )
    return m.group(1) if m else None


def _dependency_section(spec: str) -> list[str]:
    """The lines under the dependency heading, up to the next heading of its level.

    The heading is the first whose title names dependencies and versions ("Core
    Dependency Library Versions", "Core Dependency Versions"), else dependencies and
    libraries ("Versions of Core Dependent Libraries"). Deeper sub-headings stay in the
    section, except optional ones ("Optional Dependencies [all]").
    """
    headings = _headings(spec.splitlines())
    titles = {i: title.lower() for i, (_, title) in headings.items()}
    pick = next((i for i, t in titles.items() if "depend" in t and "version" in t), None)
    if pick is None:
        pick = next((i for i, t in titles.items() if "depend" in t and "librar" in t), None)
    if pick is None:
        return []
    level, section, skipping = headings[pick][0], [], False
    for i, line in enumerate(spec.splitlines()[pick + 1 :], start=pick + 1):
        if i in headings:
            if headings[i][0] <= level:
                break
            skipping = "optional" in titles[i]
            continue
        if not skipping:
            section.append(line)
    return section


def _headings(lines: list[str]) -> dict[int, tuple[int, str]]:
    """Line index -> (level, title) of the markdown headings outside code fences."""
    out, in_fence = {}, False
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (m := _HEADING.match(line)):
            out[i] = (len(line.strip()) - len(line.strip().lstrip("#")), m.group(1))
    return out


def _requirement_of(raw: str) -> str | None:
    line = raw.strip()
    if not line or line.startswith(("```", "#")) or set(line) <= set("-=|+ "):
        return None
    line = re.split(r"\s#", line, maxsplit=1)[0]  # trailing comment
    line = re.sub(r"^[-*+]\s+", "", line.strip()).strip("`").strip()
    line = re.sub(r"(?<=\w)\s+-\s+(?=\w)", "-", line)  # "pre - commit" -> "pre-commit"
    compact = re.sub(r"\s*(===|==|>=|<=|~=|!=|<|>|,)\s*", r"\1", line.split(";")[0]).strip()
    if _SPECIFIER.match(compact):
        return compact
    m = _PINNED.match(line)
    if m:
        return f"{m.group(1)}=={m.group(2)}"
    if _BARE.match(line):
        return line
    return None  # prose ("Core dependencies", "Package Version"), editable lines with a path
