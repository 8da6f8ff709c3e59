"""The interim potential Φ of a workspace: syntax, lint and visible tests.

    Φ = syntax_weight · (Python files that compile) / (Python files)
      + lint_weight   · (Python files with no ruff finding of ``lint_select``) / (Python files)
      + tests_weight  · (visible cases passed) / (visible cases collected)

Incremental: one command in the sandbox lists the workspace's files with mtime and size
and compares the list with the previous one kept in the sandbox's ``/tmp``; when nothing
changed it answers without starting Python; otherwise only new or changed ``.py`` files
are compiled and linted, and the visible tests run again (when the task has any). The
per-file verdicts are kept on the host. A tampered or deleted list only costs a full
recheck. Φ is shaping, not grading: it never touches the hidden tests.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from gyre_env.sandbox.shell import shell_quote
from gyre_env.scoring.rewards import quantize
from gyre_env.scoring.visible import VisibleRun, run_visible_tests
from gyre_env.tasks import Task

_PRUNE = (
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "node_modules",
    ".venv",
    "venv",
    "*.egg-info",
    "build",
    "dist",
)

# Run with `python -I -c SCRIPT manifest workspace ruff full select`; prints one JSON line.
_CHECKER = r"""
import json, os, subprocess, sys
man, ws, ruff, full, select = sys.argv[1:6]
def load(p):
    out = {}
    try:
        with open(p, encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                parts = line.rstrip("\n").rsplit("\t", 2)
                if len(parts) == 3:
                    out[parts[0]] = (parts[1], parts[2])
    except OSError:
        return None
    return out
new = load(man + ".new") or {}
old = None if full == "1" else load(man + ".old")
reset = old is None
old = old or {}
changed = [p for p in new if new[p] != old.get(p)]
removed = [p for p in old if p not in new]
py = [p for p in changed if p.endswith(".py")]
res = {}
for p in py:
    try:
        with open(os.path.join(ws, p), "rb") as fh:
            compile(fh.read(), p, "exec", dont_inherit=True)
        res[p] = [True, True]
    except Exception:
        res[p] = [False, False]
ok = [p for p in py if res[p][0]]
if ok and ruff:
    cmd = [ruff, "check", "--isolated", "--no-cache", "--exit-zero", "--select", select,
           "--output-format", "json", "--"] + ok
    try:
        out = subprocess.run(cmd, cwd=ws, capture_output=True, timeout=300).stdout
        for d in json.loads(out or b"[]"):
            rel = os.path.relpath(d.get("filename", ""), ws)
            if rel in res:
                res[rel][1] = False
    except Exception as e:
        print(json.dumps({"error": "ruff failed: %s" % e}))
        sys.exit(0)
os.replace(man + ".new", man + ".old")
print(json.dumps({"reset": reset, "any_change": bool(changed or removed or reset),
                  "results": res, "removed": removed}))
"""


@dataclass(kw_only=True)
class PotentialConfig:
    """Weights and knobs of Φ. The weights sum to Φ's maximum (0.5 by default), so the
    final score always outweighs the shaping."""

    syntax_weight: float = 0.1
    lint_weight: float = 0.1
    tests_weight: float = 0.3
    """Weight of the visible-test pass fraction (unused when the task has no visible tests)."""
    lint_select: str = "E9,F63,F7,F82"
    """Ruff rules that count as lint failures: syntax errors, undefined names, misuse."""
    incremental: bool = True
    """Re-check only changed files (False: re-check every file each time, for comparison)."""
    tests_on_change: bool = True
    """Re-run the visible tests whenever a file changed (they are part of Φ)."""
    tests_timeout_s: float = 300.0


@dataclass(kw_only=True)
class Potential:
    """Φ and its parts for one state."""

    phi: float
    syntax: float
    lint: float
    tests: float | None
    """Visible pass fraction, or None when the task has no visible tests."""
    files: int
    """Python files in the workspace."""
    rechecked: int = 0
    """Python files compiled and linted to compute this value."""
    error: str | None = None

    def as_dict(self) -> dict:
        return {
            "phi": self.phi,
            "syntax": self.syntax,
            "lint": self.lint,
            "tests": self.tests,
            "files": self.files,
            "rechecked": self.rechecked,
            "error": self.error,
        }


@dataclass
class PotentialScorer:
    """Keeps per-file verdicts for one sandbox and computes Φ after each change."""

    sandbox: object
    task: Task
    config: PotentialConfig = field(default_factory=PotentialConfig)
    python: str = "python3"
    ruff: str = ""
    """Path of the ruff binary in the sandbox ('' disables the lint part)."""
    plugins: list[str] | None = None
    """pytest plugins of the visible test runs (``run_visible_tests``)."""

    def __post_init__(self) -> None:
        self.manifest = f"/tmp/.gyre-phi-{secrets.token_hex(8)}"
        self.verdicts: dict[str, tuple[bool, bool]] = {}
        self.visible: VisibleRun | None = None
        self.current = Potential(phi=0.0, syntax=0.0, lint=0.0, tests=None, files=0)

    @classmethod
    def for_sandbox(
        cls,
        sandbox,
        task: Task,
        config: PotentialConfig | None = None,
        plugins: list[str] | None = None,
    ):
        """Find the sandbox's interpreter and ruff with one command, then build the scorer."""
        probe = sandbox.exec(
            "python3 -c 'import sys; print(sys.executable)'; "
            "python3 -c 'from ruff.__main__ import find_ruff_bin; print(find_ruff_bin())' "
            "2>/dev/null || command -v ruff || echo",
            timeout=60,
        )
        lines = probe.stdout.splitlines() + ["", ""]
        config = config or PotentialConfig()
        return cls(sandbox, task, config, lines[0] or "python3", lines[1], plugins)

    def _command(self, full: bool) -> str:
        ws, man = shell_quote(self.sandbox.workspace), self.manifest
        prune = " -o ".join(f"-name {shell_quote(p)}" for p in _PRUNE)
        listing = (
            f"cd {ws} && find . \\( {prune} \\) -prune -o -type f -printf '%P\\t%T@\\t%s\\n' "
            f"> {man}.new 2>/dev/null"
        )
        check = (
            f"{shell_quote(self.python)} -I -c {shell_quote(_CHECKER)} {man} {ws} "
            f"{shell_quote(self.ruff)} {'1' if full else '0'} {shell_quote(self.config.lint_select)}"
        )
        if full:
            return f"{listing}; {check}"
        return f"{listing}; if cmp -s {man}.new {man}.old; then echo '{{}}'; else {check}; fi"

    def update(self, visible: VisibleRun | None = None) -> Potential:
        """Recompute Φ (``visible``: a run of the visible tests made just now, reused)."""
        full = not self.config.incremental
        result = self.sandbox.exec(self._command(full), timeout=600)
        try:
            report = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            report = {"error": f"checker failed (exit {result.exit_code}): {result.output[-300:]}"}
        if "error" in report:
            self.current = _with_error(self.current, report["error"])
            return self.current
        if report.get("reset"):
            self.verdicts.clear()
        for path in report.get("removed", []):
            self.verdicts.pop(path, None)
        for path, (syntax_ok, lint_ok) in report.get("results", {}).items():
            self.verdicts[path] = (bool(syntax_ok), bool(lint_ok))
        if visible is not None:
            self.visible = visible
        elif (
            self.task.has_visible_tests
            and self.config.tests_on_change
            and self.config.tests_weight > 0
            and (report.get("any_change") or self.visible is None)
        ):
            self.visible = run_visible_tests(
                self.sandbox, self.task, self.config.tests_timeout_s, plugins=self.plugins
            )
        self.current = self._potential(len(report.get("results", {})))
        return self.current

    def _potential(self, rechecked: int) -> Potential:
        cfg = self.config
        n = len(self.verdicts)
        syntax = sum(v[0] for v in self.verdicts.values()) / n if n else 0.0
        lint = sum(v[1] for v in self.verdicts.values()) / n if n else 0.0
        if not self.ruff:
            lint = 0.0
        tests = None
        phi = cfg.syntax_weight * syntax + cfg.lint_weight * lint
        if self.task.has_visible_tests:
            tests = self.visible.pass_fraction if self.visible is not None else 0.0
            phi += cfg.tests_weight * tests
        return Potential(
            phi=quantize(phi), syntax=syntax, lint=lint, tests=tests, files=n, rechecked=rechecked
        )


def _with_error(p: Potential, error: str) -> Potential:
    return Potential(
        phi=p.phi, syntax=p.syntax, lint=p.lint, tests=p.tests, files=p.files, error=error
    )
