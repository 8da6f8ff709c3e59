"""Training: ``gyre train`` and the pieces it drives (config, rollouts, gold replay,
checkpoints, metrics, report). Nothing heavy is imported here."""

from gyre_env.train.config import ConfigError, TrainConfig, apply_overrides, load_config

__all__ = ["ConfigError", "TrainConfig", "apply_overrides", "load_config", "train"]


def __getattr__(name: str):
    if name == "train":
        from gyre_env.train.loop import train

        return train
    raise AttributeError(f"module 'gyre_env.train' has no attribute {name!r}")
