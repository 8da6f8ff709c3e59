"""Synthetic TITO records with known sharing, for tests and ``benchmarks/tree_packing.py``.

Each generator returns ``(records, episodes)`` in exactly the form the proxy and the
runner write them, so the code under test is the real tree builder. Token ids are
random in ``[1, vocab)``; random logprobs stand in for an engine's.
"""

from __future__ import annotations

import numpy as np

from gyre_env.trajectory.records import CallRecord, EpisodeInfo


class _Episode:
    """Builds the calls of one session, tracking its contexts by branch."""

    def __init__(self, session: str, rng: np.random.Generator, vocab: int, weight_version: int):
        self.session, self.rng, self.vocab, self.wv = session, rng, vocab, weight_version
        self.records: list[CallRecord] = []

    def tokens(self, n: int) -> list[int]:
        return self.rng.integers(1, self.vocab, size=n).tolist()

    def call(
        self, prompt: list[int], n_out: int, *, branch: str, role: str, parent: int | None
    ) -> list[int]:
        """Record one call; returns its full context (prompt + output)."""
        out = self.tokens(n_out)
        lp = (-self.rng.exponential(1.0, size=n_out)).astype(float).tolist()
        prefix = 0
        if parent is not None:  # what the proxy reports: ids copied from the parent context
            prev = self.records[parent]
            prefix = len(prev.prompt_ids) + len(prev.output_ids)
        rec = CallRecord(
            session=self.session,
            call_index=len(self.records),
            branch=branch,
            parent=parent,
            role=role,
            prompt_ids=list(prompt),
            output_ids=out,
            output_logprobs=lp,
            weight_version=self.wv,
            prefix_len=prefix,
        )
        self.records.append(rec)
        return list(prompt) + out

    def turns(
        self,
        context: list[int],
        total: int,
        turns: int,
        *,
        branch: str,
        role: str,
        parent: int | None = None,
    ) -> list[int]:
        """``turns`` calls that extend each other, adding ~``total`` tokens in all.

        Each turn appends a tool-output prompt chunk and a sampled chunk of equal size.
        """
        per = max(total // max(turns, 1), 2)
        for _ in range(turns):
            prompt = context + self.tokens(per // 2)
            context = self.call(prompt, per - per // 2, branch=branch, role=role, parent=parent)
            parent = len(self.records) - 1
        return context


def grpo_group(
    *,
    group_size: int = 4,
    prompt_len: int = 64,
    turns: int = 3,
    turn_tokens: int = 32,
    vocab: int = 1024,
    seed: int = 0,
    run: str = "run0",
    task: str = "task0",
    group: str = "g0",
) -> tuple[list[CallRecord], list[EpisodeInfo]]:
    """A GRPO group: one shared prompt, each episode several extending turns."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(1, vocab, size=prompt_len).tolist()
    records, episodes = [], []
    for e in range(group_size):
        ep = _Episode(f"{group}-e{e}", rng, vocab, weight_version=3)
        ep.turns(shared, turn_tokens * turns, turns, branch="main", role="main")
        records += ep.records
        episodes.append(
            EpisodeInfo(
                session=ep.session,
                run=run,
                task=task,
                group=group,
                outcome="success",
                reward=float(rng.integers(0, 2)),
                step_rewards={0: 0.1},
            )
        )
    return records, episodes


def sharing_group(
    sharing: float,
    *,
    group_size: int = 8,
    path_len: int = 1024,
    turns: int = 4,
    vocab: int = 1024,
    seed: int = 0,
    group: str = "g0",
) -> tuple[list[CallRecord], list[EpisodeInfo]]:
    """A group whose paths share a prompt sized so that ``sharing`` of flat tokens is saved.

    With ``k`` paths of length ``L`` and a shared prefix ``p``, sharing is
    ``(k-1) p / (k L)``, so ``p = sharing * k L / (k-1)`` (at most ``L``).
    """
    k = group_size
    if not 0 <= sharing <= (k - 1) / k:
        raise ValueError(f"sharing must be in [0, {(k - 1) / k:.3f}] for a group of {k}")
    p = int(round(sharing * k * path_len / (k - 1)))
    rng = np.random.default_rng(seed)
    shared = rng.integers(1, vocab, size=p).tolist()
    records, episodes = [], []
    for e in range(k):
        ep = _Episode(f"{group}-e{e}", rng, vocab, weight_version=1)
        rest = path_len - p
        if rest <= 0:  # the whole path is shared prompt: one prompt-only sampled token
            ep.call(shared[:-1], 1, branch="main", role="main", parent=None)
        else:
            # first token of each episode's own part differs, so nothing extra is shared
            context = shared + [1 + (e % (vocab - 1))]
            ep.turns(
                context, rest - 1, min(turns, max(1, (rest - 1) // 2)), branch="main", role="main"
            )
        records += ep.records
        episodes.append(
            EpisodeInfo(session=ep.session, group=group, outcome="success", reward=float(e % 2))
        )
    return records, episodes


def nl2repo_group(
    *,
    spec_len: int = 6000,
    group_size: int = 8,
    main_tokens: int = 2000,
    sub_tokens: int = 1000,
    turns: int = 8,
    vocab: int = 1024,
    seed: int = 0,
    group: str = "nl2repo",
) -> tuple[list[CallRecord], list[EpisodeInfo]]:
    """NL2Repo-shaped work: a long spec shared by the group; each episode's main agent
    works in ``turns`` calls and, halfway through, starts a sub-agent whose prompt is the
    main context so far plus an instruction, and which works in its own calls."""
    rng = np.random.default_rng(seed)
    spec = rng.integers(1, vocab, size=spec_len).tolist()
    records, episodes = [], []
    for e in range(group_size):
        ep = _Episode(f"{group}-e{e}", rng, vocab, weight_version=2)
        half = ep.turns(spec, main_tokens // 2, turns // 2, branch="main", role="main")
        half_call = len(ep.records) - 1
        instruction = ep.tokens(32)
        ep.turns(
            half + instruction, sub_tokens, max(turns // 2, 1), branch="sub1", role="sub-agent"
        )
        ep.turns(
            half,
            main_tokens - main_tokens // 2,
            turns - turns // 2,
            branch="main",
            role="main",
            parent=half_call,
        )
        records += ep.records
        episodes.append(
            EpisodeInfo(
                session=ep.session,
                group=group,
                task="nl2repo-task",
                outcome="success" if e % 3 else "failure",
                reward=float(e % 3 > 0),
            )
        )
    return records, episodes
