"""Discrete-event model of a GPU cluster running agentic RL, driven by a :class:`Policy`.

The model:

- **Cells** are ROLLOUT (serve model calls, up to ``max_concurrent`` at once) or TRAINING
  (data-parallel optimizer steps); a switch takes the cell's measured switch time, and a
  cell leaving ROLLOUT moves its in-flight calls to the queue with their KV (migration
  time by context and link bandwidth), or re-prefills them when the migration would pass
  its window (``RDMA_TRANSFER_FAILED`` in the stats).
- **A call**'s duration is fixed when a cell admits it: new prompt tokens at the prefill
  rate plus output tokens at the per-request decode rate, slowed by the cell's batch and the
  context; a trace replays its measured call times instead.
- **Episodes** run on agent slots (``max_concurrent_episodes``): setup, then turns of a call
  and a tool, then scoring; a GRPO group is ready once all its episodes finished.
- **A step** trains the groups the policy names on every settled TRAINING cell, then
  publishes the weights; rollout cells serve the new version from then on. As in the real
  trainer's loss (``trainers.losses.stale_mask``), the output tokens a call sampled on
  weights more than the staleness bound behind the trainer weigh nothing: the step
  computes their group whole, and counts as trained only the share of its tokens that
  still counts (``SimResult.dropped_tokens`` the rest).

Time advances in rounds (:mod:`gyre_env.sim.rounds`): the episodes' calls, tools and
endings are handled in numpy over rounds of at most ``resolution_s``, and the control
events (policy ticks, a group finishing, switches and steps ending) on a heap at their
exact times, each one followed by the policy's decision as before. Every second of every
cell is accounted to one state (``STATES``), so the fractions sum to one. Same config, seed
and policy: same result.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque

import numpy as np

from gyre_env.scheduler.policy import (
    Decision,
    Observation,
    Policy,
    Role,
    SwitchCosts,
    running_lags_of,
)
from gyre_env.sim.config import SimConfig
from gyre_env.sim.result import STATES, TIMELINE_COUNTS, SimResult
from gyre_env.sim.rounds import (
    CALL,
    FREE,
    QUEUED,
    SCORE,
    WAIT,
    EpisodeTable,
    free_slots,
    rolling_mean,
    serving_sweep,
)

(_GROUP_DONE, _STEP_COMPUTED, _STEP_DONE, _SWITCHED, _TICK) = range(5)
"""Control events: each ends a round and is handled at its exact time."""


class Simulation:
    """One run of ``policy`` on ``cfg``'s cluster and ``workload`` (see the module doc)."""

    def __init__(
        self, cfg: SimConfig, policy: Policy, workload, *, roles: list[Role] | None = None
    ):
        self.cfg, self.policy, self.workload = cfg, policy, workload
        c = cfg.cells
        n = c.count
        self.rng = np.random.default_rng([cfg.seed, 7])
        self.resolution = cfg.resolution_s
        self.t = 0.0
        self._heap: list = []
        self._seq = 0
        self.events = self.rounds = 0
        self.role = list(roles) if roles is not None else [Role.ROLLOUT] * n
        self.switching = [False] * n
        self.switch_started = [0.0] * n
        self.load = np.zeros(n, np.int64)
        self.cap = np.full(n, c.max_concurrent, np.int64)
        self.last_switch = [-math.inf] * n
        self.version = np.zeros(n, np.int64)
        self._call_model = (
            c.prefill_tokens_per_s, c.decode_tokens_per_s, c.batch_slowdown,
            c.context_halfspeed_tokens,
        )  # fmt: skip
        self.seconds = dict.fromkeys(STATES, 0.0)
        self._bucket_s = cfg.timeline_s if cfg.timeline_s > 0 else None
        self.timeline: list[dict[str, float]] = []
        """Per ``timeline_s`` bucket: every state's cell seconds and ``TIMELINE_COUNTS``."""
        self.gantt: list[tuple[int, float, float, str]] = []
        self._gantt_open = [("", 0.0)] * n
        self._slot_s = self._slot_cap_s = 0.0
        self._ev: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._load0 = self.load.copy()
        self.tab = EpisodeTable(cfg.workload.max_concurrent_episodes)
        self._ones = np.ones(cfg.workload.max_concurrent_episodes, np.int64)
        self._minus_ones = -self._ones
        """Load deltas of a round's calls starting and ending (views of; never written)."""
        self._ones.flags.writeable = self._minus_ones.flags.writeable = False
        self._cap_each = int(self.cap[0]) if n and (self.cap == self.cap[0]).all() else None
        """Every cell's capacity, when they all have the same (else None)."""
        self.n_calls = self.n_queued = self.served = 0
        self._front = -1e18  # queue keys of migrated calls: before any arrival
        self.pending: deque = deque()  # (group, k)
        self.running_eps = 0
        self.group_left: dict[int, int] = {}
        self.group_end: dict[int, float] = {}
        self.group_eps: dict[int, list] = {}
        self.group_started = 0
        self.groups_pending: dict[int, int] = {}
        self.groups_running = 0
        self.group_v0: dict[int, int] = {}
        """Trainer version when each running group's first episode started."""
        self.running_v0: dict[int, int] = {}
        """Running groups per start version."""
        self.group_versions: dict[int, list[int]] = {}
        """Per running group, each finished episode's oldest weight version."""
        self.group_calls: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        """Per running group, each finished episode's calls: (weight version, output
        tokens)."""
        self.group_info: dict[int, tuple[bool, int, int]] = {}  # trained?, tokens, episodes
        self.ready: deque = deque()  # (group, tokens, [min versions], [(versions, outputs)])
        self.ready_tokens = 0
        self.groups_trained = self.groups_discarded = 0
        self.trainer_version = 0
        self.step_cells: list[int] = []
        self._step_set: frozenset = frozenset()
        """``step_cells`` as a set, and the observation's ``in_step`` (None: to build)."""
        self._in_step_flags: tuple | None = None
        self.step_groups: list = []
        prior = c.switch_prior_s
        self.switch_costs = SwitchCosts(
            to_training_s=c.switch_to_training_s if prior is None else prior,
            to_rollout_s=c.switch_to_rollout_s if prior is None else prior,
        )
        self.call_s_mean = 1.0
        self.stats = dict(switches=0, migrations=0, rdma=0, dropped=0, filtered=0, dropped_tok=0)
        self.trained_samples = self.trained_tokens = 0
        self.staleness: dict[int, int] = {}
        self.step_end_times: list[float] = []
        self._obs_cells: tuple | None = None
        """The observation's roles, switching, last switches and role memo (None: to build
        again, after a role or switch change)."""
        self._obs_lag: tuple | None = None
        """The observation's version lags (None: to build again, after a version change)."""
        self._obs_cap = tuple(self.cap.tolist())
        self._is_rollout = np.array([r is Role.ROLLOUT for r in self.role], bool)
        self._is_switching = np.zeros(n, bool)
        self._refresh()
        for i in range(n):
            self._gantt_mark(i, self._label(i))

    @property
    def waterlevel(self) -> int:
        """Model calls dispatched and not finished: served plus queued."""
        return self.n_calls + self.n_queued

    # ---- the event loop -----------------------------------------------------------
    def _at(self, t: float, kind: int, a=0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a))

    def run(self) -> SimResult:
        start = time.perf_counter()
        cfg = self.cfg
        end, max_steps, max_groups = cfg.duration_s, cfg.max_steps, cfg.max_groups
        self._at(0.0, _TICK)
        heap, pop, tab, res = self._heap, heapq.heappop, self.tab, self.resolution
        handlers = (self._group_done, self._step_computed, self._step_done, self._switched)
        handlers += (self._tick,)
        while True:
            top = heap[0][0]
            limit = min(top, end)
            nxt = float(tab.t.min())
            self._round(min(limit, nxt + res) if nxt < limit else limit)
            if self.t < top or top > end:
                if self.t >= end:
                    break
                continue
            stop = False
            while heap and heap[0][0] <= self.t:
                _, _, kind, a = pop(heap)
                self.events += 1
                handlers[kind](a)
                stop = (max_steps is not None and len(self.step_end_times) >= max_steps) or (
                    max_groups is not None
                    and self.groups_trained >= max_groups
                    and not self.step_cells
                )
                if stop:
                    break
            if stop:
                end = self.t
                break
        return self._result(end, time.perf_counter() - start)

    def _tick(self, _a) -> None:
        self._decide()
        self._at(self.t + self.cfg.decision_interval_s, _TICK)

    # ---- rounds of episode events (gyre_env.sim.rounds) ---------------------------
    def _round(self, t1: float) -> None:
        """Every episode event before ``t1``, then the time ``[t, t1)`` accounted."""
        t0, tab = self.t, self.tab
        self.rounds += 1
        if self.n_queued and self.n_calls < self._cap_r:
            self._match(t0, None, None)
        while True:
            t1 = min(t1, self._heap[0][0])
            due = (tab.t < t1).nonzero()[0]
            if not len(due):
                break
            phase = tab.phase[due]
            calls = due[phase == CALL]
            last = calls[tab.turn[calls] + 1 >= tab.nturns[calls]]  # their episodes' last
            cut = self._group_cut(last, t1)
            if cut < t1:  # a group ends inside: the round stops there, for its decision
                keep = tab.t[due] <= cut
                due, phase, t1 = due[keep], phase[keep], cut
                calls = due[phase == CALL]
                last = last[tab.t[last] <= cut]
            self.events += len(due)
            freed = self._complete(calls, last)
            arrive = due[phase == WAIT]
            if len(arrive):
                tab.phase[arrive] = QUEUED
                tab.arr[arrive] = tab.t[arrive]
                tab.t[arrive] = np.inf
                self.n_queued += len(arrive)
            ending = due[phase == SCORE]
            if len(ending) > 1:
                ending = ending[np.argsort(tab.t[ending], kind="stable")]
            for row in ending.tolist():
                self._episode_end(row)
            if self.n_queued:
                self._match(t0, *freed)
        if self.cfg.cells.shared_host and not tab.measured:
            self._repace(t1)
        self._accrue(t0, t1)
        self.t = t1
        self._after_round()

    def _host_pace(self) -> float:
        """Cells sharing one host: an output token's time over a lone call's, ``E + s (n -
        E)`` with ``n`` calls in flight on ``E`` engines (``CellConfig.shared_host``)."""
        n, busy = int(self.load.sum()), int(np.count_nonzero(self.load))
        return max(1.0, busy + self.cfg.cells.batch_slowdown * (n - busy))

    def _repace(self, t: float) -> None:
        """Cells sharing one host: the calls in flight go on at the host's pace now (it
        changed as calls started and ended in the round), their end times moved to match
        (every rest of a call scales alike: its prefill also runs on the shared cores)."""
        tab = self.tab
        rows = (tab.phase == CALL).nonzero()[0]
        if not len(rows):
            return
        pace = self._host_pace()
        ratio = pace / tab.pace[rows]
        moved = ratio != 1.0
        if moved.any():
            rows, ratio = rows[moved], ratio[moved]
            tab.t[rows] = t + np.maximum(tab.t[rows] - t, 0.0) * ratio
            tab.pace[rows] = pace

    def _group_cut(self, last: np.ndarray, t1: float) -> float:
        """When the first group that the ending last calls of episodes (rows ``last``)
        complete is done, if before ``t1`` (else ``t1``)."""
        tab = self.tab
        if not len(last):
            return t1
        turn = tab.turn[last]
        done = tab.t[last] + tab.tool[last, turn] + tab.score_s[last]
        size, ends, count = self.workload.group_size, {}, {}
        for g, t in zip((tab.ep[last] // size).tolist(), done.tolist(), strict=True):
            ends[g] = max(ends.get(g, self.group_end[g]), t)
            count[g] = count.get(g, 0) + 1
        return min([t1] + [ends[g] for g in ends if count[g] == self.group_left[g]])

    def _after_round(self) -> None:
        """Hook for checks after each round (tests)."""

    def _complete(self, rows: np.ndarray, last: np.ndarray):
        """Calls of ``rows`` end (``last``: those among them that are their episode's last):
        the cells' slots free, each episode to its tool or scoring."""
        if not len(rows):
            return None, None
        tab = self.tab
        cells, tc, turn = tab.cell[rows], tab.t[rows], tab.turn[rows]
        self.load -= np.bincount(cells, minlength=len(self.load))
        tab.t[rows] = tc + tab.tool[rows, turn]
        tab.advance(rows, turn)
        tab.phase[rows] = WAIT
        if len(last):
            tab.phase[last] = SCORE
            tab.t[last] += tab.score_s[last]
            for row in last.tolist():
                self._scored(row)
        self.n_calls -= len(rows)
        self._ev.append((cells, tc, self._minus_ones[: len(rows)]))
        return cells, tc

    def _match(self, t0: float, freed_cells, freed_t) -> None:
        """Queued requests take free slots first in, first out (see the rounds module)."""
        if freed_cells is None and self.n_calls >= self._cap_r:
            return  # every serving slot is taken (the loads of serving cells sum to n_calls)
        tab, n = self.tab, len(self.load)
        q = (tab.phase == QUEUED).nonzero()[0]
        if len(q) > 1:
            q = q[np.argsort(tab.arr[q], kind="stable")]
        per_cell = np.bincount(freed_cells, minlength=n) if freed_cells is not None else None
        pc, plv = free_slots(self.load, self.cap, self._serving, len(q), per_cell, self._cap_each)
        if freed_cells is not None and len(pc) < len(q):  # (else the slots free at t0 do)
            o = np.argsort(freed_t, kind="stable")
            cells = np.concatenate((pc, freed_cells[o]))
            slot_t = np.concatenate((np.full(len(pc), t0), freed_t[o]))
        else:
            cells, slot_t = pc, np.full(len(pc), t0)
        m = min(len(q), len(cells))
        if not m:
            return
        rows, cells = q[:m], cells[:m]
        start = np.maximum(tab.arr[rows], slot_t[:m])
        self.load += np.bincount(cells, minlength=n)
        if self.cfg.cells.shared_host:  # every busy engine's decode step in turn
            hold = self.cfg.cells.host_call_s * m
            if hold and not tab.measured:  # the calls in flight wait for these to start
                busy = (tab.phase == CALL).nonzero()[0]
                tab.t[busy] += hold
            pace = self._host_pace()
            dur = tab.durations(rows, None, self._call_model, pace)
            tab.pace[rows] = pace
        else:
            inflight = np.concatenate((plv, self.load[cells[len(plv) :]]))[:m]
            dur = tab.durations(rows, inflight, self._call_model)
        tab.phase[rows] = CALL
        tab.cell[rows] = cells
        tab.t[rows] = start + dur
        tab.minv[rows] = np.minimum(tab.minv[rows], self.version[cells])
        tab.ver[rows, tab.turn[rows]] = self.version[cells]
        self.n_queued -= m
        self.n_calls += m
        self.served += m
        self.call_s_mean = rolling_mean(self.call_s_mean, dur)
        self._ev.append((cells, start, self._ones[:m]))

    def _accrue(self, t0: float, t1: float) -> None:
        dt = t1 - t0
        if self._ev:
            cells, times, deltas = (np.concatenate(x) for x in zip(*self._ev, strict=True))
            self._ev = []
        else:
            cells = times = deltas = np.zeros(0)
        slot_s, serve_s = serving_sweep(
            t0, t1, self._load0, self._serving, cells.astype(np.int64, copy=False), times, deltas
        )
        self._load0 = self.load.copy()
        self._slot_s += slot_s
        self._slot_cap_s += self._cap_r * dt
        idle = "rollout/idle:agents_in_tools" if self.running_eps else "rollout/idle:no_episodes"
        stepping = len(self.step_cells)
        spent = (
            ("rollout/serving", serve_s),
            (idle, self._n_serving * dt - serve_s),
            ("switching", self._n_switching * dt),
            ("training/sync" if self._publishing else "training/step", stepping * dt),
            ("training/idle:no_batch", (self._n_training - stepping) * dt),
        )
        sec = self.seconds
        for state, s in spent:
            sec[state] += s
        self._to_buckets(t0, t1, spent)

    def _to_buckets(self, t0: float, t1: float, spent) -> None:
        """Spread ``[t0, t1)``'s state seconds over the timeline's buckets it overlaps."""
        width = self._bucket_s
        if width is None or t1 <= t0:
            return
        b, last = int(t0 // width), int(t1 // width)
        while b <= last:
            share = (min(t1, (b + 1) * width) - max(t0, b * width)) / (t1 - t0)
            if share > 0:
                row = self._bucket(b)
                for state, s in spent:
                    row[state] += s * share
            b += 1

    def _bucket(self, b: int) -> dict[str, float]:
        """The timeline's bucket ``b`` (buckets before it created empty)."""
        while len(self.timeline) <= b:
            self.timeline.append(dict.fromkeys((*STATES, *TIMELINE_COUNTS), 0.0))
        return self.timeline[b]

    def _count(self, what: str, n: float) -> None:
        """Add ``n`` to ``what`` in the bucket of now (a ``TIMELINE_COUNTS`` key)."""
        if self._bucket_s is not None:
            self._bucket(int(self.t // self._bucket_s))[what] += n

    # ---- episodes and groups -----------------------------------------------------------
    def _admit(self, groups: int) -> None:
        for _ in range(groups):
            g = self.group_started
            self.group_started += 1
            episodes = self.workload.group(g)
            self.group_eps[g] = episodes
            self.group_left[g] = len(episodes)
            self.group_end[g] = 0.0
            self.groups_pending[g] = len(episodes)
            self.group_versions[g] = []
            self.group_calls[g] = []
            self.group_info[g] = (
                episodes[0].trained,
                sum(e.tokens for e in episodes),
                len(episodes),
            )
            for k in range(len(episodes)):
                self.pending.append((g, k))
        self._start_pending(self.t)

    def _start_pending(self, now: float) -> None:
        size, cap = self.workload.group_size, self.cfg.workload.max_concurrent_episodes
        tab = self.tab
        while self.pending and self.running_eps < cap:
            g, k = self.pending.popleft()
            if self.groups_pending[g] == self.group_info[g][2]:  # its first episode
                self.groups_running += 1
                v0 = self.group_v0[g] = self.trainer_version
                self.running_v0[v0] = self.running_v0.get(v0, 0) + 1
            self.groups_pending[g] -= 1
            episode = self.group_eps[g][k]
            if not self.groups_pending[g]:
                del self.groups_pending[g], self.group_eps[g]
            row = tab.free_rows.pop()
            tab.load(row, episode, now, g * size + k, self.trainer_version)
            self.running_eps += 1
            if not len(episode.output):
                self._scored(row)

    def _scored(self, row: int) -> None:
        """Episode of ``row`` made its last call: its group ends once all of them have."""
        tab = self.tab
        g = int(tab.ep[row]) // self.workload.group_size
        self.group_versions[g].append(int(tab.minv[row]))
        n = int(tab.nturns[row])
        self.group_calls[g].append((tab.ver[row, :n].copy(), tab.output[row, :n].copy()))
        self.group_end[g] = max(self.group_end[g], float(self.tab.t[row]))
        self.group_left[g] -= 1
        if not self.group_left[g]:
            del self.group_left[g]
            self._at(self.group_end.pop(g), _GROUP_DONE, g)

    def _episode_end(self, row: int) -> None:
        """Episode of ``row`` finished scoring: its agent slot takes the next episode."""
        tab = self.tab
        now = float(tab.t[row])
        tab.phase[row], tab.t[row] = FREE, np.inf
        tab.free_rows.append(row)
        self.running_eps -= 1
        self._start_pending(now)

    def _group_done(self, g: int) -> None:
        self.groups_running -= 1
        v0 = self.group_v0.pop(g)
        self.running_v0[v0] -= 1
        if not self.running_v0[v0]:
            del self.running_v0[v0]
        versions, calls = self.group_versions.pop(g), self.group_calls.pop(g)
        trained, tokens, _ = self.group_info.pop(g)
        if trained:
            self.ready.append((g, tokens, versions, calls))
            self.ready_tokens += tokens
        else:
            self.stats["filtered"] += 1
            self.groups_trained += 1
            self.groups_discarded += 1
        self._decide()

    # ---- training -----------------------------------------------------------------------
    def _start_step(self, groups: int) -> None:
        if self.step_cells or not self.ready or not self._n_training:
            return
        cells = [i for i, r in enumerate(self.role) if r is Role.TRAINING and not self.switching[i]]
        bound = self.cfg.training.staleness_bound
        # the stalest first, as the elastic driver takes them (ElasticDriver._take): a group
        # whose first episode started on an older version goes stale first if left for
        # the next step; fresher ones can wait
        self.ready = deque(sorted(self.ready, key=lambda r: min(r[2])))
        taken, tokens = [], 0
        cutoff = self.trainer_version - bound
        while self.ready and len(taken) < groups:
            g, tok, versions, calls = self.ready.popleft()
            self.ready_tokens -= tok
            self.groups_trained += 1
            tokens += tok  # the step computes every token of the group
            # as the trainer's loss does (trainers.losses.stale_mask): output tokens sampled
            # more than the bound behind it weigh nothing; the rest of the group counts
            out = stale = dead = 0
            for v, o in calls:  # per episode: its output, and the share sampled too long ago
                eo, es = int(o.sum()), int(o[v < cutoff].sum())
                out, stale, dead = out + eo, stale + es, dead + (eo > 0 and es == eo)
            lost = round(tok * stale / out) if out else 0
            self.stats["dropped"] += dead
            self.stats["dropped_tok"] += lost
            self._count("dropped_samples", dead)
            taken.append((tok - lost, versions, len(versions) - dead))
        if not taken:
            return
        for _, versions, _ in taken:
            for v in versions:
                lag = self.trainer_version - v
                self.staleness[lag] = self.staleness.get(lag, 0) + 1
        c = self.cfg.cells
        rate = c.train_tokens_per_s * len(cells) * (c.dp_efficiency if len(cells) > 1 else 1.0)
        self.step_cells, self.step_groups = cells, taken
        self._step_set, self._in_step_flags = frozenset(cells), None
        for i in cells:
            self._gantt_mark(i, "training")
        self._at(self.t + tokens / rate + c.step_overhead_s, _STEP_COMPUTED)

    def _step_computed(self, _a) -> None:
        self._publishing = True
        self._at(self.t + self.cfg.cells.publish_s, _STEP_DONE)

    def _step_done(self, _a) -> None:
        self._publishing = False
        self.trainer_version += 1
        self.trained_samples += sum(n for _, _, n in self.step_groups)
        self.trained_tokens += sum(tok for tok, _, _ in self.step_groups)
        self._count("trained_tokens", sum(tok for tok, _, _ in self.step_groups))
        self._count("steps", 1)
        cells, self.step_cells, self.step_groups = self.step_cells, [], []
        self._step_set, self._in_step_flags = frozenset(), None
        self.version[self._serving] = self.trainer_version
        for i in cells:
            self.version[i] = self.trainer_version
            self._gantt_mark(i, self._label(i))
        self._obs_lag = None
        self.step_end_times.append(self.t)
        self._decide()

    _publishing = False

    # ---- switching ------------------------------------------------------------------------
    def _switch(self, cell: int, to: Role) -> None:
        if self.switching[cell] or self.role[cell] is to or cell in self._step_set:
            return
        c = self.cfg.cells
        self.switching[cell] = self._is_switching[cell] = True
        self.switch_started[cell] = self.t
        self.stats["switches"] += 1
        self._refresh()
        self._gantt_mark(cell, "switching")
        if self.role[cell] is Role.ROLLOUT:
            self._migrate(cell)
        base = c.switch_to_training_s if to is Role.TRAINING else c.switch_to_rollout_s
        jitter = math.exp(c.switch_jitter * float(self.rng.standard_normal())) if base else 1.0
        self._at(self.t + base * jitter, _SWITCHED, cell)

    def _migrate(self, cell: int) -> None:
        """Move ``cell``'s in-flight calls to the front of the queue: the rest of each call
        plus its KV transfer, or a re-prefill of its context past the migration window."""
        c, tab = self.cfg.cells, self.tab
        rows = ((tab.phase == CALL) & (tab.cell == cell)).nonzero()[0]
        if len(rows):
            ctx = tab.ctx[rows] + tab.cur_prompt[rows]
            delay = ctx * c.kv_bytes_per_token / (c.link_gb_per_s * 1e9)
            failed = delay > c.migration_window_s  # RDMA_TRANSFER_FAILED: re-prefill instead
            delay = np.where(failed, ctx / c.prefill_tokens_per_s, delay)
            self.stats["rdma"] += int(failed.sum())
            self.stats["migrations"] += len(rows)
            tab.fixed[rows] = np.maximum(tab.t[rows] - self.t, 0.0) + delay
            tab.n_fixed += len(rows)
            self._front -= len(rows) + 1
            tab.arr[rows] = self._front + np.arange(len(rows))
            tab.phase[rows], tab.t[rows] = QUEUED, np.inf
            self.load[cell] -= len(rows)
            self._ev.append((np.array([cell]), np.array([self.t]), np.array([-len(rows)])))
            self.n_calls -= len(rows)
            self.n_queued += len(rows)
            self._match(self.t, None, None)

    def _switched(self, cell: int) -> None:
        to = Role.TRAINING if self.role[cell] is Role.ROLLOUT else Role.ROLLOUT
        self.switch_costs.observe(to, self.t - self.switch_started[cell])
        self.role[cell] = to
        self._is_rollout[cell] = to is Role.ROLLOUT
        self.switching[cell] = self._is_switching[cell] = False
        self.last_switch[cell] = self.t
        self.version[cell] = self.trainer_version
        self._obs_lag = None
        self._refresh()
        self._gantt_mark(cell, self._label(cell))
        if to is Role.ROLLOUT and self.n_queued:
            self._match(self.t, None, None)
        self._decide()

    # ---- accounting ------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Per-role counts and the serving mask, after a role or switch change."""
        rollout, sw = self._is_rollout, self._is_switching
        self._serving = rollout & ~sw
        self._n_serving = int(np.count_nonzero(self._serving))
        each = self._cap_each
        self._cap_r = (
            each * self._n_serving if each is not None else int(self.cap[self._serving].sum())
        )
        self._n_switching = int(np.count_nonzero(sw))
        self._n_training = len(sw) - self._n_serving - self._n_switching
        self._obs_cells = None

    def _label(self, cell: int) -> str:
        if self.switching[cell]:
            return "switching"
        if self.role[cell] is Role.ROLLOUT:
            return "rollout"
        return "training" if cell in self._step_set else "training idle"

    def _gantt_mark(self, cell: int, label: str) -> None:
        open_label, t0 = self._gantt_open[cell]
        if label == open_label:
            return
        if open_label and len(self.gantt) < self.cfg.gantt_max_segments and self.t > t0:
            self.gantt.append((cell, t0, self.t, open_label))
        self._gantt_open[cell] = (label, self.t)

    # ---- the policy -------------------------------------------------------------------------
    def _decide(self) -> None:
        d: Decision = self.policy.decide(self.observation())
        for s in d.switches:
            self._switch(s.cell, s.to)
        if d.admit_groups > 0:
            self._admit(d.admit_groups)
        if d.train_groups > 0:
            self._start_step(d.train_groups)

    def observation(self) -> Observation:
        t = self.cfg.training
        v = self.trainer_version
        if self._obs_cells is None:
            self._obs_cells = (
                tuple(self.role),
                tuple(self.switching),
                tuple(self.last_switch),
                self._role_memo(),
            )
        if self._obs_lag is None:
            self._obs_lag = tuple((v - self.version).tolist())
        roles, switching, last_switch, memo = self._obs_cells
        capacity, lag = self._obs_cap, self._obs_lag
        return Observation(
            time=self.t,
            roles=roles,
            switching=switching,
            in_flight=tuple(self.load.tolist()),
            capacity=capacity,
            last_switch=last_switch,
            version_lag=lag,
            trainer_version=v,
            step_running=bool(self.step_cells),
            waterlevel=self.waterlevel,
            queue=self.n_queued,
            rollout_capacity=self._cap_r,
            groups_started=self.group_started,
            groups_pending=len(self.groups_pending),
            groups_running=self.groups_running,
            running_lags=running_lags_of(self.running_v0, v, t.staleness_bound),
            groups_ready=len(self.ready),
            groups_trained=self.groups_trained,
            groups_discarded=self.groups_discarded,
            ready_tokens=self.ready_tokens,
            groups_per_step=t.groups_per_step,
            groups_per_iteration=t.batch_groups,
            steps_per_iteration=t.steps_per_iteration,
            staleness_bound=t.staleness_bound,
            switch_costs=self.switch_costs,
            call_s=self.call_s_mean,
            train_tokens_per_s=self.cfg.cells.train_tokens_per_s,
            in_step=self._in_step(),
            _memo=memo,
        )

    def _role_memo(self) -> dict:
        """The answers of ``Observation.cells`` / ``switching_to`` for the settled cells
        and the switches under way, from the role masks (numpy, not a scan per call)."""
        rollout, sw = self._is_rollout, self._is_switching
        return {
            ("cells", Role.ROLLOUT, True): (rollout & ~sw).nonzero()[0].tolist(),
            ("cells", Role.TRAINING, True): (~rollout & ~sw).nonzero()[0].tolist(),
            ("to", Role.TRAINING): int((rollout & sw).sum()),
            ("to", Role.ROLLOUT): int((~rollout & sw).sum()),
        }

    def _in_step(self) -> tuple[bool, ...]:
        if not self.step_cells:
            return ()
        if self._in_step_flags is None:
            flags = [False] * len(self.role)
            for i in self.step_cells:
                flags[i] = True
            self._in_step_flags = tuple(flags)
        return self._in_step_flags

    # ---- the end ---------------------------------------------------------------------------------
    def _result(self, end: float, wall_s: float) -> SimResult:
        self.t = end
        for i in range(len(self.role)):
            self._gantt_mark(i, "end")
        return SimResult(
            policy=self.policy.name,
            duration_s=end,
            cells=len(self.role),
            steps=len(self.step_end_times),
            trained_samples=self.trained_samples,
            trained_tokens=self.trained_tokens,
            state_seconds=dict(self.seconds),
            staleness=dict(sorted(self.staleness.items())),
            dropped_stale=self.stats["dropped"],
            dropped_tokens=self.stats["dropped_tok"],
            filtered_groups=self.stats["filtered"],
            switches=self.stats["switches"],
            migrations=self.stats["migrations"],
            rdma_transfer_failed=self.stats["rdma"],
            step_end_times=self.step_end_times,
            slot_utilisation=self._slot_s / self._slot_cap_s if self._slot_cap_s else 0.0,
            events=self.events,
            wall_s=wall_s,
            gantt=self.gantt,
            params=dict(getattr(self.policy, "params", {}) or {}),
            rounds=self.rounds,
            timeline_s=self._bucket_s or 0.0,
            timeline=self._timeline(end),
        )

    def _timeline(self, end: float) -> list[dict[str, float]]:
        """The buckets up to ``end`` (an empty one for every bucket the run reached)."""
        if self._bucket_s is None:
            return []
        if end > 0:
            self._bucket(max(0, math.ceil(end / self._bucket_s) - 1))
        return [dict(row) for row in self.timeline]


def simulate(cfg: SimConfig, policy: Policy, workload=None) -> SimResult:
    """Run ``policy`` on ``cfg`` (its workload unless one is given); cells start in the
    roles the policy asks for with ``initial_roles(n)`` if it has one, else all ROLLOUT."""
    from gyre_env.sim.workload import make_workload

    workload = workload if workload is not None else make_workload(cfg.workload, cfg.seed)
    init = getattr(policy, "initial_roles", None)
    roles = init(cfg.cells.count) if init is not None else None
    return Simulation(cfg, policy, workload, roles=roles).run()
