"""Gyre: Gymnasium environments and RL infrastructure for long-horizon coding agents.

Importing this package registers the ``Gyre/*`` environment ids with Gymnasium and does
nothing else: no torch, transformers, ray, docker or langgraph is imported here. Heavy
parts live in subpackages and import their extras lazily.
"""

from __future__ import annotations

from gyre_env._optional import MissingExtraError
from gyre_env.envs.nl2repo.registration import register_nano_env, register_task_env
from gyre_env.registration import register_envs

__version__ = "0.1.0"
__all__ = ["MissingExtraError", "__version__", "register_envs", "register_task_env"]

register_envs()
register_nano_env()
