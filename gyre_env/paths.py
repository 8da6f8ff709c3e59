"""Where Gyre keeps what it builds once and reuses (the tiny model, generated tasks)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$GYRE_CACHE`` if set, else ``~/.cache/gyre``."""
    env = os.environ.get("GYRE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gyre"
