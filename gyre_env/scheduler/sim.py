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
  publishes the weights; rollout cells serve the new version from then on.

Every second of every cell is accounted to one state (``STATES``), so the fractions sum to
one. Same config, seed and policy: same result.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gyre_env.scheduler.config import SimConfig
from gyre_env.scheduler.policy import Decision, Observation, Policy, Role, SwitchCosts

STATES = (
    "rollout/serving",
    "rollout/idle:agents_in_tools",
    "rollout/idle:no_episodes",
    "training/step",
    "training/sync",
    "training/idle:no_batch",
    "switching",
)
"""Where a cell's time goes. ``agents_in_tools``: episodes run but none waits on this cell;
``no_episodes``: the policy holds rollouts back (a barrier or the staleness bound)."""
_GANTT = {s: s.split("/")[0].split(":")[0] for s in STATES}
_GANTT.update({"training/idle:no_batch": "training idle", "training/sync": "training"})
(_ARRIVE, _DONE, _EP_DONE, _STEP_COMPUTED, _STEP_DONE, _SWITCHED, _TICK) = range(7)


@dataclass
class SimResult:
    """What one policy run gave. Times in seconds of simulated time."""

    policy: str
    duration_s: float
    cells: int
    steps: int
    trained_samples: int
    trained_tokens: int
    state_seconds: dict[str, float]
    staleness: dict[int, int]
    dropped_stale: int
    filtered_groups: int
    switches: int
    migrations: int
    rdma_transfer_failed: int
    step_end_times: list[float]
    slot_utilisation: float
    """Time-weighted share of rollout slots in use while cells are in ROLLOUT."""
    events: int
    wall_s: float
    gantt: list[tuple[int, float, float, str]] = field(default_factory=list)
    params: dict = field(default_factory=dict)

    @property
    def samples_per_hour(self) -> float:
        return self.trained_samples * 3600.0 / self.duration_s if self.duration_s else 0.0

    @property
    def tokens_per_hour(self) -> float:
        return self.trained_tokens * 3600.0 / self.duration_s if self.duration_s else 0.0

    def fractions(self) -> dict[str, float]:
        total = self.cells * self.duration_s
        return {k: v / total for k, v in self.state_seconds.items()} if total else {}

    def busy_fraction(self) -> dict[str, float]:
        f = self.fractions()
        return {
            "rollout": f.get("rollout/serving", 0.0),
            "training": f.get("training/step", 0.0) + f.get("training/sync", 0.0),
        }

    def idle_fraction(self) -> float:
        return sum(v for k, v in self.fractions().items() if "idle" in k or k == "switching")

    def time_to_steps(self, n: int) -> float | None:
        return self.step_end_times[n - 1] if len(self.step_end_times) >= n else None


class Simulation:
    """One run of ``policy`` on ``cfg``'s cluster and ``workload`` (see the module doc)."""

    def __init__(
        self, cfg: SimConfig, policy: Policy, workload, *, roles: list[Role] | None = None
    ):
        self.cfg, self.policy, self.workload = cfg, policy, workload
        c = cfg.cells
        n = c.count
        self.rng = np.random.default_rng([cfg.seed, 7])
        self.t = 0.0
        self._heap: list = []
        self._seq = 0
        self.events = 0
        self.role = list(roles) if roles is not None else [Role.ROLLOUT] * n
        self.switching = [False] * n
        self.switch_started = [0.0] * n
        self.in_flight = [0] * n
        self.cap = [c.max_concurrent] * n
        self.last_switch = [-math.inf] * n
        self.version = [0] * n
        self._call_model = (
            c.prefill_tokens_per_s, c.decode_tokens_per_s, c.batch_slowdown,
            c.context_halfspeed_tokens,
        )  # fmt: skip
        self.state = [""] * n
        self.since = [0.0] * n
        self.seconds = dict.fromkeys(STATES, 0.0)
        self.gantt: list[tuple[int, float, float, str]] = []
        self._gantt_open = [("", 0.0)] * n
        self._slot_s = 0.0
        self._slot_cap_s = 0.0
        self._slot_last = [0.0] * n
        self._free: list[tuple[int, int]] = []  # (load, cell) heap, lazily invalidated
        self.queue: deque = deque()  # (episode id, fixed duration or None)
        self.waterlevel = 0
        self.calls: dict[int, list] = {}  # call id -> [episode, cell, finish, token]
        self._next_call = 0
        self.live: dict[int, list] = {}  # episode id -> [Episode, turn, context, min version]
        self.pending: deque = deque()  # (group, k)
        self.running_eps = 0
        self.group_left: dict[int, int] = {}
        self.group_started = 0
        self.groups_pending: dict[int, int] = {}
        self.groups_running = 0
        self.group_versions: dict[int, list[int]] = {}
        self.group_info: dict[int, tuple[bool, int, int]] = {}  # trained?, tokens, episodes
        self.ready: deque = deque()  # (group, tokens, [min versions])
        self.ready_tokens = 0
        self.groups_trained = 0
        self.trainer_version = 0
        self.step_cells: list[int] = []
        self.step_groups: list = []
        self.switch_costs = SwitchCosts(
            to_training_s=c.switch_to_training_s, to_rollout_s=c.switch_to_rollout_s
        )
        self.call_s_mean = 1.0
        self.stats = dict(switches=0, migrations=0, rdma=0, dropped=0, filtered=0)
        self.trained_samples = self.trained_tokens = 0
        self.staleness: dict[int, int] = {}
        self.step_end_times: list[float] = []
        for i in range(n):
            self._account(i)
            if self.role[i] is Role.ROLLOUT:
                heapq.heappush(self._free, (0, i))

    # ---- the event loop -----------------------------------------------------------
    def _at(self, t: float, kind: int, a=0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a))

    def run(self) -> SimResult:
        start = time.perf_counter()
        cfg = self.cfg
        end, max_steps, max_groups = cfg.duration_s, cfg.max_steps, cfg.max_groups
        self._at(0.0, _TICK)
        heap, pop = self._heap, heapq.heappop
        handlers = (
            self._arrive, self._done, self._episode_done, self._step_computed,
            self._step_done, self._switched, self._tick,
        )  # fmt: skip
        while heap and heap[0][0] <= end:
            t, _, kind, a = pop(heap)
            self.t = t
            self.events += 1
            handlers[kind](a)
            if max_steps is not None and len(self.step_end_times) >= max_steps:
                end = t
                break
            if max_groups is not None and self.groups_trained >= max_groups:
                if not self.step_cells:
                    end = t
                    break
        self.t = end
        return self._result(end, time.perf_counter() - start)

    def _tick(self, _a) -> None:
        self._decide()
        self._at(self.t + self.cfg.decision_interval_s, _TICK)

    # ---- calls ------------------------------------------------------------------------
    def _arrive(self, ep: int, fixed: float | None = None) -> None:
        """Episode ``ep`` asks for its next model call."""
        self.waterlevel += 1
        cell = self._free_cell()
        if cell is None:
            self.queue.append((ep, fixed))
        else:
            self._serve(cell, ep, fixed)

    def _free_cell(self) -> int | None:
        free, role, sw, load, cap = self._free, self.role, self.switching, self.in_flight, self.cap
        while free:
            n, c = free[0]
            if n == load[c] and n < cap[c] and role[c] is Role.ROLLOUT and not sw[c]:
                return c
            heapq.heappop(free)
        return None

    def _serve(self, cell: int, ep: int, fixed: float | None) -> None:
        live = self.live[ep]
        episode, turn = live[0], live[1]
        self._slots(cell, +1)
        if fixed is not None:
            dur = fixed
        elif episode.call_s is not None:
            dur = episode.call_s[turn]
        else:
            prefill, decode, slowdown, half = self._call_model
            new = episode.prompt_new[turn]
            slow = (1.0 + slowdown * (self.in_flight[cell] - 1)) * (1.0 + (live[2] + new) / half)
            dur = new / prefill + episode.output[turn] * slow / decode
        self.call_s_mean += 0.01 * (dur - self.call_s_mean)
        cid = self._next_call
        self._next_call = cid + 1
        self.calls[cid] = [ep, cell, self.t + dur]
        if self.version[cell] < live[3]:
            live[3] = self.version[cell]
        self._seq += 1
        heapq.heappush(self._heap, (self.t + dur, self._seq, _DONE, cid))

    def _slots(self, cell: int, delta: int) -> None:
        """Change a cell's load, keeping the slot-time integral and its accounting state."""
        dt = self.t - self._slot_last[cell]
        self._slot_s += self.in_flight[cell] * dt
        if self.role[cell] is Role.ROLLOUT and not self.switching[cell]:
            self._slot_cap_s += self.cap[cell] * dt
        self._slot_last[cell] = self.t
        before = self.in_flight[cell]
        self.in_flight[cell] = before + delta
        heapq.heappush(self._free, (before + delta, cell))
        if before == 0 or before + delta == 0:
            self._account(cell)

    def _done(self, cid: int) -> None:
        call = self.calls.pop(cid, None)
        if call is None:  # migrated away: its new call finishes it
            return
        ep, cell, _ = call
        self.waterlevel -= 1
        self._slots(cell, -1)
        live = self.live[ep]
        episode, turn = live[0], live[1]
        live[2] += episode.prompt_new[turn] + episode.output[turn]
        live[1] = turn + 1
        if turn + 1 < len(episode.output):
            self._at(self.t + episode.tool_s[turn], _ARRIVE, ep)
        else:
            self._at(self.t + episode.tool_s[turn] + episode.scoring_s, _EP_DONE, ep)
        if self.queue:
            qep, fixed = self.queue.popleft()
            self._serve(cell, qep, fixed)

    # ---- episodes and groups -----------------------------------------------------------
    def _admit(self, groups: int) -> None:
        size = self.workload.group_size
        for _ in range(groups):
            g = self.group_started
            self.group_started += 1
            episodes = self.workload.group(g)
            self.group_left[g] = len(episodes)
            self.groups_pending[g] = len(episodes)
            self.group_versions[g] = []
            self.group_info[g] = (
                episodes[0].trained,
                sum(e.tokens for e in episodes),
                len(episodes),
            )
            for k, episode in enumerate(episodes):
                self.live[g * size + k] = [episode, 0, 0, self.trainer_version]
                self.pending.append((g, k))
        self._start_pending()

    def _start_pending(self) -> None:
        size, cap = self.workload.group_size, self.cfg.workload.max_concurrent_episodes
        while self.pending and self.running_eps < cap:
            g, k = self.pending.popleft()
            if self.groups_pending[g] == self.group_info[g][2]:  # its first episode
                self.groups_running += 1
            self.groups_pending[g] -= 1
            if not self.groups_pending[g]:
                del self.groups_pending[g]
            ep = g * size + k
            live = self.live[ep]
            live[3] = self.trainer_version
            self._running(+1)
            if live[0].output:
                self._at(self.t + live[0].setup_s, _ARRIVE, ep)
            else:
                self._at(self.t + live[0].setup_s + live[0].scoring_s, _EP_DONE, ep)

    def _running(self, delta: int) -> None:
        before = self.running_eps
        self.running_eps += delta
        if (before == 0) != (self.running_eps == 0):  # idle causes change for every cell
            for c in range(len(self.role)):
                if self.in_flight[c] == 0:
                    self._account(c)

    def _episode_done(self, ep: int) -> None:
        size = self.workload.group_size
        g = ep // size
        _, _, _, min_version = self.live.pop(ep)
        self._running(-1)
        self.group_versions[g].append(min_version)
        self.group_left[g] -= 1
        if not self.group_left[g]:
            del self.group_left[g]
            self.groups_running -= 1
            versions = self.group_versions.pop(g)
            trained, tokens, _ = self.group_info.pop(g)
            if trained:
                self.ready.append((g, tokens, versions, len(versions)))
                self.ready_tokens += tokens
            else:
                self.stats["filtered"] += 1
                self.groups_trained += 1
            self._decide()
        self._start_pending()

    # ---- training -----------------------------------------------------------------------
    def _start_step(self, groups: int) -> None:
        cells = [i for i, r in enumerate(self.role) if r is Role.TRAINING and not self.switching[i]]
        if self.step_cells or not cells or not self.ready:
            return
        bound = self.cfg.training.staleness_bound
        taken, tokens = [], 0
        while self.ready and len(taken) < groups:
            g, tok, versions, n = self.ready.popleft()
            self.ready_tokens -= tok
            self.groups_trained += 1
            if self.trainer_version - min(versions) > bound:
                self.stats["dropped"] += n
                continue
            taken.append((tok, versions, n))
            tokens += tok
        if not taken:
            return
        for _, versions, _ in taken:
            for v in versions:
                lag = self.trainer_version - v
                self.staleness[lag] = self.staleness.get(lag, 0) + 1
        c = self.cfg.cells
        rate = c.train_tokens_per_s * len(cells) * (c.dp_efficiency if len(cells) > 1 else 1.0)
        self.step_cells, self.step_groups = cells, taken
        for i in cells:
            self._account(i)
        self._at(self.t + tokens / rate + c.step_overhead_s, _STEP_COMPUTED)

    def _step_computed(self, _a) -> None:
        self._publishing = True
        for i in self.step_cells:
            self._account(i)
        self._at(self.t + self.cfg.cells.publish_s, _STEP_DONE)

    def _step_done(self, _a) -> None:
        self._publishing = False
        self.trainer_version += 1
        self.trained_samples += sum(n for _, _, n in self.step_groups)
        self.trained_tokens += sum(tok for tok, _, _ in self.step_groups)
        cells, self.step_cells, self.step_groups = self.step_cells, [], []
        for i, r in enumerate(self.role):
            if r is Role.ROLLOUT and not self.switching[i]:
                self.version[i] = self.trainer_version
        for i in cells:
            self.version[i] = self.trainer_version
            self._account(i)
        self.step_end_times.append(self.t)
        self._decide()

    _publishing = False

    # ---- switching ------------------------------------------------------------------------
    def _switch(self, cell: int, to: Role) -> None:
        if self.switching[cell] or self.role[cell] is to or cell in self.step_cells:
            return
        c = self.cfg.cells
        leaving_rollout = self.role[cell] is Role.ROLLOUT
        if leaving_rollout:
            self._slots(cell, 0)  # close the slot integral while it was serving
        self.switching[cell] = True
        self.switch_started[cell] = self.t
        self.stats["switches"] += 1
        self._account(cell)
        if leaving_rollout:
            self._migrate(cell)
        base = c.switch_to_training_s if to is Role.TRAINING else c.switch_to_rollout_s
        jitter = math.exp(c.switch_jitter * float(self.rng.standard_normal())) if base else 1.0
        self._at(self.t + base * jitter, _SWITCHED, cell)

    def _migrate(self, cell: int) -> None:
        """Move ``cell``'s in-flight calls to the front of the queue: the rest of each call
        plus its KV transfer, or a re-prefill of its context past the migration window."""
        c = self.cfg.cells
        moved = []
        for cid in [cid for cid, call in self.calls.items() if call[1] == cell]:
            ep, _, finish = self.calls.pop(cid)
            live = self.live[ep]
            ctx = live[2] + live[0].prompt_new[live[1]]
            delay = ctx * c.kv_bytes_per_token / (c.link_gb_per_s * 1e9)
            if delay > c.migration_window_s:
                self.stats["rdma"] += 1  # RDMA_TRANSFER_FAILED: re-prefill instead
                delay = ctx / c.prefill_tokens_per_s
            self.stats["migrations"] += 1
            moved.append((ep, max(finish - self.t, 0.0) + delay))
            self.waterlevel -= 1  # re-dispatched below
            self._slots(cell, -1)
        for ep, rest in reversed(moved):
            self.waterlevel += 1
            target = self._free_cell()
            if target is None:
                self.queue.appendleft((ep, rest))
            else:
                self._serve(target, ep, rest)

    def _switched(self, cell: int) -> None:
        to = Role.TRAINING if self.role[cell] is Role.ROLLOUT else Role.ROLLOUT
        self.switch_costs.observe(to, self.t - self.switch_started[cell])
        self.role[cell] = to
        self.switching[cell] = False
        self.last_switch[cell] = self.t
        self.version[cell] = self.trainer_version
        self._slot_last[cell] = self.t
        self._account(cell)
        if to is Role.ROLLOUT:
            heapq.heappush(self._free, (0, cell))
            while self.queue and self.in_flight[cell] < self.cap[cell]:
                ep, fixed = self.queue.popleft()
                self._serve(cell, ep, fixed)
        self._decide()

    # ---- accounting ------------------------------------------------------------------------
    def _state_of(self, cell: int) -> str:
        if self.switching[cell]:
            return "switching"
        if self.role[cell] is Role.ROLLOUT:
            if self.in_flight[cell]:
                return "rollout/serving"
            return (
                "rollout/idle:agents_in_tools" if self.running_eps else "rollout/idle:no_episodes"
            )
        if cell in self.step_cells:
            return "training/sync" if self._publishing else "training/step"
        return "training/idle:no_batch"

    def _account(self, cell: int) -> None:
        new = self._state_of(cell)
        old = self.state[cell]
        if new == old:
            return
        if old:
            self.seconds[old] += self.t - self.since[cell]
        self.state[cell], self.since[cell] = new, self.t
        self._gantt_mark(cell, _GANTT[new])

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
        cap_r = sum(
            k
            for k, r, s in zip(self.cap, self.role, self.switching, strict=True)
            if r is Role.ROLLOUT and not s
        )
        v = self.trainer_version
        return Observation(
            time=self.t,
            roles=tuple(self.role),
            switching=tuple(self.switching),
            in_flight=tuple(self.in_flight),
            capacity=tuple(self.cap),
            last_switch=tuple(self.last_switch),
            version_lag=tuple(v - x for x in self.version),
            trainer_version=v,
            step_running=bool(self.step_cells),
            waterlevel=self.waterlevel,
            queue=len(self.queue),
            rollout_capacity=cap_r,
            groups_started=self.group_started,
            groups_pending=len(self.groups_pending),
            groups_running=self.groups_running,
            groups_ready=len(self.ready),
            groups_trained=self.groups_trained,
            ready_tokens=self.ready_tokens,
            groups_per_step=t.groups_per_step,
            groups_per_iteration=t.batch_groups,
            steps_per_iteration=t.steps_per_iteration,
            staleness_bound=t.staleness_bound,
            switch_costs=self.switch_costs,
            call_s=self.call_s_mean,
            train_tokens_per_s=self.cfg.cells.train_tokens_per_s,
        )

    # ---- the end ---------------------------------------------------------------------------------
    def _result(self, end: float, wall_s: float) -> SimResult:
        for i in range(len(self.role)):
            self._slots(i, 0)
            self.seconds[self.state[i]] += end - self.since[i]
            self.since[i] = end
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
        )


def simulate(cfg: SimConfig, policy: Policy, workload=None) -> SimResult:
    """Run ``policy`` on ``cfg`` (its workload unless one is given); cells start in the
    roles the policy asks for with ``initial_roles(n)`` if it has one, else all ROLLOUT."""
    from gyre_env.scheduler.workload import make_workload

    workload = workload if workload is not None else make_workload(cfg.workload, cfg.seed)
    init = getattr(policy, "initial_roles", None)
    roles = init(cfg.cells.count) if init is not None else None
    return Simulation(cfg, policy, workload, roles=roles).run()
