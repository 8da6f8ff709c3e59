"""The Megatron-core training backend (``pip install 'gyre-env[megatron]'``).

``MegatronTrainer`` implements the ``Trainer`` protocol over a megatron-core ``GPTModel``
built from the served Hugging Face model; see ``trainer`` for the design, ``convert`` for
the weight mapping, ``forward`` for packed-tree attention and ``cpu_shim`` for what is
patched to run on a CPU. Importing this package imports neither torch nor megatron.
"""

from __future__ import annotations

__all__ = ["MegatronTrainer", "MegatronTrainerConfig"]


def __getattr__(name: str):
    if name in __all__:
        from gyre_env._optional import require

        require("megatron.core", "the Megatron trainer")
        from gyre_env.trainers.megatron import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
