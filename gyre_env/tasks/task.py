"""The task format: one folder per task, loaded into a `Task`.

A task folder holds (see ``FORMAT.md`` next to this module for the full contract)::

    spec.md            what the agent must build (markdown); the only thing it is told
    task.toml          metadata: id, tier, domain, image, commands, counts, limits
    hidden_tests/      an overlay copied onto the workspace in the evaluator only
    gold/              optional reference solution: the workspace files
    visible_tests/     optional overlay copied into the agent's workspace at reset

The grader (``gyre_env.scoring``) copies the workspace, deletes ``remove_before_grading``,
copies ``hidden_tests/`` over it, runs ``grading_commands()`` through bash and reads the
JUnit XML reports; score = passed / ``test_count``.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TIERS = ("nano", "micro", "small", "repo")
"""nano: one generated one-line function (``gyre_env.tasks.nano``); micro: one module, graded
in seconds; small: a package with a CLI; repo: repository-scale."""

JUNIT_PLACEHOLDER = "{junitxml}"
"""In a test command, replaced by the path of the JUnit XML report the grader reads."""

DEFAULT_IMAGE = "gyre-base:latest"
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class TaskFormatError(ValueError):
    """A task folder or its ``task.toml`` is malformed; the message names the file and field."""


class TaskSetupError(RuntimeError):
    """A task's ``setup_commands`` failed in a fresh sandbox (not the agent's doing)."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class GradingCommand:
    """One shell command of the grading run and the JUnit report it writes (if any)."""

    command: str
    junit_path: str | None


@dataclass(kw_only=True)
class Task:
    """One coding task: a spec to implement and hidden tests that grade the result."""

    id: str
    """Unique id within its suite; letters, digits, ``-``, ``_``, ``.``."""
    tier: str
    """One of ``TIERS``: ``nano``, ``micro``, ``small`` or ``repo``."""
    domain: str
    """Free-form area, e.g. ``parsing``, ``data-structures``, ``concurrency``."""
    spec: str
    """The task statement in markdown: everything the agent is told."""
    test_commands: list[str]
    """Shell commands run in order in the workspace root by the grader; pytest commands
    write a JUnit report (see ``grading_commands``)."""
    hidden_tests_dir: Path
    """Host folder whose contents are copied onto the evaluator's workspace root."""
    hidden_test_paths: list[str]
    """Workspace-relative paths of the hidden test files (all present in the overlay)."""
    test_count: int
    """Declared number of test cases; the score is passed / test_count, capped at 1."""
    title: str = ""
    """One-line human title; defaults to the id."""
    image: str = DEFAULT_IMAGE
    """Container image the agent and evaluator sandboxes start from."""
    setup_commands: list[str] = field(default_factory=list)
    """Shell commands run in the agent's workspace before the first step."""
    remove_before_grading: list[str] = field(default_factory=list)
    """Workspace-relative paths (files or folders) deleted before the hidden tests are added."""
    max_steps: int = 100
    """Step limit of an episode (truncation)."""
    wall_clock_s: float = 1800.0
    """Wall-clock limit of an episode in seconds (truncation)."""
    grading_timeout_s: float = 300.0
    """Limit for the whole grading run (all test commands)."""
    visible_tests_dir: Path | None = None
    """Host folder copied into the agent's workspace at reset, or None."""
    visible_test_paths: list[str] = field(default_factory=list)
    """Workspace-relative paths of the visible test files."""
    visible_test_commands: list[str] = field(default_factory=list)
    """Commands the ``run_tests`` tool runs (same JUnit contract as ``test_commands``)."""
    gold_dir: Path | None = None
    """Host folder holding the reference solution (workspace files), or None."""
    requirements: list[str] = field(default_factory=list)
    """pip requirement lines installed into the task image at build time (no network later)."""
    python_version: str | None = None
    """``major.minor`` Python the task's image should provide, when the task names one."""
    workspace_dir: Path | None = None
    """Host folder copied into the agent's workspace at reset before anything else (a SWE
    task's repository at its base commit), or None."""
    dockerfile: Path | None = None
    """The Dockerfile ``image`` is built from (Harbor / terminal-bench tasks; its folder is
    the build context), or None: ``image`` is the base image plus ``requirements``."""
    solution_script: Path | None = None
    """A reference solution as a shell script run in the agent's workspace (Harbor's
    ``solution/solve.sh``), for tasks whose gold is not a folder of files."""
    fail_to_pass: list[str] = field(default_factory=list)
    """SWE-style tasks: pytest node ids the change must make pass. When set, the score is
    ``passed(fail_to_pass) / (len(fail_to_pass) + failed(pass_to_pass))``."""
    pass_to_pass: list[str] = field(default_factory=list)
    """SWE-style tasks: node ids that pass before the change and must keep passing; each
    one that fails counts as one more failed test."""
    source: str = ""
    """Where the task was loaded from (a folder, a checkout), for messages."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def spec_words(self) -> int:
        """Number of whitespace-separated words in the spec."""
        return len(self.spec.split())

    @property
    def has_visible_tests(self) -> bool:
        return bool(self.visible_test_paths)

    @property
    def has_gold(self) -> bool:
        """A reference solution exists: gold files or a solution script."""
        return self.gold_dir is not None or self.solution_script is not None

    def validate(self) -> None:
        """Raise TaskFormatError naming the first field that is wrong."""
        where = self.source or self.id
        _check(_ID_RE.match(self.id or "") is not None, where, "id", f"bad id {self.id!r}")
        _check(self.tier in TIERS, where, "tier", f"{self.tier!r} is not one of {TIERS}")
        _check(bool(self.domain), where, "domain", "must not be empty")
        _check(bool(self.spec.strip()), where, "spec", "the spec is empty")
        _check(bool(self.test_commands), where, "test_commands", "at least one is needed")
        _check(self.test_count > 0, where, "test_count", f"must be > 0, got {self.test_count}")
        _check(self.max_steps > 0, where, "max_steps", "must be > 0")
        _check(self.wall_clock_s > 0, where, "wall_clock_s", "must be > 0")
        _check(self.grading_timeout_s > 0, where, "grading_timeout_s", "must be > 0")
        _check(bool(self.hidden_test_paths), where, "hidden_tests", "no hidden test files")
        paths = [*self.hidden_test_paths, *self.visible_test_paths, *self.remove_before_grading]
        for rel in paths:
            _check(
                _is_relative_safe(rel),
                where,
                "paths",
                f"{rel!r} must be a relative path inside the workspace",
            )
        for rel in self.hidden_test_paths:
            _check(
                (self.hidden_tests_dir / rel).is_file(),
                where,
                "hidden_tests",
                f"{rel!r} not found in {self.hidden_tests_dir}",
            )
        if self.visible_test_paths:
            _check(self.visible_tests_dir is not None, where, "visible_tests", "no folder")
            for rel in self.visible_test_paths:
                _check(
                    (self.visible_tests_dir / rel).is_file(),
                    where,
                    "visible_tests",
                    f"{rel!r} not found in {self.visible_tests_dir}",
                )
            _check(
                bool(self.visible_test_commands),
                where,
                "visible_test_commands",
                "needed when there are visible tests",
            )
        if self.python_version is not None:
            _check(
                re.fullmatch(r"\d+\.\d+", self.python_version) is not None,
                where,
                "python_version",
                f"expected major.minor, got {self.python_version!r}",
            )
        if self.gold_dir is not None:
            _check(self.gold_dir.is_dir(), where, "gold", f"{self.gold_dir} is not a folder")
        for key, folder in (("workspace", self.workspace_dir), ("dockerfile", self.dockerfile)):
            if folder is not None:
                ok = folder.is_dir() if key == "workspace" else folder.is_file()
                _check(ok, where, key, f"{folder} not found")
        if self.solution_script is not None:
            _check(self.solution_script.is_file(), where, "solution", "script not found")
        if self.pass_to_pass and not self.fail_to_pass:
            _check(False, where, "FAIL_TO_PASS", "PASS_TO_PASS needs FAIL_TO_PASS")
        named = [*self.fail_to_pass, *self.pass_to_pass]
        dupes = sorted({t for t in named if named.count(t) > 1})
        _check(not dupes, where, "FAIL_TO_PASS/PASS_TO_PASS", f"repeated test ids {dupes}")

    def prepare_workspace(self, sandbox, *, spec: bool = False) -> None:
        """Set a fresh agent sandbox up the way every episode starts: the visible tests,
        ``SPEC.md`` when ``spec``, then ``setup_commands``. Raises ``TaskSetupError``
        naming the command that failed."""
        if self.workspace_dir is not None:
            sandbox.put_dir(str(self.workspace_dir), ".")
        if self.visible_tests_dir is not None:
            sandbox.put_dir(str(self.visible_tests_dir), ".")
        if spec:
            sandbox.write_file("SPEC.md", self.spec)
        for cmd in self.setup_commands:
            result = sandbox.exec(cmd, timeout=600)
            if not result.ok:
                raise TaskSetupError(
                    f"setup command {cmd!r} of {self.id!r} failed (exit {result.exit_code}): "
                    f"{result.output[-1000:]}",
                    result.output,
                )

    def grading_commands(self, report_dir: str) -> list[GradingCommand]:
        """The test commands as the grader runs them, each pytest one writing its own report.

        The contract: ``{junitxml}`` in a command is replaced by a report path under
        ``report_dir``; a command without it whose first words are ``pytest`` or
        ``python[3] -m pytest`` gets ``--junitxml=<path>`` appended; any other command
        (``pip install ...``) runs unchanged and writes no report.
        """
        return _with_reports(self.test_commands, report_dir, "hidden")

    def visible_grading_commands(self, report_dir: str) -> list[GradingCommand]:
        """Like ``grading_commands`` for the visible tests (the ``run_tests`` tool)."""
        return _with_reports(self.visible_test_commands, report_dir, "visible")


def _with_reports(commands: list[str], report_dir: str, stem: str) -> list[GradingCommand]:
    out = []
    for i, cmd in enumerate(commands):
        path = f"{report_dir.rstrip('/')}/{stem}-{i}.xml"
        if JUNIT_PLACEHOLDER in cmd:
            out.append(GradingCommand(cmd.replace(JUNIT_PLACEHOLDER, shlex.quote(path)), path))
        elif is_pytest_command(cmd):
            out.append(GradingCommand(f"{cmd} --junitxml={shlex.quote(path)}", path))
        else:
            out.append(GradingCommand(cmd, None))
    return out


def is_pytest_command(cmd: str) -> bool:
    """True when ``cmd`` is a single pytest invocation (``pytest ...``/``python -m pytest``)."""
    if any(op in cmd for op in ("&&", "||", ";", "|", "\n")):
        return False
    try:
        words = shlex.split(cmd)
    except ValueError:
        return False
    if words[:1] == ["pytest"]:
        return True
    return (
        len(words) >= 3
        and re.fullmatch(r"python[0-9.]*", words[0]) is not None
        and (words[1:3] == ["-m", "pytest"])
    )


def _check(ok: bool, where: str, key: str, message: str) -> None:
    if not ok:
        raise TaskFormatError(f"{where}: {key}: {message}")


def _is_relative_safe(rel: str) -> bool:
    p = Path(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts


# ---------------------------------------------------------------------------- loading

# task.toml key -> (type(s), required). Anything else is rejected.
_TOML_KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "id": ((str,), True),
    "tier": ((str,), True),
    "domain": ((str,), True),
    "title": ((str,), False),
    "image": ((str,), False),
    "setup_commands": ((list,), False),
    "test_commands": ((list,), True),
    "hidden_tests": ((list,), False),
    "test_count": ((int,), True),
    "remove_before_grading": ((list,), False),
    "max_steps": ((int,), False),
    "wall_clock_s": ((int, float), False),
    "grading_timeout_s": ((int, float), False),
    "visible_tests": ((list,), False),
    "visible_test_commands": ((list,), False),
    "requirements": ((list,), False),
    "python_version": ((str,), False),
}


def load_task(path: str | Path) -> Task:
    """Load the task folder at ``path`` (it holds ``spec.md`` and ``task.toml``)."""
    root = Path(path).expanduser().resolve()
    toml_path = root / "task.toml"
    if not root.is_dir():
        raise TaskFormatError(f"{root}: not a folder")
    if not toml_path.is_file():
        raise TaskFormatError(f"{root}: no task.toml")
    if not (root / "spec.md").is_file():
        raise TaskFormatError(f"{root}: no spec.md")
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(f"{toml_path}: invalid TOML: {e}") from e
    _check_toml_keys(data, toml_path)
    hidden_dir = root / "hidden_tests"
    hidden = data.get("hidden_tests") or list_files(hidden_dir)
    visible_dir = root / "visible_tests"
    visible = data.get("visible_tests")
    if visible is None:
        visible = list_files(visible_dir) if visible_dir.is_dir() else []
    visible_cmds = data.get("visible_test_commands")
    if visible_cmds is None and visible:
        visible_cmds = ["python -m pytest -q " + " ".join(shlex.quote(p) for p in visible)]
    gold = root / "gold"
    return Task(
        id=data["id"],
        tier=data["tier"],
        domain=data["domain"],
        title=data.get("title", data["id"]),
        spec=(root / "spec.md").read_text(encoding="utf-8"),
        image=data.get("image", DEFAULT_IMAGE),
        setup_commands=list(data.get("setup_commands", [])),
        test_commands=list(data["test_commands"]),
        hidden_tests_dir=hidden_dir,
        hidden_test_paths=list(hidden),
        test_count=data["test_count"],
        remove_before_grading=list(data.get("remove_before_grading", [])),
        max_steps=data.get("max_steps", 100),
        wall_clock_s=float(data.get("wall_clock_s", 1800.0)),
        grading_timeout_s=float(data.get("grading_timeout_s", 300.0)),
        visible_tests_dir=visible_dir if visible else None,
        visible_test_paths=list(visible),
        visible_test_commands=list(visible_cmds or []),
        gold_dir=gold if gold.is_dir() else None,
        requirements=list(data.get("requirements", [])),
        python_version=data.get("python_version"),
        source=str(root),
    )


def _check_toml_keys(data: dict, toml_path: Path) -> None:
    unknown = sorted(set(data) - set(_TOML_KEYS))
    if unknown:
        raise TaskFormatError(
            f"{toml_path}: unknown keys {unknown}; known keys: {sorted(_TOML_KEYS)}"
        )
    for key, (types, required) in _TOML_KEYS.items():
        if key not in data:
            if required:
                raise TaskFormatError(f"{toml_path}: missing required key {key!r}")
            continue
        value = data[key]
        if not isinstance(value, types) or (types == (int,) and isinstance(value, bool)):
            names = " or ".join(t.__name__ for t in types)
            raise TaskFormatError(f"{toml_path}: {key!r} must be {names}, got {value!r}")
        if types == (list,) and not all(isinstance(v, str) for v in value):
            raise TaskFormatError(f"{toml_path}: {key!r} must be a list of strings")


def list_files(folder: Path) -> list[str]:
    """Sorted relative POSIX paths of the files under ``folder`` (caches skipped)."""
    if not folder.is_dir():
        return []
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
