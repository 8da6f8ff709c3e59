"""The NL2Repo env family: ``Gyre/NL2Repo-v0`` and its variants.

Light on import (``register_task_env`` is re-exported by ``gyre_env``); the env, its
config and the thread vector env load on first use.
"""

from __future__ import annotations

from gyre_env.envs.nl2repo.registration import register_task_env

__all__ = ["EnvInfraError", "NL2RepoConfig", "NL2RepoEnv", "ThreadVectorEnv", "register_task_env"]


def __getattr__(name: str):
    if name in ("NL2RepoEnv", "NL2RepoConfig", "EnvInfraError"):
        from gyre_env.envs.nl2repo import env

        return getattr(env, name)
    if name == "ThreadVectorEnv":
        from gyre_env.envs.nl2repo.vector import ThreadVectorEnv

        return ThreadVectorEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
