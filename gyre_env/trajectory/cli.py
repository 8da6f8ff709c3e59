"""`gyre trajectories stats|export|import`: inspect and move stored trajectories.

Register with ``gyre_env.cli._COMMAND_MODULES``; heavy work is imported in the handlers.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_commands(sub) -> None:
    p = sub.add_parser("trajectories", help="inspect and export the trajectory store")
    tsub = p.add_subparsers(dest="trajectories_command", required=True)

    stats = tsub.add_parser("stats", help="counts, tokens, sharing ratio, outcome mix")
    _store_args(stats)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(func=_stats)

    export = tsub.add_parser("export", help="write matching episodes to Parquet")
    _store_args(export)
    export.add_argument("--out", required=True, help="Parquet file to write")
    export.add_argument(
        "--kind",
        choices=("calls", "nodes"),
        default="calls",
        help="one row per model call, or per token-tree node",
    )
    export.set_defaults(func=_export)

    imp = tsub.add_parser("import", help="append a proxy JSONL records file to the store")
    imp.add_argument("--store", required=True, help="path of the SQLite store (created if missing)")
    imp.add_argument("--records", required=True, help="JsonlSink file of CallRecords")
    imp.add_argument("--episodes", help="JSONL of EpisodeInfo objects (run, task, group, outcome)")
    imp.set_defaults(func=_import)


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="path of the SQLite trajectory store")
    p.add_argument("--run", help="only this run")
    p.add_argument("--task", help="only this task")
    p.add_argument("--group", help="only this group")
    p.add_argument("--outcome", help="only episodes with this outcome (unknown = unfinished)")
    p.add_argument("--weight-version", type=int, help="only episodes with calls of this version")


def _filters(args) -> dict:
    keys = ("run", "task", "group", "outcome", "weight_version")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def _open(args, readonly: bool = True):
    from gyre_env.trajectory.store import StoreError, TrajectoryStore

    try:
        return TrajectoryStore(args.store, readonly=readonly)
    except (FileNotFoundError, StoreError) as e:
        print(f"gyre trajectories: {e}", file=sys.stderr)
        return None


def _stats(args) -> int:
    store = _open(args)
    if store is None:
        return 1
    with store:
        s = store.stats(**_filters(args))
    if args.json:
        out = dict(vars(s), sharing=s.sharing)
        print(json.dumps(out, sort_keys=True))
        return 0
    mix = ", ".join(f"{k} {v}" for k, v in sorted(s.outcomes.items())) or "-"
    print(f"episodes        {s.episodes}  (groups {s.groups}, calls {s.calls})")
    print(f"outcomes        {mix}")
    print(f"call tokens     {s.call_tokens}  (prompt + output summed over calls)")
    print(f"stored tokens   {s.stored_tokens}  (after delta encoding)")
    print(f"flat tokens     {s.flat_tokens}  (every root-to-leaf path alone)")
    print(f"tree tokens     {s.tree_tokens}  (shared prefixes once)")
    print(f"sampled tokens  {s.sampled_tokens}")
    print(f"sharing         {s.sharing:.1%}  (1 - tree / flat)")
    if s.text_only_calls:
        print(
            f"text-only calls {s.text_only_calls}  (no token ids, e.g. an upstream "
            "passthrough: stored, not in the trees, never trained on)"
        )
    return 0


def _export(args) -> int:
    store = _open(args)
    if store is None:
        return 1
    with store:
        rows = store.export_parquet(args.out, kind=args.kind, **_filters(args))
    print(f"wrote {rows} {args.kind} rows to {args.out}")
    return 0


def _import(args) -> int:
    store = _open(args, readonly=False)
    if store is None:
        return 1
    with store:
        added = store.ingest_jsonl(args.records, args.episodes)
    print(f"added {added} calls to {args.store}")
    return 0
