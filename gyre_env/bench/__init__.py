"""``gyre bench``: run an agent over a task suite through Gyre's proxy and report scores
and where the time went.

- :mod:`~gyre_env.bench.config`: ``BenchConfig`` (every field is a ``gyre bench`` flag);
- :mod:`~gyre_env.bench.run`: ``run_bench(cfg)`` and ``select_tasks``;
- :mod:`~gyre_env.bench.summary`: the results table, JSON summary and HTML report;
- :mod:`~gyre_env.bench.cli`: the command line (``gyre bench`` = ``python -m gyre_env.bench``).

Importing this package imports none of its parts; the names below load on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BenchConfig": "config",
    "AGENTS": "config",
    "BenchRun": "run",
    "run_bench": "run",
    "select_tasks": "run",
    "summarize": "report",
    "format_summary": "report",
    "format_table": "report",
    "write_html": "report",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"gyre_env.bench.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'gyre_env.bench' has no attribute {name!r}")
