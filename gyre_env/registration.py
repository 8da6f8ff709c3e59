"""Registration of Gyre's Gymnasium env ids.

Env classes are referenced as ``"module:Class"`` strings, so registering imports nothing
heavy; Gymnasium imports the class on ``gym.make``.
"""

from __future__ import annotations

_NL2REPO = "gyre_env.envs.nl2repo.env:NL2RepoEnv"

# id -> (entry point, default kwargs). Later issues add their envs here.
GYRE_ENVS: dict[str, tuple[str, dict]] = {
    # The built-in suite, all tiers; reward_mode="potential" (return == final score).
    "Gyre/NL2Repo-v0": (_NL2REPO, {}),
    # Micro tier only: one-module tasks graded in seconds, for quick RL runs.
    "Gyre/NL2Repo-micro-v0": (_NL2REPO, {"tier": "micro"}),
    "Gyre/NL2Repo-small-v0": (_NL2REPO, {"tier": "small"}),
    "Gyre/NL2Repo-repo-v0": (_NL2REPO, {"tier": "repo"}),
}

# id -> vector entry point used by gym.make_vec's default / "vector_entry_point" mode.
GYRE_VECTOR_ENTRY_POINTS: dict[str, str] = {
    env_id: "gyre_env.envs.nl2repo.vector:make_thread_vector_env"
    for env_id, (entry_point, _) in GYRE_ENVS.items()
    if entry_point == _NL2REPO
}


def register_envs() -> None:
    """Register every Gyre env id (idempotent)."""
    import gymnasium as gym

    for env_id, (entry_point, kwargs) in GYRE_ENVS.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point=entry_point,
                vector_entry_point=GYRE_VECTOR_ENTRY_POINTS.get(env_id),
                kwargs=dict(kwargs),
            )
