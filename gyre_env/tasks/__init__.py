"""Tasks: the on-disk task format, suites by name, and loaders.

``load_task(folder)`` reads one task folder (format in ``FORMAT.md``); ``load_suite(name)``
loads a registered suite (``"builtin"``, ``"nl2repo"``, ``"nano"``) or a folder of task
folders; ``register_suite`` adds a suite by ``"module:function"`` or folder.
``nano_tasks(split, count, seed)`` generates the ``nano`` tier (one-line functions).
"""

from __future__ import annotations

from gyre_env.tasks.nano import nano_tasks
from gyre_env.tasks.registry import (
    SUITES,
    SuiteSpec,
    UnknownNameError,
    builtin_suite_dir,
    get_task,
    load_suite,
    load_task_folder,
    register_suite,
)
from gyre_env.tasks.task import (
    TIERS,
    GradingCommand,
    Task,
    TaskFormatError,
    is_pytest_command,
    load_task,
)

__all__ = [
    "SUITES",
    "TIERS",
    "GradingCommand",
    "SuiteSpec",
    "Task",
    "TaskFormatError",
    "UnknownNameError",
    "builtin_suite_dir",
    "get_task",
    "is_pytest_command",
    "load_suite",
    "load_task",
    "load_task_folder",
    "nano_tasks",
    "register_suite",
]
