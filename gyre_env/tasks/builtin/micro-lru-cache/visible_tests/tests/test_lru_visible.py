"""Visible tests: the agent may run these while it works (the hidden suite is larger)."""

from lru import LRUCache


def test_example_from_the_spec():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert c.keys() == ["a", "c"]


def test_len_and_delete():
    c = LRUCache(3)
    c.put(1, "x")
    assert len(c) == 1
    assert c.delete(1) is True
    assert len(c) == 0
