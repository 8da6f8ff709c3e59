"""``ThreadVectorEnv``: a ``SyncVectorEnv`` whose sub-envs step at the same time in threads.

An NL2Repo step is mostly waiting on a sandbox (a command, a grading run), so threads
overlap the waits without the pickling and processes of ``AsyncVectorEnv``. Results are
the same as ``SyncVectorEnv``'s (same order, same autoreset semantics).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import concatenate, iterate


class ThreadVectorEnv(SyncVectorEnv):
    """Steps and resets all sub-envs concurrently, one thread each."""

    def __init__(self, env_fns, *, max_workers: int | None = None, **kwargs: Any):
        env_fns = list(env_fns)
        self._pool = ThreadPoolExecutor(
            max_workers=max_workers or len(env_fns), thread_name_prefix="gyre-vec"
        )
        # Build the sub-envs (and their task lists) concurrently too.
        envs = list(self._pool.map(lambda fn: fn(), env_fns))
        super().__init__([lambda env=env: env for env in envs], **kwargs)

    def reset(self, *, seed=None, options=None):
        if seed is None:
            seed = [None] * self.num_envs
        elif isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"got {len(seed)} seeds for num_envs={self.num_envs}")
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is None:
            mask = np.ones(self.num_envs, dtype=np.bool_)
        elif not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.any()):
            raise TypeError("options['reset_mask'] must be a non-empty boolean numpy array")
        self._terminations[mask] = False
        self._truncations[mask] = False
        self._autoreset_envs[mask] = False
        todo = [i for i in range(self.num_envs) if mask[i]]
        results = self._pool.map(
            lambda i: self.envs[i].reset(seed=seed[i], options=options or None), todo
        )
        infos: dict = {}
        for i, (obs, info) in zip(todo, results, strict=True):
            self._env_obs[i] = obs
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(
            self.single_observation_space, self._env_obs, self._observations
        )
        return deepcopy(self._observations) if self.copy else self._observations, infos

    def _one(self, i: int, action: Any):
        env = self.envs[i]
        if self.autoreset_mode == AutoresetMode.NEXT_STEP and self._autoreset_envs[i]:
            obs, info = env.reset()
            return obs, 0.0, False, False, info, None
        if self.autoreset_mode == AutoresetMode.DISABLED and self._autoreset_envs[i]:
            raise RuntimeError(f"sub-env {i} is done; reset it (autoreset is disabled)")
        obs, reward, terminated, truncated, info = env.step(action)
        final = None
        if self.autoreset_mode == AutoresetMode.SAME_STEP and (terminated or truncated):
            final = {"final_obs": obs, "final_info": info}
            obs, info = env.reset()
        return obs, reward, terminated, truncated, info, final

    def step(self, actions):
        actions = list(iterate(self.action_space, actions))
        results = list(self._pool.map(self._one, range(self.num_envs), actions))
        infos: dict = {}
        for i, (obs, reward, term, trunc, info, final) in enumerate(results):
            self._env_obs[i] = obs
            self._rewards[i], self._terminations[i], self._truncations[i] = reward, term, trunc
            if final is not None:
                infos = self._add_info(infos, final, i)
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(
            self.single_observation_space, self._env_obs, self._observations
        )
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (
            deepcopy(self._observations) if self.copy else self._observations,
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            infos,
        )

    def close_extras(self, **kwargs: Any) -> None:
        try:
            list(self._pool.map(lambda env: env.close(), self.envs))
        finally:
            self._pool.shutdown(wait=True)


def make_thread_vector_env(num_envs: int = 1, **env_kwargs: Any) -> ThreadVectorEnv:
    """The ``vector_entry_point`` of ``Gyre/NL2Repo-*``: ``num_envs`` envs with equal kwargs."""
    from gyre_env.envs.nl2repo.env import NL2RepoEnv

    env_kwargs.pop("max_episode_steps", None)
    return ThreadVectorEnv([lambda: NL2RepoEnv(**dict(env_kwargs)) for _ in range(num_envs)])
