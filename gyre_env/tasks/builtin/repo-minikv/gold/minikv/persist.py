"""JSON snapshots of a store."""

import json
import os
import tempfile
import time


def save_snapshot(store, path):
    keys = {}
    for key in store.keys():
        kind, value = store.data[key]
        if kind == "list":
            value = list(value)
        elif kind == "hash":
            value = dict(value)
        elif kind == "set":
            value = sorted(value)
        keys[key] = {"type": kind, "value": value, "ttl_ms": store.ttl_ms(key)}
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".snapshot-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"version": 1, "keys": keys}, f)
    os.replace(tmp, path)


def _check_value(kind, value):
    if kind == "string":
        return isinstance(value, str)
    if kind in ("list", "set"):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "hash":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    return False


def load_snapshot(path, clock=time.monotonic):
    from minikv.store import Store

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot load snapshot {path}: {e}") from e
    if (
        not isinstance(data, dict)
        or data.get("version") != 1
        or not isinstance(data.get("keys"), dict)
    ):
        raise ValueError(f"{path}: not a minikv snapshot")
    store = Store(clock)
    now = clock()
    for key, entry in data["keys"].items():
        if not isinstance(entry, dict) or not _check_value(entry.get("type"), entry.get("value")):
            raise ValueError(f"{path}: bad entry for key {key!r}")
        kind, value = entry["type"], entry["value"]
        if kind == "set":
            value = set(value)
        elif kind == "list":
            value = list(value)
        store.data[key] = (kind, value)
        ttl = entry.get("ttl_ms")
        if ttl is not None:
            if not isinstance(ttl, (int, float)):
                raise ValueError(f"{path}: bad ttl_ms for key {key!r}")
            store.expires[key] = now + ttl / 1000.0
    return store
