"""Registering task folders as Gymnasium env ids. Light: imports gymnasium only.

    import gyre_env
    gyre_env.register_task_env("MyOrg/Parser-v0", "/data/tasks/my-parser")
    env = gym.make("MyOrg/Parser-v0")

The path may be one task folder (with ``task.toml`` and ``spec.md``) or a folder of task
folders; any ``NL2RepoEnv`` option can be fixed at registration (``reward_mode=``,
``sandbox_backend=``...) and overridden again in ``gym.make``. For an NL2RepoBench
checkout use ``suite="nl2repo", suite_kwargs={"checkout": ..., "tests": ...}`` instead of
a path: ``register_task_env("Me/NL2RepoBench-v0", suite="nl2repo", suite_kwargs=...)``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

ENTRY_POINT = "gyre_env.envs.nl2repo.env:NL2RepoEnv"
VECTOR_ENTRY_POINT = "gyre_env.envs.nl2repo.vector:make_thread_vector_env"

NANO_ENV_ID = "Gyre/NL2Repo-nano-v0"
NANO_KWARGS: dict[str, Any] = {
    "suite": "nano",
    "suite_kwargs": {"split": "train", "count": 256, "seed": 0},
    "tools": ["write_file", "run_tests", "submit"],
}
"""``Gyre/NL2Repo-nano-v0``: generated one-line-function tasks (``gyre_env.tasks.nano``)
with three tools, for tiny models; ``gym.make(..., suite_kwargs={"split": "heldout"})``."""


def register_nano_env() -> None:
    """Register ``Gyre/NL2Repo-nano-v0`` (idempotent; no task is generated until ``make``)."""
    import gymnasium as gym

    if NANO_ENV_ID not in gym.registry:
        gym.register(
            id=NANO_ENV_ID,
            entry_point=ENTRY_POINT,
            vector_entry_point=VECTOR_ENTRY_POINT,
            kwargs=copy.deepcopy(NANO_KWARGS),
        )


def register_task_env(env_id: str, path: str | Path | None = None, **options: Any) -> None:
    """Register ``env_id`` as an ``NL2RepoEnv`` over the tasks at ``path``.

    The tasks are loaded once here, so a malformed folder fails now with the loader's
    message rather than at ``gym.make``. Re-registering an id replaces it.
    """
    import gymnasium as gym
    from gyre_env.envs.nl2repo.env import NL2RepoConfig, load_tasks

    kwargs = dict(options)
    if path is not None:
        folder = Path(path).expanduser().resolve()
        if not folder.is_dir():
            raise FileNotFoundError(f"no task folder at {folder}")
        kwargs["task_path"] = str(folder)
    load_tasks(NL2RepoConfig.from_kwargs(**kwargs))  # bad options or tasks fail here
    if env_id in gym.registry:
        del gym.registry[env_id]
    gym.register(
        id=env_id, entry_point=ENTRY_POINT, vector_entry_point=VECTOR_ENTRY_POINT, kwargs=kwargs
    )
