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
    """Every subfolder of ``folder`` holding a ``task.toml``, loaded (or ``folder`` itself)."""
    root = Path(folder).expanduser()
    if (root / "task.toml").is_file():
        return [load_task(root)]
    tasks = [load_task(p) for p in sorted(root.iterdir()) if (p / "task.toml").is_file()]
    if not tasks:
        raise TaskFormatError(f"{root}: no task folders (subfolders with task.toml)")
    return tasks


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
