"""Prefix caching for the embedded engine: the KV of recent prompts, reused by later ones.

An agent's calls share long prefixes: every attempt at a task starts with the same system
prompt and tool schemas, and each turn of an episode extends the previous one. After a
prompt is prefilled its per-layer keys and values are kept here (least recently used
first out, bounded by a total token count); a later prompt that starts with the same
tokens is prefilled only from where they differ. SGLang's radix cache does the same on a
GPU; this one is a flat list, enough for the few dozen prompts an embedded engine holds.

The kept tensors are the ones the prefill produced, never copied and never written to:
a ``DynamicCache`` grows by concatenation, so extending a reused prefix makes new tensors.
Entries are dropped when the weights change (their KV belongs to the old weights).
"""

from __future__ import annotations

import collections

import numpy as np


class PrefixCache:
    """Prompts' KV by token prefix; ``lookup`` gives the longest match, ``insert`` adds."""

    def __init__(self, max_tokens: int, min_match: int = 16, max_entries: int = 256):
        if max_tokens < 0:
            raise ValueError(f"prefix cache max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.max_entries = max(1, max_entries)  # a lookup compares against every entry
        self.min_match = max(1, min_match)
        self._entries: collections.OrderedDict[int, tuple[np.ndarray, list, list]] = (
            collections.OrderedDict()
        )
        self._next = 0
        self.tokens = 0
        self.lookups = 0
        self.hits = 0
        self.tokens_reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, context: list[int]) -> tuple[int, list, list] | None:
        """``(n, keys, values)``: per-layer ``[1, kv_heads, n, head_dim]`` KV of the first
        ``n`` tokens of ``context`` (at most ``len(context) - 1``: the last token is always
        computed, for its logits), or None when no entry shares ``min_match`` tokens."""
        self.lookups += 1
        if not self._entries or len(context) < 2:
            return None
        want = np.asarray(context, dtype=np.int64)
        best, best_key = 0, None
        for key, (tokens, _, _) in self._entries.items():
            n = min(len(tokens), len(want) - 1)
            differ = np.flatnonzero(tokens[:n] != want[:n])
            match = int(differ[0]) if len(differ) else n
            if match > best:
                best, best_key = match, key
        if best < self.min_match:
            return None
        self._entries.move_to_end(best_key)
        _, keys, values = self._entries[best_key]
        self.hits += 1
        self.tokens_reused += best
        return best, [k[:, :, :best, :] for k in keys], [v[:, :, :best, :] for v in values]

    def insert(self, context: list[int], keys: list, values: list) -> None:
        """Keep the KV of ``context`` (per layer ``[1, kv_heads, len(context), head_dim]``);
        entries that are a prefix of it are replaced, the oldest go beyond ``max_tokens``."""
        n = len(context)
        if n == 0 or n > self.max_tokens:
            return
        tokens = np.asarray(context, dtype=np.int64)
        for key, (old, _, _) in list(self._entries.items()):
            if len(old) <= n and np.array_equal(old, tokens[: len(old)]):
                self._drop(key)
        while self._entries and (
            self.tokens + n > self.max_tokens or len(self._entries) >= self.max_entries
        ):
            self._drop(next(iter(self._entries)))
        self._entries[self._next] = (tokens, list(keys), list(values))
        self._next += 1
        self.tokens += n

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def stats(self) -> dict:
        return {
            "entries": len(self._entries),
            "tokens": self.tokens,
            "lookups": self.lookups,
            "hits": self.hits,
            "tokens_reused": self.tokens_reused,
        }

    def _drop(self, key: int) -> None:
        tokens, _, _ = self._entries.pop(key)
        self.tokens -= len(tokens)
