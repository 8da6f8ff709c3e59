"""The ``gyre`` command. Each subsystem adds its subcommands in ``_build_parser``."""

from __future__ import annotations

import argparse
import sys

# Each module defines add_commands(subparsers) and imports its heavy parts inside handlers.
_COMMAND_MODULES = [
    "gyre_env.sandbox.cli",
    "gyre_env.tasks.cli",
    "gyre_env.proxy.cli",
    "gyre_env.trajectory.cli",
    "gyre_env.bench.cli",
    "gyre_env.train.cli",
    "gyre_env.sim.cli",
]
# Subcommands a folder adds under another module's command: module -> the command module
# whose add_commands returned the subparsers they go on (`gyre tasks check` needs sandboxes
# and scoring, which tasks/ does not import).
_SUBCOMMAND_MODULES = {"gyre_env.scoring.cli": "gyre_env.tasks.cli"}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gyre", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    import importlib

    added = {m: importlib.import_module(m).add_commands(sub) for m in _COMMAND_MODULES}
    for module, parent in _SUBCOMMAND_MODULES.items():
        importlib.import_module(module).add_commands(added[parent])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from gyre_env import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
