"""Packing: a training unit -> flat token arrays plus a tree attention structure.

Nodes are laid out in depth-first preorder, so every node's subtree is one contiguous
range of the packed sequence. That gives the whole attention structure in one array:
token ``k`` is an ancestor-or-self of token ``q`` exactly when
``k <= q < subtree_end[k]``. From it come a dense ``[n, n]`` boolean mask (small
inputs) and a ``flex_attention`` ``BlockMask`` computed block-by-block without ever
materialising ``n x n`` (large inputs; flex_attention trains on GPU only). The CPU
training kernel in ``gyre_env.trainers.tree_attention`` walks ``parent_index`` instead.
``gyre_env.trainers.hf_tree`` feeds any of the three to the Hugging Face model the engine
serves (``attention_for`` picks one, ``tree_logprobs`` runs the packed forward).

Positions are depths in the tree, so a token sees the same positions and the same keys
it would see in its own path alone: one packed forward gives every path's logprobs.
Because a node may have several children, the logits that predict token ``i`` sit at
``parent_index[i]`` (not ``i - 1``).

``pack(unit, flat=True)`` lays out the same unit the way systems without tree training
do - every root-to-leaf path its own sequence with its full prefix - with the same loss
on the same tokens, for comparison and tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gyre_env.trajectory.sampling import TrainingUnit, UnitPart


@dataclass(kw_only=True)
class PackedTree:
    """Token-level arrays of one packed unit (numpy; ``tensors()`` for torch)."""

    input_ids: np.ndarray
    """[n] int64 token ids."""
    position_ids: np.ndarray
    """[n] int64 depth of each token in its tree (0 at a root)."""
    parent_index: np.ndarray
    """[n] int64 index of the token before this one on its path; -1 at a root."""
    subtree_end: np.ndarray
    """[n] int64 exclusive end of the range of tokens that see this token."""
    loss_mask: np.ndarray
    """[n] bool: the token was sampled and carries its loss in this unit."""
    advantages: np.ndarray
    """[n] float32 weight-averaged advantage of the calls that sampled the token."""
    weights: np.ndarray
    """[n] float32 sum of the role weights of those calls (0 where no loss)."""
    seq_weights: np.ndarray
    """[n] float32 sum over those calls of role weight / the call's sampled length: the
    coefficients of a sequence-level (per-call mean) loss."""
    behaviour_logprobs: np.ndarray
    """[n] float32 logprob under the sampling policy (0 for prompt tokens)."""
    weight_versions: np.ndarray
    """[n] int32 policy version that sampled the token; -1 for prompt tokens."""
    tree_index: np.ndarray
    """[n] int32 which part (tree) of the unit the token belongs to."""
    node_ids: np.ndarray
    """[n] int32 the token's node in that tree (with ``position_ids``, a unique key)."""
    proximal_logprobs: np.ndarray | None = None
    """[n] float32 logprob under decoupled PPO's proximal policy (0 where no loss), or
    None: set by ``Trainer.set_proximal`` once, at the start of an iteration's updates,
    and held fixed across its minibatches."""

    def __len__(self) -> int:
        return len(self.input_ids)

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a unit sent to a Ray actor): arrays that arrive as read-only views
        of Ray's object store are copied, since torch warns on every tensor made over
        memory it may not write."""
        self.__dict__.update({k: _writable(v) for k, v in state.items()})

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def tensors(self, device: str = "cpu") -> dict:
        """The arrays as torch tensors (import torch lazily)."""
        from gyre_env._optional import require

        torch = require("torch", "tree packing for training")
        return {
            name: torch.as_tensor(getattr(self, name), device=device)
            for name in self.__dataclass_fields__
            if getattr(self, name) is not None
        }

    def dense_mask(self, device: str = "cpu"):
        """[n, n] bool, True where query row may attend key column. O(n^2) memory."""
        from gyre_env._optional import require

        torch = require("torch", "tree attention masks")
        idx = torch.arange(len(self), device=device)
        end = torch.as_tensor(self.subtree_end, device=device)
        return (idx[None, :] <= idx[:, None]) & (idx[:, None] < end[None, :])

    def block_structure(self, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(nonempty, full)`` ``[nb, nb]`` block pairs; see ``block_structure``."""
        return block_structure(self.subtree_end, block_size)

    def block_mask(self, block_size: int = 128, device: str = "cpu"):
        """A ``flex_attention`` ``BlockMask`` for this tree, built in O((n/block)^2).

        ``create_block_mask`` would evaluate the mask on every (query, key) pair; here
        the block lists come from ``block_structure`` and only partial blocks consult
        the ancestor rule.
        """
        from gyre_env._optional import require

        torch = require("torch", "flex_attention block masks")
        from torch.nn.attention.flex_attention import BlockMask

        nonempty, full = self.block_structure(block_size)
        partial = nonempty & ~full
        end = torch.as_tensor(self.subtree_end, device=device)
        n = len(self)

        def mask_mod(b, h, q_idx, kv_idx):
            kv = torch.clamp(kv_idx, max=n - 1)
            return (kv_idx <= q_idx) & (q_idx < end[kv])

        def as_blocks(sel: np.ndarray):
            counts = torch.as_tensor(sel.sum(axis=1), dtype=torch.int32)
            order = np.argsort(~sel, axis=1, kind="stable").astype(np.int32)
            return counts[None, None], torch.as_tensor(order)[None, None]

        kv_num, kv_idx = as_blocks(partial)
        full_num, full_idx = as_blocks(full)
        mask = BlockMask.from_kv_blocks(
            kv_num,
            kv_idx,
            full_num,
            full_idx,
            BLOCK_SIZE=block_size,
            mask_mod=mask_mod,
            seq_lengths=(n, n),
        )
        return mask.to(device)


def block_structure(subtree_end: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Which (query block, key block) pairs attend at all, and which attend fully.

    Returns two ``[nb, nb]`` bool arrays ``(nonempty, full)``. Key block ``kb`` before
    query block ``qb`` is touched iff some key's subtree reaches into ``qb``, full iff
    every key's subtree covers all of ``qb``; diagonal blocks are always partial.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    subtree_end = np.asarray(subtree_end, dtype=np.int64)
    n = len(subtree_end)
    nb = -(-n // block_size)
    pad = nb * block_size - n
    max_end = np.concatenate([subtree_end, np.zeros(pad, np.int64)]).reshape(nb, -1).max(axis=1)
    min_end = np.concatenate([subtree_end, np.full(pad, n, np.int64)]).reshape(nb, -1).min(axis=1)
    q_lo = np.arange(nb) * block_size
    q_hi = np.minimum(q_lo + block_size, n)
    below = np.arange(nb)[None, :] < np.arange(nb)[:, None]  # [qb, kb]: kb < qb
    nonempty = (below & (max_end[None, :] > q_lo[:, None])) | np.eye(nb, dtype=bool)
    full = below & (min_end[None, :] >= q_hi[:, None])
    return nonempty, full


@dataclass
class _Entry:
    part: UnitPart
    node: int
    parent: int  # entry index of the parent span, -1 at a root
    loss: bool


def pack(unit: TrainingUnit, *, flat: bool = False) -> PackedTree:
    """Lay out ``unit`` as one packed tree (or, ``flat=True``, as one sequence per path)."""
    entries = _flat_entries(unit) if flat else _tree_entries(unit)
    if not entries:
        raise ValueError("cannot pack an empty training unit")
    lengths = np.array([len(e.part.tree.nodes[e.node]) for e in entries], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    ends = offsets + lengths
    sub_end = ends.copy()
    for i in range(len(entries) - 1, -1, -1):  # children follow parents in preorder
        p = entries[i].parent
        if p >= 0:
            sub_end[p] = max(sub_end[p], sub_end[i])
    start_depth = np.zeros(len(entries), np.int64)
    for i, e in enumerate(entries):
        if e.parent >= 0:
            start_depth[i] = start_depth[e.parent] + lengths[e.parent]
    part_index = {id(p): i for i, p in enumerate(unit.parts)}
    cols = []
    for i, e in enumerate(entries):
        parent_last = offsets[e.parent] + lengths[e.parent] - 1 if e.parent >= 0 else -1
        col = _entry_arrays(
            e, offsets[i], parent_last, start_depth[i], unit.role_weights, unit.negative_tokens
        )
        col["subtree_end"] = np.full(lengths[i], sub_end[i], np.int64)
        col["tree_index"] = np.full(lengths[i], part_index[id(e.part)], np.int32)
        col["node_ids"] = np.full(lengths[i], e.node, np.int32)
        cols.append(col)
    return PackedTree(**{k: np.concatenate([c[k] for c in cols]) for k in cols[0]})


def _entry_arrays(
    e: _Entry,
    offset: int,
    parent_last: int,
    depth0: int,
    role_weights: dict[str, float],
    negative_tokens: str = "all",
) -> dict:
    """Token arrays of one laid-out node, loss coefficients summed over its samplers."""
    node = e.part.tree.nodes[e.node]
    n = len(node)
    parent_index = np.arange(offset - 1, offset + n - 1, dtype=np.int64)
    parent_index[0] = parent_last
    weight, adv, seq_weight = 0.0, 0.0, 0.0
    if e.loss and node.sampled:
        for session, call, role in node.samplers:
            if session in e.part.advantages:
                w = role_weights[role]
                weight += w
                adv += w * e.part.advantages[session]
                seq_weight += w / max(e.part.tree.output_len.get((session, call), n), 1)
        adv = adv / weight if weight else 0.0
    loss = np.full(n, weight > 0)
    loss &= parent_index >= 0
    if adv < -1e-9 and negative_tokens == "branch":
        tree = e.part.tree
        loss[1:] = False  # a below-mean span trains only the token where it parted
        if len(tree.nodes[node.parent].children) < 2:
            loss[0] = False  # not a parting: a call boundary or an unshared span
    return {
        "input_ids": node.tokens.astype(np.int64),
        "position_ids": np.arange(depth0, depth0 + n, dtype=np.int64),
        "parent_index": parent_index,
        "loss_mask": loss,
        "advantages": np.where(loss, adv, 0.0).astype(np.float32),
        "weights": np.where(loss, weight, 0.0).astype(np.float32),
        "seq_weights": np.where(loss, seq_weight, 0.0).astype(np.float32),
        "behaviour_logprobs": (
            node.logprobs.astype(np.float32) if node.sampled else np.zeros(n, np.float32)
        ),
        "weight_versions": np.full(n, node.weight_version, np.int32),
    }


def _tree_entries(unit: TrainingUnit) -> list[_Entry]:
    entries: list[_Entry] = []
    for part in unit.parts:
        index: dict[int, int] = {}
        for node_id in part.nodes:
            parent = part.tree.nodes[node_id].parent
            index[node_id] = len(entries)
            loss = node_id in part.loss_nodes
            entries.append(_Entry(part, node_id, index.get(parent, -1), loss))
    return entries


def _flat_entries(unit: TrainingUnit) -> list[_Entry]:
    """Each root-to-leaf path of the unit as its own chain; a loss counted once."""
    entries: list[_Entry] = []
    for part in unit.parts:
        chosen = set(part.nodes)
        leaves = [
            n
            for n in part.nodes
            if not any(c in chosen for c in part.tree.nodes[n].children.values())
        ]
        counted: set[int] = set()
        for leaf in leaves:
            parent = -1
            for node_id in part.tree.path(leaf):
                loss = node_id in part.loss_nodes and node_id not in counted
                counted.add(node_id)
                entries.append(_Entry(part, node_id, parent, loss))
                parent = len(entries) - 1
    return entries


def loss_token_lags(units, version: int) -> dict[int, int]:
    """Loss tokens of packed ``units`` by weight-version lag behind ``version`` (the
    staleness histogram both training drivers report)."""
    lags: dict[int, int] = {}
    for u in units:
        lag = version - u.weight_versions[u.loss_mask]
        for value, count in zip(*np.unique(lag, return_counts=True), strict=True):
            lags[int(value)] = lags.get(int(value), 0) + int(count)
    return lags


def _writable(a):
    """``a``, copied when it is a read-only array."""
    return a if getattr(a, "flags", None) is None or a.flags.writeable else a.copy()
