"""Registration of Gyre's Gymnasium env ids.

Env classes are referenced as ``"module:Class"`` strings, so registering imports nothing
heavy; Gymnasium imports the class on ``gym.make``.
"""

from __future__ import annotations

# id -> (entry point, default kwargs). Later issues add their envs here.
GYRE_ENVS: dict[str, tuple[str, dict]] = {}


def register_envs() -> None:
    """Register every Gyre env id (idempotent)."""
    import gymnasium as gym

    for env_id, (entry_point, kwargs) in GYRE_ENVS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))
