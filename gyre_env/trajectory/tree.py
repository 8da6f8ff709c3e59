"""Token trees: the calls of one GRPO group, stored once per distinct prefix.

A ``TokenTree`` holds every model call of the episodes in one group (the episodes of one
task that share a prompt). Each call's context (``prompt_ids + output_ids``) is a path
from the root; calls are inserted as in a radix tree, so any common prefix - the
group's shared prompt, the earlier turns a later call extends, the main context a
sub-agent branches from - is stored once. A call that does not extend an earlier one
simply diverges at its longest common prefix and starts a branch. Within a session the
record already says which earlier call a prompt extends (``parent``, ``prefix_len``): such
a call is inserted from its parent's end and only its new tokens are compared; the radix
walk from the root is for what no record knows, the prompt a group's episodes share.

Node boundaries always fall on call-segment boundaries, so every node is uniform: all
its tokens are prompt tokens, or all were sampled by the same calls (the loss mask).
A sampled node carries the behaviour logprobs and weight version of the call that
first sampled it; identical contexts give identical distributions, so a second
sampler of the same tokens only adds itself to ``samplers``.

Episodes are described by ``EpisodeInfo`` (run, task, group, outcome, reward, step
rewards; defined in ``gyre_env.trajectory.records``). The proxy's ``CallRecord`` carries none of that; it comes from the runner, or,
failing that, from ``record.extra`` keys ``run``/``task``/``group``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gyre_env.trajectory.records import (
    BranchRole,
    CallRecord,
    EpisodeInfo,
    read_episodes_jsonl,
    read_jsonl,
)

ROLES: tuple[str, ...] = ("main", "sub-agent", "summary")
_ROLE_RANK = {r: i for i, r in enumerate(ROLES)}


@dataclass(kw_only=True, eq=False)
class TreeNode:
    """A span of tokens shared by every context whose path passes through it."""

    id: int
    parent: int
    """Parent node id; -1 for the (empty) root."""
    tokens: np.ndarray
    """[n] int32 token ids."""
    sampled: bool
    """True when these tokens were sampled by some call (they carry a loss)."""
    logprobs: np.ndarray | None
    """[n] float32 behaviour logprobs when ``sampled``."""
    weight_version: int
    """Policy version that sampled the tokens; -1 for prompt tokens."""
    role: str
    """Branch role of the call that created (or sampled) the span."""
    samplers: list[tuple[str, int, str]] = field(default_factory=list)
    """(session, call_index, role) of every call that sampled exactly these tokens here."""
    sessions: set[str] = field(default_factory=set)
    """Episodes whose contexts pass through this node."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Step rewards attached here: session -> reward of the step after this call output."""
    children: dict[int, int] = field(default_factory=dict)
    """First token -> child node id."""

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class _Segment:
    tokens: np.ndarray
    sampled: bool
    logprobs: np.ndarray | None
    weight_version: int


class TokenTree:
    """The token tree of one group. Build it with ``add_call``/``from_records``."""

    def __init__(self, *, run: str = "", group: str = "", task: str = ""):
        self.run, self.group, self.task = run, group, task
        root = TreeNode(
            id=0,
            parent=-1,
            tokens=np.zeros(0, np.int32),
            sampled=False,
            logprobs=None,
            weight_version=-1,
            role="main",
        )
        self.nodes: list[TreeNode] = [root]
        self.episodes: dict[str, EpisodeInfo] = {}
        self.call_end: dict[tuple[str, int], int] = {}
        """(session, call_index) -> node where that call's context ends."""
        self.output_len: dict[tuple[str, int], int] = {}
        """(session, call_index) -> tokens the call sampled (sequence-level loss weights)."""
        self.context_len: dict[tuple[str, int], int] = {}
        """(session, call_index) -> prompt + output tokens of the call."""
        self.parent_mismatches = 0
        """Calls whose ``parent`` claim did not match their prompt (they still branch
        correctly). Only records without ``prefix_len`` are checked; that claim is trusted."""
        self.text_only_calls = 0
        """Calls recorded without token ids (an upstream passthrough that returns text
        only): kept in the store, absent from the tree, never trained on."""

    # ---- building -------------------------------------------------------------------
    def add_episode(self, info: EpisodeInfo) -> None:
        self.episodes[info.session] = info
        self.task = self.task or info.task

    def add_call(self, record: CallRecord) -> int:
        """Insert one call's context; returns the node its output ends at.

        A call whose record says it extends its parent's whole context (``prefix_len``,
        as the proxy records every call it tokenizes) is inserted from the parent's end
        node: only its new tokens are compared. Any other call is inserted from the root,
        which is also how a session's first call finds the prompt its group shares."""
        _check_record(record)
        if record.session not in self.episodes:
            self.add_episode(EpisodeInfo.from_record(record))
        prompt = np.asarray(record.prompt_ids, dtype=np.int32)
        output = np.asarray(record.output_ids, dtype=np.int32)
        start = self._parent_end(record, len(prompt))
        if start is None:
            self._check_parent(record, prompt)
            start, skip = self.nodes[0], 0
        else:
            skip = record.prefix_len
        segments = [_Segment(prompt[skip:], False, None, -1)]
        if len(output):
            lp = np.asarray(record.output_logprobs, dtype=np.float32)
            segments.append(_Segment(output, True, lp, int(record.weight_version)))
        end = self._insert(start, segments, record)
        key = (record.session, record.call_index)
        self.call_end[key] = end
        self.output_len[key] = len(output)
        self.context_len[key] = len(prompt) + len(output)
        reward = self.episodes[record.session].step_rewards.get(record.call_index)
        if reward is not None:
            self.nodes[end].rewards[record.session] = float(reward)
        return end

    def _parent_end(self, record: CallRecord, prompt_len: int) -> TreeNode | None:
        """The node the parent's context ends at, when the record's prompt starts with that
        whole context; the path down to it is marked as passed by this call."""
        if not record.shares_parent or record.prefix_len > prompt_len:
            return None
        parent = (record.session, record.parent)
        if self.context_len.get(parent) != record.prefix_len:
            return None
        end = self.call_end[parent]
        for node_id in self.path(end):
            self._pass(self.nodes[node_id], record)
        return self.nodes[end]

    def _check_parent(self, record: CallRecord, prompt: np.ndarray) -> None:
        if record.parent is None:
            return
        end = self.call_end.get((record.session, record.parent))
        prev = self.path_tokens(end) if end is not None else None
        if prev is None or len(prev) > len(prompt) or not np.array_equal(prompt[: len(prev)], prev):
            self.parent_mismatches += 1

    def _insert(self, node: TreeNode, segments: list[_Segment], record: CallRecord) -> int:
        for seg in segments:
            pos = 0
            while pos < len(seg.tokens):
                child_id = node.children.get(int(seg.tokens[pos]))
                if child_id is None:
                    node = self._new_node(node, seg, pos, record)
                    break
                child = self.nodes[child_id]
                m = _common_prefix(child.tokens, seg.tokens[pos:])
                if m < len(child):
                    self._split(child, m)
                self._merge(child, seg, pos, record)
                node, pos = child, pos + m
        return node.id

    def _new_node(self, parent: TreeNode, seg: _Segment, pos: int, rec: CallRecord) -> TreeNode:
        node = TreeNode(
            id=len(self.nodes),
            parent=parent.id,
            tokens=seg.tokens[pos:].copy(),
            sampled=seg.sampled,
            logprobs=None if seg.logprobs is None else seg.logprobs[pos:].copy(),
            weight_version=seg.weight_version,
            role=rec.role,
            samplers=[(rec.session, rec.call_index, rec.role)] if seg.sampled else [],
            sessions={rec.session},
        )
        self.nodes.append(node)
        parent.children[int(node.tokens[0])] = node.id
        return node

    def _split(self, node: TreeNode, at: int) -> None:
        """Cut ``node`` after ``at`` tokens; the tail becomes its only child."""
        tail = TreeNode(
            id=len(self.nodes),
            parent=node.id,
            tokens=node.tokens[at:],
            sampled=node.sampled,
            logprobs=None if node.logprobs is None else node.logprobs[at:],
            weight_version=node.weight_version,
            role=node.role,
            samplers=list(node.samplers),
            sessions=set(node.sessions),
            rewards=node.rewards,
            children=node.children,
        )
        self.nodes.append(tail)
        for child_id in tail.children.values():
            self.nodes[child_id].parent = tail.id
        node.tokens = node.tokens[:at]
        node.logprobs = None if node.logprobs is None else node.logprobs[:at]
        node.children = {int(tail.tokens[0]): tail.id}
        node.rewards = {}
        for (session, call), end in self.call_end.items():
            if end == node.id:
                self.call_end[(session, call)] = tail.id

    def _pass(self, node: TreeNode, rec: CallRecord) -> None:
        """``rec``'s context passes through ``node`` (as a prompt span)."""
        node.sessions.add(rec.session)
        if _ROLE_RANK.get(rec.role, 9) < _ROLE_RANK.get(node.role, 9) and not node.sampled:
            node.role = rec.role

    def _merge(self, node: TreeNode, seg: _Segment, pos: int, rec: CallRecord) -> None:
        self._pass(node, rec)
        if not seg.sampled:
            return
        if not node.sampled:  # a prompt span elsewhere, sampled here: it now carries loss
            node.sampled, node.role = True, rec.role
            node.logprobs = seg.logprobs[pos : pos + len(node)].copy()
            node.weight_version = seg.weight_version
        node.samplers.append((rec.session, rec.call_index, rec.role))

    @classmethod
    def from_records(
        cls, records: Iterable[CallRecord], episodes: Iterable[EpisodeInfo] = ()
    ) -> TokenTree:
        """One tree from the records of one group (use ``build_trees`` for many groups)."""
        trees = build_trees(records, episodes)
        if len(trees) != 1:
            raise ValueError(f"records span {len(trees)} groups; use build_trees()")
        return trees[0]

    # ---- reading --------------------------------------------------------------------
    def path(self, node_id: int) -> list[int]:
        """Node ids from the root's first child down to ``node_id``."""
        out = []
        while node_id > 0:
            out.append(node_id)
            node_id = self.nodes[node_id].parent
        return out[::-1]

    def path_tokens(self, node_id: int) -> np.ndarray:
        path = self.path(node_id)
        if not path:
            return np.zeros(0, np.int32)
        return np.concatenate([self.nodes[i].tokens for i in path])

    def leaves(self) -> list[int]:
        """Leaf node ids in depth-first order."""
        return [i for i in self.dfs() if not self.nodes[i].children]

    def dfs(self) -> Iterator[int]:
        """Node ids (root excluded) in depth-first preorder, children by first token."""
        stack = [self.nodes[0]]
        while stack:
            node = stack.pop()
            if node.id:
                yield node.id
            for _, child in sorted(node.children.items(), reverse=True):
                stack.append(self.nodes[child])

    def depth_tokens(self) -> np.ndarray:
        """[num_nodes] tokens from the root to the end of each node."""
        depth = np.zeros(len(self.nodes), np.int64)
        for i in self.dfs():
            depth[i] = depth[self.nodes[i].parent] + len(self.nodes[i])
        return depth

    @property
    def num_tokens(self) -> int:
        """Tokens stored (each shared prefix once)."""
        return int(sum(len(n) for n in self.nodes))

    @property
    def flat_tokens(self) -> int:
        """Tokens if every root-to-leaf path were its own sequence."""
        depth = self.depth_tokens()
        return int(sum(depth[i] for i in self.leaves()))

    @property
    def sharing(self) -> float:
        """Fraction of flat tokens the tree does not need (0 = nothing shared)."""
        flat = self.flat_tokens
        return 1.0 - self.num_tokens / flat if flat else 0.0

    @property
    def num_sampled(self) -> int:
        return int(sum(len(n) for n in self.nodes if n.sampled))


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    k = min(len(a), len(b))
    diff = np.flatnonzero(a[:k] != b[:k])
    return int(diff[0]) if len(diff) else k


def _check_record(rec: CallRecord) -> None:
    where = f"call {rec.call_index} of session {rec.session!r}"
    if len(rec.output_logprobs) != len(rec.output_ids):
        raise ValueError(
            f"{where}: {len(rec.output_ids)} output_ids but {len(rec.output_logprobs)} logprobs"
        )
    if rec.role not in ROLES:
        raise ValueError(f"{where}: role {rec.role!r} is not one of {ROLES}")
    if len(rec.prompt_ids) == 0:
        raise ValueError(f"{where}: empty prompt_ids")


def build_trees(
    records: Iterable[CallRecord], episodes: Iterable[EpisodeInfo] = ()
) -> list[TokenTree]:
    """Group records into one tree per (run, group), calls inserted in session order.
    Calls without any token ids are counted (``text_only_calls``), not inserted."""
    infos = {e.session: e for e in episodes}
    by_session: dict[str, list[CallRecord]] = defaultdict(list)
    for rec in records:
        by_session[rec.session].append(rec)
        if rec.session not in infos:
            infos[rec.session] = EpisodeInfo.from_record(rec)
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for session in by_session:
        groups[infos[session].group_key].append(session)
    trees = []
    for (run, group), sessions in groups.items():
        tree = TokenTree(run=run, group=group or sessions[0])
        for session in sorted(sessions):
            tree.add_episode(infos[session])
            for rec in sorted(by_session[session], key=lambda r: r.call_index):
                if len(rec.prompt_ids) == 0 and len(rec.output_ids) == 0:
                    tree.text_only_calls += 1
                else:
                    tree.add_call(rec)
        trees.append(tree)
    return trees


def trees_from_jsonl(
    records_path: str | Path, episodes_path: str | Path | None = None
) -> list[TokenTree]:
    """Trees from a proxy ``JsonlSink`` file (and optionally the runner's episodes file)."""
    episodes = read_episodes_jsonl(episodes_path) if episodes_path else []
    return build_trees(read_jsonl(records_path), episodes)


__all__ = [
    "ROLES",
    "BranchRole",
    "EpisodeInfo",
    "TokenTree",
    "TreeNode",
    "build_trees",
    "read_episodes_jsonl",
    "trees_from_jsonl",
]
