"""PrefixCache on its own: longest match, the last token always left to compute, LRU bound."""

from __future__ import annotations

import pytest
import torch

from gyre_env.engines.prefix_cache import PrefixCache


def _kv(n, layers=2):
    """Per-layer [1, kv_heads=1, n, head_dim=2] tensors whose values name their position."""
    t = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(1, 1, n, 2)
    return [t.clone() for _ in range(layers)], [t.clone() + 0.5 for _ in range(layers)]


def test_longest_match_and_the_last_token_is_left_to_compute():
    cache = PrefixCache(max_tokens=1000, min_match=3)
    a = list(range(10))
    b = list(range(6)) + [99, 98]
    cache.insert(a, *_kv(len(a)))
    cache.insert(b, *_kv(len(b)))
    n, keys, values = cache.lookup(list(range(8)) + [7, 7])
    assert n == 8 and keys[0].shape == (1, 1, 8, 2) and float(keys[1][0, 0, -1, 0]) == 7.0
    assert float(values[0][0, 0, -1, 0]) == 7.5
    n, _, _ = cache.lookup(list(range(6)) + [99, 98, 1])
    assert n == 8  # b matched whole
    assert cache.lookup(a)[0] == 9  # identical prompt: its last token still needs logits
    assert cache.lookup([0, 1, 50]) is None  # 2 shared tokens < min_match
    assert cache.lookup([5]) is None
    assert cache.stats()["hits"] == 3


def test_bound_by_tokens_oldest_out_and_prefixes_replaced():
    cache = PrefixCache(max_tokens=25, min_match=1)
    cache.insert(list(range(10)), *_kv(10))
    cache.insert(list(range(12)), *_kv(12))  # extends the first: replaces it
    assert len(cache) == 1 and cache.tokens == 12
    cache.insert([50 + i for i in range(10)], *_kv(10))
    assert cache.tokens == 22
    cache.lookup(list(range(5)))  # touch the first: the other is now the oldest
    cache.insert([80 + i for i in range(10)], *_kv(10))
    assert cache.tokens == 22 and cache.lookup([50, 51, 52]) is None
    assert cache.lookup([0, 1, 2])[0] == 2  # at most all but the last token
    cache.insert(list(range(100, 140)), *_kv(40))  # larger than the whole cache: not kept
    assert cache.tokens == 22
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0 and cache.lookup([0, 1, 2]) is None
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        PrefixCache(-1)
    few = PrefixCache(max_tokens=1000, min_match=1, max_entries=2)  # short prompts: by count
    for i in range(3):
        few.insert([100 * i + t for t in range(5)], *_kv(5))
    assert len(few) == 2 and few.lookup([0, 1, 2]) is None and few.lookup([200, 201, 9])[0] == 2
