"""Training: the drivers of ``gyre train`` and the building blocks they share.

- ``loop``: the synchronous loop, a short program over ``run.TrainRun`` (the run's
  state, a method per phase); ``elastic``: the RL phase on elastic cells
  (``--elastic``), after the synchronous loop's warm start;
- shared by both: ``setup`` (model folder, task pool, store, trainer, model service,
  agent, logger), ``rollout`` (episodes), ``gold`` (gold replay and SFT batches),
  ``checkpoint``, ``metrics``, ``report``; ``config`` and ``cli``.

Nothing heavy is imported here."""

from gyre_env.train.config import ConfigError, TrainConfig, apply_overrides, load_config

__all__ = ["ConfigError", "TrainConfig", "apply_overrides", "load_config", "train"]


def __getattr__(name: str):
    if name == "train":
        from gyre_env.train.loop import train

        return train
    raise AttributeError(f"module 'gyre_env.train' has no attribute {name!r}")
