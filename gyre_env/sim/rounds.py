"""The agents' side of the simulator, in numpy: an episode table and model calls in rounds.

Every running episode owns a row of the table and has exactly one pending time: the end of
its setup or tool (then it asks for a call), the end of its call, or the end of its scoring.
The simulator advances in *rounds* ``[t0, t1)`` that never cross a control event (a policy
tick, a switch or a step ending, a group finishing); a round handles all episode events
before ``t1`` at once, in sub-rounds until none is left (an event caused by another one in
the same round gets its own sub-round). Within a sub-round the calls are served first in,
first out: with the requests ``A`` (queued and new, by arrival) and the free slots ``S``
sorted by the time they are free (slots free at the round's start on the least loaded
cells first, then the slots the sub-round's calls release), the k-th request starts at
``max(A_k, S_k)``: what an event-by-event run gives as long as no call both starts and
ends inside one round. What a round cannot see: a request caused inside the round does
not overtake one known at its start for a slot, and may take a slot freed later in the
round a little early. Rounds last at most ``SimConfig.resolution_s``; the results
converge as it shrinks (``tests/scheduler/test_sim_rounds.py``).
"""

from __future__ import annotations

import numpy as np

FREE, WAIT, QUEUED, CALL, SCORE = range(5)
"""Row phases: free row; in setup or a tool (asks for a call at ``t``); waiting for a
slot; in a call (ends at ``t``); scoring (the episode ends at ``t``)."""
_ALPHA = 0.01
"""Weight of one call in the rolling mean call time."""


class EpisodeTable:
    """Rows of running episodes (``rows`` = the agent slots), their turns in 2-D arrays."""

    def __init__(self, rows: int, turns: int = 8):
        self.phase = np.zeros(rows, np.int8)
        self.t = np.full(rows, np.inf)
        self.arr = np.zeros(rows)
        """Queue order while QUEUED: the arrival time (migrated calls: below any time)."""
        self.turn = np.zeros(rows, np.int64)
        self.nturns = np.zeros(rows, np.int64)
        self.ctx = np.zeros(rows, np.int64)
        self.minv = np.zeros(rows, np.int64)
        self.cell = np.zeros(rows, np.int64)
        self.fixed = np.full(rows, np.nan)
        """Duration of the next call when fixed (a migrated call's rest), else NaN."""
        self.n_fixed = 0
        """Rows whose ``fixed`` is set (a driver that sets one adds it here)."""
        self.pace = np.ones(rows)
        """Cells sharing one host: the host's slowdown each call's end time ``t`` was last
        computed at (``CellConfig.shared_host``)."""
        self.score_s = np.zeros(rows)
        self.ep = np.zeros(rows, np.int64)
        """Global episode id (``group * group_size + k``)."""
        self.cur_prompt = np.zeros(rows, np.int64)
        self.cur_output = np.zeros(rows, np.int64)
        """New prompt and output tokens of each row's current turn."""
        self.measured = False
        """Whether any episode loaded so far replays measured call times."""
        self._alloc(turns)
        self.free_rows = list(range(rows - 1, -1, -1))

    def advance(self, rows, turn) -> None:
        """Rows move from ``turn`` to the next one: context and current-turn tokens."""
        self.ctx[rows] += self.cur_prompt[rows] + self.cur_output[rows]
        nxt = np.minimum(turn + 1, self.prompt.shape[1] - 1)
        self.cur_prompt[rows] = self.prompt[rows, nxt]
        self.cur_output[rows] = self.output[rows, nxt]
        self.turn[rows] = turn + 1

    def durations(self, rows, inflight, call_model, batch_slow=None) -> np.ndarray:
        """Next call of each of ``rows``: a migrated call's rest, else the trace's measured
        time, else the cell model (``call_model``: prefill and decode tokens/s, batch
        slowdown, half-speed context): new prompt tokens at the prefill rate plus output
        tokens at the per-request decode rate, slowed by the batch (``batch_slow``: that
        factor given, else ``1 + slowdown x (inflight - 1)``) and the context."""
        prefill, decode, slowdown, half = call_model
        new = self.cur_prompt[rows]
        if batch_slow is None:
            batch_slow = 1.0 + slowdown * (inflight - 1)
        slow = batch_slow * (1.0 + (self.ctx[rows] + new) / half)
        dur = new / prefill + self.cur_output[rows] * slow / decode
        if self.measured:
            measured = self.call[rows, self.turn[rows]]
            dur = np.where(np.isnan(measured), dur, measured)
        if not self.n_fixed:
            return dur
        fixed = self.fixed[rows]
        set_ = ~np.isnan(fixed)
        k = int(np.count_nonzero(set_))
        if not k:
            return dur
        self.fixed[rows] = np.nan
        self.n_fixed -= k
        return np.where(set_, fixed, dur)

    def _alloc(self, turns: int) -> None:
        rows = len(self.phase)
        old = getattr(self, "prompt", None)
        new = [
            np.zeros((rows, turns), np.int64),
            np.zeros((rows, turns), np.int64),
            np.zeros((rows, turns)),
            np.full((rows, turns), np.nan),
            np.zeros((rows, turns), np.int64),
        ]
        if old is not None:
            k = self.prompt.shape[1]
            olds = (self.prompt, self.output, self.tool, self.call, self.ver)
            for a, b in zip(new, olds, strict=True):
                a[:, :k] = b
        self.prompt, self.output, self.tool, self.call, self.ver = new
        """Per row and turn: new prompt and output tokens, tool seconds, the measured call
        time (NaN: none), and ``ver``, the weight version of the cell that served the call
        (set when it starts)."""

    def load(self, row: int, episode, now: float, ep_id: int, version: int) -> None:
        """Put ``episode`` in ``row``, starting its setup at ``now``."""
        n = len(episode.output)
        if n > self.prompt.shape[1]:
            self._alloc(max(n, 2 * self.prompt.shape[1]))
        self.prompt[row, :n] = episode.prompt_new
        self.output[row, :n] = episode.output
        self.tool[row, :n] = episode.tool_s
        self.call[row, :n] = episode.call_s if episode.call_s is not None else np.nan
        self.measured = self.measured or episode.call_s is not None
        if n:
            self.cur_prompt[row], self.cur_output[row] = self.prompt[row, 0], self.output[row, 0]
        self.turn[row], self.nturns[row], self.ctx[row] = 0, n, 0
        if self.n_fixed and not np.isnan(self.fixed[row]):
            self.n_fixed -= 1
        self.minv[row], self.ep[row], self.fixed[row] = version, ep_id, np.nan
        self.score_s[row] = episode.scoring_s
        if n:
            self.phase[row], self.t[row] = WAIT, now + episode.setup_s
        else:
            self.phase[row], self.t[row] = SCORE, now + episode.setup_s + episode.scoring_s


def free_slots(load, cap, serving, need: int, freed_per_cell=None, cap_each=None):
    """Up to ``need`` slots free before the sub-round's releases, least loaded cells first:
    (cells, the load each one reaches when it takes the slot). ``freed_per_cell``: slots
    the sub-round's calls release on each cell (None: none); ``cap_each``: every cell's
    capacity when they are all the same (None: read ``cap``)."""
    if not need:
        return _NO_CELLS, _NO_CELLS
    level = load + freed_per_cell if freed_per_cell is not None else load
    idx = (serving & (level < cap)).nonzero()[0]  # the open cells, in id order
    if not len(idx):
        return _NO_CELLS, _NO_CELLS
    lv_open = level[idx]
    lv = int(lv_open.min())
    cap_open = cap[idx] if cap_each is None else None
    top = int(cap_open.max()) if cap_each is None else cap_each
    cells, levels = [], []
    while need > 0 and lv < top:
        fit = lv_open <= lv if cap_each is not None else (lv_open <= lv) & (lv < cap_open)
        cs = idx[fit][:need]
        cells.append(cs)
        levels.append(np.full(len(cs), lv + 1))
        need -= len(cs)
        lv += 1
    if len(cells) == 1:
        return cells[0], levels[0]
    return np.concatenate(cells), np.concatenate(levels)


_NO_CELLS = np.zeros(0, np.int64)
_NO_CELLS.flags.writeable = False


def rolling_mean(mean: float, values: np.ndarray) -> float:
    """``mean += ALPHA * (v - mean)`` for each of ``values`` in order, in one pass."""
    m = len(values)
    if not m:
        return mean
    keep = 1.0 - _ALPHA
    w = _weights(m)
    return float(keep**m * mean + w @ values)


_W: list = [np.zeros(0)]
"""``_ALPHA * (1 - _ALPHA) ** k`` for k from ``len - 1`` down to 0 (grown as needed)."""


def _weights(m: int) -> np.ndarray:
    """``_ALPHA * keep ** [m - 1, ..., 0]``, element for element what the direct formula
    gives, as a fresh array (the dot product then sees the same operands)."""
    table = _W[0]
    if m > len(table):
        size = max(m, 2 * len(table), 1024)
        keep = 1.0 - _ALPHA
        table = _W[0] = _ALPHA * keep ** np.arange(size - 1, -1, -1, dtype=np.float64)
    return table[len(table) - m :].copy()


def serving_sweep(t0, t1, load0, serving, cells, times, deltas):
    """Exact slot-seconds and serving cell-seconds over ``[t0, t1)`` of the ``serving``
    cells, from their loads at ``t0`` and the round's load changes (cell, time, delta)."""
    dt = t1 - t0
    rest = np.where(serving, load0, 0)  # loads of the serving cells no event touches
    slot_s = serve_s = 0.0
    if len(cells):
        # one sort by cell, then time: the time as a fraction of the round below each id
        o = np.argsort(cells + (times - t0) / (2.0 * dt if dt > 0 else 1.0), kind="stable")
        c, t, d = cells[o], times[o], deltas[o]
        first = np.empty(len(c), bool)
        first[0] = True
        np.not_equal(c[1:], c[:-1], out=first[1:])
        cum = np.cumsum(d)
        start = np.maximum.accumulate(np.where(first, np.arange(len(c)), 0))
        after = load0[c] + cum - (cum[start] - d[start])
        nxt = np.empty(len(t))
        nxt[:-1] = t[1:]
        last = np.empty(len(c), bool)
        last[-1] = True
        last[:-1] = first[1:]
        nxt[last] = t1
        seg = nxt - t
        slot_s += float(after @ seg)
        serve_s += float(seg[after > 0].sum())
        before = t[first] - t0
        cf = c[first]
        rest[cf] = 0
        l0 = load0[cf]
        slot_s += float(l0 @ before)
        serve_s += float(before[l0 > 0].sum())
    slot_s += float(rest.sum()) * dt
    serve_s += float(np.count_nonzero(rest)) * dt
    return slot_s, serve_s
