import datetime
import json

import pytest
import todo.store as store_mod


@pytest.fixture
def store(tmp_path):
    return store_mod.TodoStore(tmp_path / "todo.json")


def test_add_returns_full_item(store):
    item = store.add(
        "  Buy milk ", priority="high", due="2024-05-01", tags=["shop", "home", "shop"]
    )
    assert item == {
        "id": 1,
        "title": "Buy milk",
        "priority": "high",
        "due": "2024-05-01",
        "tags": ["home", "shop"],
        "done": False,
    }


def test_ids_increase_and_are_never_reused(store):
    assert store.add("a")["id"] == 1
    assert store.add("b")["id"] == 2
    store.remove(2)
    assert store.add("c")["id"] == 3


def test_persists_after_every_change(tmp_path):
    path = tmp_path / "t.json"
    s = store_mod.TodoStore(path)
    s.add("a")
    s.add("b")
    s.complete(1)
    again = store_mod.TodoStore(str(path))
    assert [i["done"] for i in again.list("all")] == [True, False]
    data = json.loads(path.read_text())
    assert data["next_id"] == 3 and len(data["items"]) == 2


def test_missing_file_is_empty_and_not_created_until_change(tmp_path):
    path = tmp_path / "none.json"
    s = store_mod.TodoStore(path)
    assert s.list("all") == []
    assert not path.exists()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"title": "   "},
        {"title": "x", "priority": "urgent"},
        {"title": "x", "due": "2024-13-01"},
        {"title": "x", "due": "2024-5-1"},
        {"title": "x", "due": "tomorrow"},
    ],
)
def test_add_validation(store, kwargs):
    with pytest.raises(ValueError):
        store.add(**kwargs)


def test_not_found_everywhere(store):
    store.add("a")
    for call in (
        store.get,
        store.complete,
        store.reopen,
        store.remove,
        lambda i: store.edit(i, title="x"),
    ):
        with pytest.raises(store_mod.NotFoundError) as info:
            call(9)
        assert str(info.value) == "no item #9"
        assert isinstance(info.value, store_mod.TodoError)


def test_list_status_and_tag(store):
    store.add("a", tags=["x"])
    store.add("b")
    store.add("c", tags=["x"])
    store.complete(3)
    assert [i["id"] for i in store.list()] == [1, 2]
    assert [i["id"] for i in store.list("done")] == [3]
    assert [i["id"] for i in store.list("all", tag="x")] == [1, 3]
    with pytest.raises(ValueError):
        store.list("pending")


def test_sort_by_priority_then_id(store):
    store.add("a", priority="low")
    store.add("b", priority="high")
    store.add("c")
    store.add("d", priority="high")
    assert [i["title"] for i in store.list(sort="priority")] == ["b", "d", "c", "a"]


def test_sort_by_due_none_last(store):
    store.add("a")
    store.add("b", due="2024-03-01")
    store.add("c", due="2024-01-15")
    store.add("d")
    assert [i["title"] for i in store.list(sort="due")] == ["c", "b", "a", "d"]
    with pytest.raises(ValueError):
        store.list(sort="title")


def test_edit_fields_and_due_semantics(store):
    store.add("a", due="2024-01-01", tags=["t"])
    item = store.edit(1, title="A2", priority="low")
    assert (item["title"], item["priority"], item["due"], item["tags"]) == (
        "A2",
        "low",
        "2024-01-01",
        ["t"],
    )
    assert store.edit(1, due=None)["due"] is None
    assert store.edit(1, tags=["z", "y"])["tags"] == ["y", "z"]
    with pytest.raises(ValueError):
        store.edit(1, priority="meh")


def test_complete_reopen_and_remove(store):
    store.add("a")
    assert store.complete(1)["done"] is True
    assert store.complete(1)["done"] is True
    assert store.reopen(1)["done"] is False
    assert store.remove(1)["title"] == "a"
    assert store.list("all") == []


def test_returned_items_are_copies(store):
    store.add("a", tags=["t"])
    got = store.get(1)
    got["title"] = "changed"
    got["tags"].append("u")
    assert store.get(1)["title"] == "a" and store.get(1)["tags"] == ["t"]


def test_overdue(store):
    store.add("past", due="2024-01-01")
    store.add("future", due="2030-01-01")
    store.add("done past", due="2020-01-01")
    store.add("no due")
    store.complete(3)
    today = datetime.date(2024, 6, 1)
    assert [i["title"] for i in store.overdue(today)] == ["past"]
