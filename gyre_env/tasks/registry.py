"""Task suites by name, the Gymnasium way: a name maps to a ``"module:function"`` entry
point or a folder, and nothing is imported or read until the suite is loaded.

    register_suite("my-suite", "my_pkg.tasks:load")      # function returning list[Task]
    register_suite("my-folder", "/data/my_tasks")         # a folder of task folders
    load_suite("builtin"); load_suite("nano", split="train", count=256, seed=0)
    load_suite("/data/other_tasks")
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gyre_env.tasks.task import Task, TaskFormatError, load_task


class UnknownNameError(KeyError):
    """No suite or task by that name; the message suggests the closest known one."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(kw_only=True, frozen=True)
class SuiteSpec:
    """A registered suite: where its tasks come from."""

    name: str
    """Name users pass to ``load_suite``."""
    entry_point: str
    """``"module:function"`` (called with ``load_suite``'s keyword arguments, returns a list
    of Task) or a folder path whose subfolders holding ``task.toml`` are tasks."""
    description: str = ""


SUITES: dict[str, SuiteSpec] = {}


def register_suite(
    name: str, entry_point: str | Path, *, description: str = "", overwrite: bool = False
) -> None:
    """Register a suite under ``name``; re-registering needs ``overwrite=True``."""
    if name in SUITES and not overwrite:
        raise ValueError(f"task suite {name!r} is already registered (pass overwrite=True)")
    SUITES[name] = SuiteSpec(name=name, entry_point=str(entry_point), description=description)


def load_suite(name_or_path: str | Path, **kwargs) -> list[Task]:
    """The tasks of a registered suite or of a folder of task folders, sorted by id."""
    key = str(name_or_path)
    if key in SUITES:
        tasks = _load_entry_point(SUITES[key].entry_point, kwargs)
    elif Path(key).expanduser().is_dir():
        if kwargs:
            raise TypeError(f"a folder suite takes no options, got {sorted(kwargs)}")
        tasks = load_task_folder(key)
    else:
        close = difflib.get_close_matches(key, list(SUITES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(
            f"no task suite named {key!r} and no such folder.{hint} "
            f"Registered suites: {sorted(SUITES)}"
        )
    ids = [t.id for t in tasks]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise TaskFormatError(f"suite {key!r} has duplicate task ids {dupes}")
    return sorted(tasks, key=lambda t: t.id)


def _load_entry_point(entry_point: str, kwargs: dict) -> list[Task]:
    if ":" in entry_point and not Path(entry_point).exists():
        module_name, _, attr = entry_point.partition(":")
        fn: Callable[..., list[Task]] = getattr(importlib.import_module(module_name), attr)
        return list(fn(**kwargs))
    if kwargs:
        raise TypeError(f"a folder suite takes no options, got {sorted(kwargs)}")
    return load_task_folder(entry_point)


def load_task_folder(folder: str | Path) -> list[Task]:
    """Every task folder under ``folder``, loaded (or ``folder`` itself): Gyre's format
    (``spec.md`` + ``task.toml``), Harbor (``instruction.md``), terminal-bench
    (``task.toml``'s sibling ``task.yaml``) or SWE-style (``instance.json``)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise TaskFormatError(f"{root}: not a folder")
    if task_format(root) is not None:
        return [_load_any(root)]
    tasks = [_load_any(p) for p in sorted(root.iterdir()) if task_format(p) is not None]
    if not tasks:
        raise TaskFormatError(
            f"{root}: no task folders (subfolders with task.toml, instruction.md, task.yaml "
            "or instance.json)"
        )
    return tasks


def task_format(folder: Path) -> str | None:
    """``gyre``, ``harbor`` (also terminal-bench), ``swe``, or None for no task folder."""
    if not folder.is_dir():
        return None
    if (folder / "instruction.md").is_file() or (folder / "task.yaml").is_file():
        return "harbor"
    if (folder / "instance.json").is_file():
        return "swe"
    toml = folder / "task.toml"
    if toml.is_file():
        # Harbor's task.toml has [verifier]/[agent]/[environment] tables; Gyre's has none.
        text = toml.read_text(encoding="utf-8", errors="replace")
        harbor = re.search(r"^\s*\[(verifier|agent|environment)\]", text, re.M)
        return "harbor" if harbor and not (folder / "spec.md").is_file() else "gyre"
    return None


def _load_any(folder: Path) -> Task:
    kind = task_format(folder)
    if kind == "harbor":
        from gyre_env.tasks.harbor import load_harbor_task

        return load_harbor_task(folder)
    if kind == "swe":
        from gyre_env.tasks.swe import load_swe_task

        return load_swe_task(folder)
    return load_task(folder)


def get_task(task_id: str, suite: str | Path = "builtin", **kwargs) -> Task:
    """One task of a suite by id, with a did-you-mean error."""
    tasks = {t.id: t for t in load_suite(suite, **kwargs)}
    if task_id not in tasks:
        close = difflib.get_close_matches(task_id, list(tasks), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(f"no task {task_id!r} in suite {str(suite)!r}.{hint}")
    return tasks[task_id]


def builtin_suite_dir() -> Path:
    """The folder of the built-in suite shipped in the package."""
    return Path(__file__).resolve().parent / "builtin"


def load_builtin() -> list[Task]:
    """The built-in suite (entry point of the ``builtin`` name)."""
    return load_task_folder(builtin_suite_dir())


register_suite(
    "builtin",
    "gyre_env.tasks.registry:load_builtin",
    description="Gyre's own tasks in three tiers (micro, small, repo), with gold solutions",
)
register_suite(
    "nl2repo",
    "gyre_env.tasks.nl2repo:load_nl2repo",
    description="An NL2RepoBench checkout: load_suite('nl2repo', checkout=..., tests=...)",
)
register_suite(
    "nano",
    "gyre_env.tasks.nano:nano_tasks",
    description="Generated one-function tasks for tiny models: "
    "load_suite('nano', split='train', count=256, seed=0)",
)
register_suite(
    "harbor",
    "gyre_env.tasks.harbor:load_harbor_suite",
    description="Harbor / terminal-bench task folders (instruction, Dockerfile, tests, run "
    "script): load_suite('harbor', path=...); default: the small tasks shipped with Gyre",
)
register_suite(
    "swe",
    "gyre_env.tasks.swe:load_swe_suite",
    description="SWE-style tasks (repository, issue, FAIL_TO_PASS / PASS_TO_PASS): "
    "load_suite('swe', path=...); default: the example shipped with Gyre",
)
