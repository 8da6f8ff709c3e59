"""Checkpoints with exact resume: trainer state, RNG states and the data cursor.

``ckpt.pt`` holds the trainer's state dict (model, optimizer, scheduler, version), the
Python / NumPy / torch RNG states and the cursor at the moment it was written;
``cursor.json`` may be newer (it is rewritten when an iteration's rollouts are in the
store, before any optimizer step, so a resume trains on those rollouts instead of
collecting new ones). The elastic phase keeps its own checkpoint, ``elastic.pt``
(:func:`save_elastic`). All are written to a temporary file and renamed, so a crash
never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gyre_env.config import ConfigError

ELASTIC_CHECKPOINT = "elastic.pt"
"""The elastic phase's checkpoint, in ``OUT/checkpoints``."""


@dataclass(kw_only=True)
class Cursor:
    """Where the run is: the next thing to do."""

    phase: str = "eval_random"
    """``eval_random`` -> ``sft_record`` -> ``sft_train`` -> ``rl`` -> ``done``."""
    sft_step: int = 0
    """SFT optimizer steps done."""
    iteration: int = 0
    """The RL iteration in progress (or next)."""
    minibatch: int = 0
    """Optimizer steps of this iteration already taken."""
    rollout_run: str | None = None
    """Store run tag of this iteration's rollouts once they are all in the store."""
    rl_step: int = 0
    """RL optimizer steps done overall."""
    resumes: int = 0
    """How often the run was resumed (keeps re-collected rollouts' run tags apart)."""


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` then rename to ``path``: a crash never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_checkpoint(folder: Path, trainer, cursor: Cursor, rng: np.random.Generator) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    state = {
        "trainer": trainer.state_dict(),
        "cursor": asdict(cursor),
        "rng": {
            "python": random.getstate(),
            "numpy": rng.bit_generator.state,
            "torch": torch.get_rng_state(),
        },
    }
    atomic_write(folder / "ckpt.pt", lambda p: torch.save(state, p))
    save_cursor(folder, cursor)
    return folder / "ckpt.pt"


def save_cursor(folder: Path, cursor: Cursor) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(asdict(cursor), indent=1)
    atomic_write(folder / "cursor.json", lambda p: p.write_text(text, encoding="utf-8"))


def load_checkpoint(folder: Path, trainer, rng: np.random.Generator) -> Cursor | None:
    """Restore ``trainer`` and the RNGs; returns the cursor (None: no checkpoint)."""
    import torch

    path = folder / "ckpt.pt"
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=False)
    trainer.load_state_dict(state["trainer"])
    random.setstate(state["rng"]["python"])
    rng.bit_generator.state = state["rng"]["numpy"]
    torch.set_rng_state(state["rng"]["torch"])
    cursor = Cursor(**state["cursor"])
    newer = folder / "cursor.json"
    if newer.is_file():
        later = Cursor(**json.loads(newer.read_text(encoding="utf-8")))
        if (later.iteration, later.minibatch, later.rl_step) == (
            cursor.iteration,
            cursor.minibatch,
            cursor.rl_step,
        ):
            cursor.rollout_run = later.rollout_run  # rollouts finished after the save
    return cursor


def check_resumable(cfg, saved_path: Path) -> None:
    """A checkpoint loads only into the backend and model shape that wrote it: say which
    differs (before: a raw state_dict error after the model was built). ``cfg``: the
    ``TrainConfig`` of the resumed run; ``saved_path``: the run's ``config.json``."""
    if not saved_path.is_file():
        return
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # an unreadable config.json: the checkpoint itself is what counts
    now = asdict(cfg)
    diffs = []
    for key in ("backend", "model"):
        was, new = saved.get(key, now[key]), now[key]
        if isinstance(was, dict) and isinstance(new, dict):
            diffs += [
                f"{key}.{k}: {was.get(k)!r} in the run, {new.get(k)!r} now"
                for k in new
                if k in was and was[k] != new[k]
            ]
        elif was != new:
            diffs.append(f"{key}: {was!r} in the run, {new!r} now")
    if diffs:
        raise ConfigError(
            f"--resume: {cfg.out_dir}'s checkpoint does not fit these settings ("
            + "; ".join(diffs)
            + "). Resume with the run's own settings, or start a new run with another --out"
        )


def save_elastic(folder: Path, trainer, version: int, driver_state, sampler_state) -> None:
    """The elastic phase's checkpoint: the core trainer's state, the weight version, the
    driver's ``DriverState`` and the task sampler's RNG state."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "trainer": trainer.state_dict(),
        "version": version,
        "driver": asdict(driver_state),
        "tasks_rng": sampler_state,
    }
    atomic_write(folder / ELASTIC_CHECKPOINT, lambda p: torch.save(data, p))


def load_elastic(cfg, folder: Path) -> dict | None:
    """The elastic checkpoint (None: the phase had not checkpointed); a checkpoint written
    under another backend or model shape is refused naming the difference."""
    import torch

    path = folder / ELASTIC_CHECKPOINT
    if not path.is_file():
        return None
    check_resumable(cfg, cfg.out_dir / "config.json")
    return torch.load(path, weights_only=False)
