"""`gyre sandbox ...` and `gyre images ...` commands."""

from __future__ import annotations


def add_commands(sub) -> None:
    pass
