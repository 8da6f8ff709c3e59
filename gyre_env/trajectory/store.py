"""The trajectory store: every model call and episode outcome, durable on disk.

Why SQLite in WAL mode, with token arrays as blobs
--------------------------------------------------
- *Crash safety for free.* Each record is one transaction; WAL makes a commit atomic and
  a writer killed mid-transaction leaves only an uncommitted tail that the next open
  rolls back. Append-only Arrow/Parquet segments would need our own footer repair and
  fsync discipline, and a segment is only readable once closed.
- *Append-only, one record at a time.* The proxy emits calls one by one, out of order
  across sessions; SQLite appends rows cheaply (one commit per call, tens of
  microseconds with ``synchronous=NORMAL``), while columnar files want large batches.
- *Queries.* Run, task, group, outcome and weight version are indexed columns; readers
  in other processes see committed rows while the writer keeps going (WAL).
- *Embedded.* Standard library only; one file to copy. Parquet is for export
  (``export_parquet``), where columnar layout pays off.

Token arrays are delta-encoded against the session's earlier calls: a call whose prompt
extends an earlier context stores only ``(base_call, base_len)`` and the new tokens, so a
long episode costs O(its tokens) on disk, not O(calls x context). The base is the
record's own claim (``parent``, ``prefix_len``: the proxy decided it when it built the
prompt), so a write costs O(new tokens) and keeps no contexts in memory; only a record
that makes no claim (``prefix_len=None``: an import from an older version, a
passthrough) is compared with the session's earlier calls. Ids are int32 and logprobs
float64 (lossless round trip of ``CallRecord``); reads decode the blobs straight into
numpy arrays, which token trees take as they are (``records(..., arrays=True)``).

Writes are synchronous; the proxy puts the store behind a
:class:`~gyre_env.trajectory.records.RecordWriter`, so they happen on the writer's thread,
never on the proxy's event loop.

Durability: ``synchronous=NORMAL`` survives a killed process (the acceptance test kills a
writer with SIGKILL); ``fsync=True`` uses ``synchronous=FULL`` to survive power loss too.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gyre_env.trajectory.records import CallRecord, EpisodeInfo, read_episodes_jsonl, read_jsonl
from gyre_env.trajectory.tree import TokenTree, _common_prefix, build_trees

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    session TEXT PRIMARY KEY, run TEXT NOT NULL, task TEXT NOT NULL, grp TEXT NOT NULL,
    created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS episodes_run ON episodes(run, grp);
CREATE INDEX IF NOT EXISTS episodes_task ON episodes(task);
CREATE TABLE IF NOT EXISTS outcomes (
    id INTEGER PRIMARY KEY, session TEXT NOT NULL, outcome TEXT NOT NULL,
    reward REAL NOT NULL, step_rewards TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS outcomes_session ON outcomes(session);
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY, session TEXT NOT NULL, call_index INTEGER NOT NULL,
    branch TEXT NOT NULL, parent INTEGER, role TEXT NOT NULL,
    base_call INTEGER, base_len INTEGER NOT NULL, prompt_len INTEGER NOT NULL,
    prompt_tail BLOB NOT NULL, output_ids BLOB NOT NULL, output_logprobs BLOB NOT NULL,
    weight_version INTEGER NOT NULL, meta TEXT NOT NULL,
    UNIQUE (session, call_index));
CREATE INDEX IF NOT EXISTS calls_version ON calls(weight_version);
"""
# CallRecord fields kept as columns; every other field goes into the JSON ``meta`` column,
# so fields the proxy adds later round-trip without a schema change.
_COLUMN_FIELDS = {
    "session",
    "call_index",
    "branch",
    "parent",
    "role",
    "prompt_ids",
    "output_ids",
    "output_logprobs",
    "weight_version",
}
# The latest outcome row of each session (outcomes are appended, never updated).
_LATEST_OUTCOME = """
LEFT JOIN (SELECT o.session, o.outcome, o.reward, o.step_rewards FROM outcomes o
           JOIN (SELECT session, MAX(id) AS id FROM outcomes GROUP BY session) m ON o.id = m.id)
    oc ON oc.session = e.session
"""


class StoreError(RuntimeError):
    """The store file is not a Gyre trajectory store, or a write was refused."""


@dataclass(kw_only=True)
class StoreStats:
    """What ``gyre trajectories stats`` prints."""

    episodes: int
    groups: int
    calls: int
    outcomes: dict[str, int]
    """Outcome -> episodes (``unknown`` = not finished/scored yet)."""
    call_tokens: int
    """Sum over calls of prompt + output tokens (what a per-call sequence costs)."""
    stored_tokens: int
    """Tokens actually on disk after delta encoding."""
    sampled_tokens: int
    tree_tokens: int
    """Tokens of the token trees (each shared prefix once)."""
    flat_tokens: int
    """Tokens if every root-to-leaf path were its own sequence."""
    text_only_calls: int = 0
    """Calls stored without token ids (an upstream passthrough): not in any tree."""

    @property
    def sharing(self) -> float:
        return 1.0 - self.tree_tokens / self.flat_tokens if self.flat_tokens else 0.0


def _ids_blob(ids: Iterable[int], what: str) -> bytes:
    arr = np.asarray(ids, dtype=np.int64)
    if len(arr) and (arr.min() < 0 or arr.max() >= 2**31):
        raise StoreError(f"{what}: token ids must be in [0, 2**31), got {arr.min()}..{arr.max()}")
    return arr.astype("<i4").tobytes()


def _ids(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<i4")


_NO_IDS = np.zeros(0, "<i4")


class TrajectoryStore:
    """Append-only store of ``CallRecord``s and episode outcomes; also a ``RecordSink``."""

    def __init__(
        self,
        path: str | Path,
        *,
        readonly: bool = False,
        fsync: bool = False,
        cache_sessions: int = 256,
    ):
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not self.path.exists():
            raise FileNotFoundError(f"no trajectory store at {self.path}")
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        uri = f"file:{self.path}?mode=ro" if readonly else f"file:{self.path}"
        self._db = sqlite3.connect(
            uri, uri=True, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._lock = threading.Lock()
        self._contexts: OrderedDict[str, dict[int, np.ndarray]] = OrderedDict()
        self._cache_sessions = cache_sessions
        try:
            self._init(fsync)
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise StoreError(f"{self.path} is not a readable trajectory store: {e}") from e

    def _init(self, fsync: bool) -> None:
        if self.readonly:
            version = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        else:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            self._db.executescript(_SCHEMA)
            self._db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
            )
            version = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if version is None or int(version[0]) != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema {version} is not {SCHEMA_VERSION}")

    def meta(self, key: str) -> str | None:
        """A value of the store's ``meta`` table (e.g. the tokenizer fingerprint)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self._write("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # ---- writing --------------------------------------------------------------------
    def begin_episode(
        self, *, session: str, run: str = "", task: str = "", group: str = ""
    ) -> None:
        """Register an episode before its calls arrive (calls of an unknown session
        register it from ``record.extra``)."""
        # A call that arrived first registered the session from its ``extra``; what the
        # runner says wins where that left a column empty.
        self._write(
            "INSERT INTO episodes VALUES (?, ?, ?, ?, ?) ON CONFLICT(session) DO UPDATE SET "
            "run = CASE WHEN run = '' THEN excluded.run ELSE run END, "
            "task = CASE WHEN task = '' THEN excluded.task ELSE task END, "
            "grp = CASE WHEN grp = '' THEN excluded.grp ELSE grp END",
            (session, run, task, group, time.time()),
        )

    def finish_episode(
        self,
        *,
        session: str,
        outcome: str,
        reward: float = 0.0,
        step_rewards: dict[int, float] | None = None,
    ) -> None:
        """Append the episode's outcome (a later one supersedes, e.g. after re-scoring)."""
        steps = json.dumps({str(k): float(v) for k, v in (step_rewards or {}).items()})
        self._write(
            "INSERT INTO outcomes (session, outcome, reward, step_rewards, created) "
            "VALUES (?, ?, ?, ?, ?)",
            (session, outcome, float(reward), steps, time.time()),
        )
        with self._lock:
            self._contexts.pop(session, None)

    def add_episode(self, info: EpisodeInfo) -> None:
        """``begin_episode`` + ``finish_episode`` from an ``EpisodeInfo``."""
        self.begin_episode(session=info.session, run=info.run, task=info.task, group=info.group)
        self.finish_episode(
            session=info.session,
            outcome=info.outcome,
            reward=info.reward,
            step_rewards=info.step_rewards,
        )

    def write(self, record: CallRecord) -> None:
        """Append one call; returns once it is committed (thread-safe)."""
        if self.readonly:
            raise StoreError(f"{self.path} was opened read-only")
        if len(record.output_logprobs) != len(record.output_ids):
            raise StoreError(
                f"call {record.call_index} of {record.session!r}: "
                f"{len(record.output_ids)} output_ids but {len(record.output_logprobs)} logprobs"
            )
        with self._lock:
            base_call, base_len, searched = self._delta_base(record)
            extra = record.extra or {}
            meta = json.dumps(
                {
                    f: getattr(record, f)
                    for f in CallRecord.__dataclass_fields__
                    if f not in _COLUMN_FIELDS
                }
            )
            row = (
                record.session,
                record.call_index,
                record.branch,
                record.parent,
                record.role,
                base_call,
                base_len,
                len(record.prompt_ids),
                _ids_blob(record.prompt_ids[base_len:], "prompt_ids"),
                _ids_blob(record.output_ids, "output_ids"),
                np.asarray(record.output_logprobs, dtype="<f8").tobytes(),
                int(record.weight_version),
                meta,
            )
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute(
                    "INSERT OR IGNORE INTO episodes VALUES (?, ?, ?, ?, ?)",
                    (
                        record.session,
                        str(extra.get("run", "")),
                        str(extra.get("task", "")),
                        str(extra.get("group", "")),
                        time.time(),
                    ),
                )
                self._db.execute(f"INSERT INTO calls VALUES (NULL{', ?' * len(row)})", row)
                self._db.execute("COMMIT")
            except sqlite3.IntegrityError as e:
                self._db.execute("ROLLBACK")
                raise StoreError(
                    f"call {record.call_index} of session {record.session!r} is already stored"
                ) from e
            if searched:
                ctx = np.concatenate(
                    [
                        np.asarray(record.prompt_ids, np.int64),
                        np.asarray(record.output_ids, np.int64),
                    ]
                )
                self._remember(record.session, record.call_index, ctx)
            else:  # the search's view of this session is stale now; it reloads if ever needed
                self._contexts.pop(record.session, None)

    def _delta_base(self, record: CallRecord) -> tuple[int | None, int, bool]:
        """``(base_call, base_len, searched)``: the record's own claim when its parent is
        stored with at least ``prefix_len`` ids, else the result of comparing ids."""
        if record.prefix_len is not None and not record.shares_parent:
            return None, 0, False  # the proxy tokenized this prompt whole
        if record.shares_parent and record.prefix_len <= len(record.prompt_ids):
            row = self._db.execute(
                "SELECT prompt_len + length(output_ids) / 4 FROM calls "
                "WHERE session=? AND call_index=?",
                (record.session, record.parent),
            ).fetchone()
            if row is not None and row[0] >= record.prefix_len:
                return record.parent, record.prefix_len, False
        return *self._best_base(record, np.asarray(record.prompt_ids, np.int64)), True

    def _write(self, sql: str, args: tuple) -> None:
        if self.readonly:
            raise StoreError(f"{self.path} was opened read-only")
        with self._lock:
            self._db.execute(sql, args)

    def _best_base(self, record: CallRecord, prompt: np.ndarray) -> tuple[int | None, int]:
        """The earlier call of this session whose context shares the longest prefix."""
        contexts = self._session_contexts(record.session)
        best, best_len = None, 0
        for call, ctx in contexts.items():
            n = _common_prefix(ctx, prompt)
            if n > best_len:
                best, best_len = call, n
        return best, best_len

    def _session_contexts(self, session: str) -> dict[int, np.ndarray]:
        if session in self._contexts:
            self._contexts.move_to_end(session)
            return self._contexts[session]
        contexts = {
            r.call_index: np.concatenate([r.prompt_ids, r.output_ids])
            for r in self._read_session(session, arrays=True)
        }
        self._contexts[session] = _latest_per_branch(contexts, self._branches(session))
        while len(self._contexts) > self._cache_sessions:
            self._contexts.popitem(last=False)
        return self._contexts[session]

    def _branches(self, session: str) -> dict[int, str]:
        rows = self._db.execute("SELECT call_index, branch FROM calls WHERE session=?", (session,))
        return dict(rows.fetchall())

    def _remember(self, session: str, call: int, ctx: np.ndarray) -> None:
        contexts = self._contexts.setdefault(session, {})
        contexts[call] = ctx
        if len(contexts) > 8:  # keep the most recent contexts; older ones are prefixes
            for old in sorted(contexts)[:-8]:
                del contexts[old]

    # ---- reading --------------------------------------------------------------------
    def _read_session(self, session: str, *, arrays: bool = False) -> list[CallRecord]:
        rows = self._db.execute(
            "SELECT call_index, branch, parent, role, base_call, base_len, prompt_tail, "
            "output_ids, output_logprobs, weight_version, meta FROM calls WHERE session=? "
            "ORDER BY id",  # write order: a delta base is always written before its user
            (session,),
        ).fetchall()
        contexts: dict[int, np.ndarray] = {}
        out = []
        for call, branch, parent, role, base_call, base_len, tail, outs, lps, wv, meta in rows:
            base = contexts[base_call][:base_len] if base_call is not None else _NO_IDS
            ctx = np.concatenate([base, _ids(tail), _ids(outs)])  # [prompt + output] int32
            contexts[call] = ctx
            n_prompt = len(base) + len(tail) // 4
            prompt, output = ctx[:n_prompt], ctx[n_prompt:]  # views: one copy per call
            logprobs = np.frombuffer(lps, dtype="<f8")
            if not arrays:
                prompt, output, logprobs = prompt.tolist(), output.tolist(), logprobs.tolist()
            out.append(
                CallRecord(
                    session=session,
                    call_index=call,
                    branch=branch,
                    parent=parent,
                    role=role,
                    prompt_ids=prompt,
                    output_ids=output,
                    output_logprobs=logprobs,
                    weight_version=wv,
                    **_known_meta(json.loads(meta)),
                )
            )
        return sorted(out, key=lambda r: r.call_index)

    def records(self, sessions: Iterable[str], *, arrays: bool = False) -> Iterator[CallRecord]:
        """The calls of ``sessions``, reconstructed exactly, in call order. With ``arrays``
        the token fields are numpy arrays decoded from the stored blobs (int32 ids, float64
        logprobs; what token trees take) instead of lists."""
        for session in sessions:
            with self._lock:
                yield from self._read_session(session, arrays=arrays)

    def episodes(
        self,
        *,
        run: str | None = None,
        task: str | None = None,
        group: str | None = None,
        outcome: str | None = None,
        weight_version: int | None = None,
    ) -> list[EpisodeInfo]:
        """Episodes matching every given filter (``outcome='unknown'``: not finished)."""
        where, args = [], []
        for col, val in (("e.run", run), ("e.task", task), ("e.grp", group)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        if outcome is not None:
            where.append("COALESCE(oc.outcome, 'unknown') = ?")
            args.append(outcome)
        if weight_version is not None:
            where.append(
                "EXISTS (SELECT 1 FROM calls c WHERE c.session = e.session "
                "AND c.weight_version = ?)"
            )
            args.append(int(weight_version))
        sql = (
            "SELECT e.session, e.run, e.task, e.grp, oc.outcome, oc.reward, oc.step_rewards "
            f"FROM episodes e {_LATEST_OUTCOME}"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY e.session"
        )
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [
            EpisodeInfo(
                session=s,
                run=r,
                task=t,
                group=g,
                outcome=o or "unknown",
                reward=rw or 0.0,
                step_rewards={int(k): v for k, v in json.loads(sr or "{}").items()},
            )
            for s, r, t, g, o, rw, sr in rows
        ]

    def trees(self, *, whole_groups: bool = True, **filters) -> list[TokenTree]:
        """Token trees of the matching episodes. With ``whole_groups`` a filter picks
        groups and every episode of a picked group is included (GRPO needs the group)."""
        chosen = self.episodes(**filters)
        if whole_groups and filters:
            keys = {e.group_key for e in chosen}
            chosen = [e for e in self.episodes() if e.group_key in keys]
        return build_trees(self.records((e.session for e in chosen), arrays=True), chosen)

    def stats(self, **filters) -> StoreStats:
        """Counts, tokens, sharing and outcome mix of the matching episodes."""
        episodes = self.episodes(**filters)
        sessions = [e.session for e in episodes]
        trees = self.trees(whole_groups=False, **filters) if sessions else []
        call_tokens = stored = calls = 0
        with self._lock:
            for s in sessions:
                row = self._db.execute(
                    "SELECT COUNT(*), SUM(prompt_len + length(output_ids) / 4), "
                    "SUM((length(prompt_tail) + length(output_ids)) / 4) FROM calls WHERE session=?",
                    (s,),
                ).fetchone()
                calls += row[0]
                call_tokens += row[1] or 0
                stored += row[2] or 0
        mix: dict[str, int] = {}
        for e in episodes:
            mix[e.outcome] = mix.get(e.outcome, 0) + 1
        return StoreStats(
            episodes=len(episodes),
            groups=len(trees),
            calls=calls,
            outcomes=mix,
            call_tokens=call_tokens,
            stored_tokens=stored,
            sampled_tokens=sum(t.num_sampled for t in trees),
            tree_tokens=sum(t.num_tokens for t in trees),
            flat_tokens=sum(t.flat_tokens for t in trees),
            text_only_calls=sum(t.text_only_calls for t in trees),
        )

    def ingest_jsonl(
        self, records_path: str | Path, episodes_path: str | Path | None = None
    ) -> int:
        """Append the records of a proxy ``JsonlSink`` file (and the runner's episode
        infos); calls already stored are skipped. Returns the number of calls added."""
        for info in read_episodes_jsonl(episodes_path) if episodes_path else []:
            self.add_episode(info)
        added = 0
        for rec in read_jsonl(records_path):
            exists = self._db.execute(
                "SELECT 1 FROM calls WHERE session=? AND call_index=?",
                (rec.session, rec.call_index),
            ).fetchone()
            if not exists:
                self.write(rec)
                added += 1
        return added

    def export_parquet(self, path: str | Path, *, kind: str = "calls", **filters) -> int:
        """Write the matching episodes to Parquet; returns the number of rows.

        ``kind="calls"``: one row per call, full token lists, plus its episode's run, task,
        group, outcome and reward. ``kind="nodes"``: one row per token-tree node (each
        shared prefix once).
        """
        from gyre_env.trajectory.export import export_calls, export_nodes

        if kind == "calls":
            episodes = {e.session: e for e in self.episodes(**filters)}
            return export_calls(path, self.records(list(episodes)), episodes)
        if kind == "nodes":
            return export_nodes(path, self.trees(**filters))
        raise ValueError(f"kind must be 'calls' or 'nodes', got {kind!r}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _known_meta(meta: dict) -> dict:
    """Meta fields this version of ``CallRecord`` knows (a newer writer may have added more)."""
    return {k: v for k, v in meta.items() if k in CallRecord.__dataclass_fields__}


def _latest_per_branch(
    contexts: dict[int, np.ndarray], branches: dict[int, str]
) -> dict[int, np.ndarray]:
    """Keep the latest context of each branch (earlier ones are usually its prefixes)."""
    latest: dict[str, int] = {}
    for call in sorted(contexts):
        latest[branches.get(call, "")] = call
    return {c: contexts[c] for c in latest.values()}


class StoreSink:
    """The store as a proxy record sink that a stopping model service does not close
    (several services write into the one store of a run; the run closes it)."""

    def __init__(self, store: TrajectoryStore):
        self.store = store

    def write(self, record: CallRecord) -> None:
        self.store.write(record)

    def close(self) -> None:
        """The run closes the store."""


def check_tokenizer(store: TrajectoryStore, tokenizer, model_dir: Path) -> None:
    """A store holds token ids of one tokenizer: record ``tokenizer``'s fingerprint in a
    new store, and refuse (``ConfigError``) a store written with another one."""
    import hashlib

    from gyre_env.config import ConfigError

    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), separators=(",", ":"))
    fingerprint = hashlib.sha256(vocab.encode()).hexdigest()[:16]
    known = store.meta("tokenizer")
    if known is None:
        store.set_meta("tokenizer", fingerprint)
        store.set_meta("model", str(model_dir))
    elif known != fingerprint:
        raise ConfigError(
            f"{store.path} holds token ids of another tokenizer (model "
            f"{store.meta('model')}), not {model_dir}'s: use a new --out"
        )
