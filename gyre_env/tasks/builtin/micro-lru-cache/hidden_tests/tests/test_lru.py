import pytest
from lru import LRUCache


def test_get_put_basic():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1
    assert c.get("missing") is None
    assert c.get("missing", 42) == 42


def test_eviction_order_follows_use():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert "b" not in c
    assert c.keys() == ["a", "c"]


def test_replace_does_not_evict_and_refreshes():
    evicted = []
    c = LRUCache(2, on_evict=lambda k, v: evicted.append((k, v)))
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    assert evicted == []
    assert c.keys() == ["b", "a"]
    c.put("c", 3)
    assert evicted == [("b", 2)]
    assert c.get("a") == 10


def test_on_evict_not_called_for_delete_or_clear():
    evicted = []
    c = LRUCache(3, on_evict=lambda k, v: evicted.append(k))
    c.put(1, "x")
    c.put(2, "y")
    assert c.delete(1) is True
    assert c.delete(1) is False
    c.clear()
    assert len(c) == 0
    assert evicted == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", None, True])
def test_bad_capacity(bad):
    with pytest.raises(ValueError):
        LRUCache(bad)


def test_contains_does_not_touch_recency():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert "a" in c
    c.put("c", 3)
    assert c.keys() == ["b", "c"]


def test_hits_misses_and_capacity_read_only():
    c = LRUCache(1)
    c.put("k", "v")
    c.get("k")
    c.get("k")
    c.get("nope")
    c.clear()
    assert (c.hits, c.misses) == (2, 1)
    assert c.capacity == 1
    with pytest.raises(AttributeError):
        c.capacity = 5
