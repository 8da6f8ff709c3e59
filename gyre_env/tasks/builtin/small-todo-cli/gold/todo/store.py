"""Todo items kept in a JSON file."""

import copy
import datetime
import json
import os

PRIORITIES = ("low", "normal", "high")
_PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}
_UNSET = object()


class TodoError(Exception):
    pass


class NotFoundError(TodoError):
    pass


def _check_title(title):
    if not isinstance(title, str) or not title.strip():
        raise ValueError("title must not be empty")
    return title.strip()


def _check_priority(priority):
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
    return priority


def _check_due(due):
    if due is None:
        return None
    try:
        if not isinstance(due, str) or len(due) != 10:
            raise ValueError
        datetime.date.fromisoformat(due)
    except ValueError:
        raise ValueError(f"invalid date {due!r} (expected YYYY-MM-DD)") from None
    return due


class TodoStore:
    def __init__(self, path):
        self.path = os.fspath(path)
        self._next_id = 1
        self._items = []
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            self._next_id = data["next_id"]
            self._items = data["items"]

    def _save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"next_id": self._next_id, "items": self._items}, f, indent=1)
        os.replace(tmp, self.path)

    def _find(self, item_id):
        for item in self._items:
            if item["id"] == item_id:
                return item
        raise NotFoundError(f"no item #{item_id}")

    def add(self, title, priority="normal", due=None, tags=()):
        item = {
            "id": self._next_id,
            "title": _check_title(title),
            "priority": _check_priority(priority),
            "due": _check_due(due),
            "tags": sorted(set(tags)),
            "done": False,
        }
        self._next_id += 1
        self._items.append(item)
        self._save()
        return copy.deepcopy(item)

    def get(self, item_id):
        return copy.deepcopy(self._find(item_id))

    def list(self, status="open", tag=None, sort="id"):
        if status not in ("open", "done", "all"):
            raise ValueError(f"unknown status {status!r}")
        keys = {
            "id": lambda i: i["id"],
            "priority": lambda i: (_PRIORITY_RANK[i["priority"]], i["id"]),
            "due": lambda i: (i["due"] is None, i["due"] or "", i["id"]),
        }
        if sort not in keys:
            raise ValueError(f"unknown sort {sort!r}")
        items = [
            i
            for i in self._items
            if (status == "all" or i["done"] == (status == "done"))
            and (tag is None or tag in i["tags"])
        ]
        return copy.deepcopy(sorted(items, key=keys[sort]))

    def _set(self, item_id, **fields):
        item = self._find(item_id)
        item.update(fields)
        self._save()
        return copy.deepcopy(item)

    def complete(self, item_id):
        return self._set(item_id, done=True)

    def reopen(self, item_id):
        return self._set(item_id, done=False)

    def edit(self, item_id, *, title=None, priority=None, due=_UNSET, tags=None):
        self._find(item_id)
        fields = {}
        if title is not None:
            fields["title"] = _check_title(title)
        if priority is not None:
            fields["priority"] = _check_priority(priority)
        if due is not _UNSET:
            fields["due"] = _check_due(due)
        if tags is not None:
            fields["tags"] = sorted(set(tags))
        return self._set(item_id, **fields)

    def remove(self, item_id):
        item = self._find(item_id)
        self._items.remove(item)
        self._save()
        return copy.deepcopy(item)

    def overdue(self, today):
        return [
            copy.deepcopy(i)
            for i in self._items
            if not i["done"] and i["due"] and datetime.date.fromisoformat(i["due"]) < today
        ]
