"""One record path: the record's ``parent``/``prefix_len`` is the only place prefix sharing
is decided; the store and the tree reuse it; writes go through a writer thread."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest

from gyre_env.trajectory import records, tree
from gyre_env.trajectory.records import CallRecord, RecordWriteError, RecordWriter
from gyre_env.trajectory.store import TrajectoryStore
from gyre_env.trajectory.synthetic import nl2repo_group


def test_old_import_paths_still_work():
    import gyre_env.proxy as proxy_pkg
    import gyre_env.trajectory as traj_pkg
    from gyre_env.proxy import records as old
    from gyre_env.trajectory.tree import EpisodeInfo, read_episodes_jsonl

    for name in ("CallRecord", "JsonlSink", "RecordSink", "BranchRole", "read_jsonl"):
        assert getattr(old, name) is getattr(records, name)
    assert proxy_pkg.CallRecord is records.CallRecord
    assert EpisodeInfo is records.EpisodeInfo is traj_pkg.EpisodeInfo
    assert read_episodes_jsonl is records.read_episodes_jsonl
    assert traj_pkg.CallRecord is CallRecord and traj_pkg.RecordWriter is RecordWriter


def _rec(session, call, prompt, output, *, parent=None, prefix_len=0, branch="b0"):
    return CallRecord(
        session=session,
        call_index=call,
        branch=branch,
        parent=parent,
        role="main",
        prompt_ids=list(prompt),
        output_ids=list(output),
        output_logprobs=[-0.5] * len(output),
        weight_version=1,
        prefix_len=prefix_len,
    )


def _bases(path):
    with TrajectoryStore(path, readonly=True) as store:
        rows = store._db.execute("SELECT call_index, base_call, base_len FROM calls ORDER BY id")
        return {c: (b, n) for c, b, n in rows.fetchall()}


def test_store_takes_the_records_claim_and_never_searches(tmp_path, monkeypatch):
    # call 2 extends call 1 (which extends call 0), but claims only call 0's context: a
    # store that compared ids would pick call 1, the longer match
    c0 = _rec("s", 0, range(1, 301), [301, 302])
    ctx0 = c0.prompt_ids + c0.output_ids
    c1 = _rec("s", 1, ctx0 + [7, 8], [9], parent=0, prefix_len=len(ctx0), branch="b1")
    ctx1 = c1.prompt_ids + c1.output_ids
    c2 = _rec("s", 2, ctx1 + [10], [11], parent=0, prefix_len=len(ctx0))
    c3 = _rec("s", 3, ctx0, [12])  # tokenized whole (prefix_len=0): stored whole
    calls = [c0, c1, c2, c3]

    def no_search(*args):
        raise AssertionError("the store compared ids for a record that says its prefix")

    monkeypatch.setattr(TrajectoryStore, "_best_base", no_search)
    with TrajectoryStore(tmp_path / "s.db") as store:
        for c in calls:
            store.write(c)
        back = list(store.records(["s"]))
    assert _bases(tmp_path / "s.db") == {
        0: (None, 0),
        1: (0, len(ctx0)),
        2: (0, len(ctx0)),
        3: (None, 0),
    }
    assert [r.to_dict() for r in back] == [c.to_dict() for c in calls]


def test_store_searches_only_records_without_a_claim(tmp_path):
    c0 = _rec("s", 0, range(1, 201), [201])
    ctx0 = c0.prompt_ids + c0.output_ids
    old = _rec("s", 1, ctx0 + [5], [6], parent=0, prefix_len=None)  # e.g. an old JSONL file
    orphan = _rec("t", 1, range(1, 50), [2], parent=0, prefix_len=10)  # parent never stored
    with TrajectoryStore(tmp_path / "s.db") as store:
        for c in (c0, old, orphan):
            store.write(c)
        back = list(store.records(["s", "t"]))
    with TrajectoryStore(tmp_path / "s.db", readonly=True) as store:
        rows = store._db.execute(
            "SELECT session, base_call, base_len FROM calls WHERE call_index=1"
        )
        assert dict((s, (b, n)) for s, b, n in rows) == {"s": (0, len(ctx0)), "t": (None, 0)}
    assert [r.to_dict() for r in back] == [c.to_dict() for c in (c0, old, orphan)]


def _shape(t):
    return [
        (n.parent, n.tokens.tolist(), n.sampled, n.role, sorted(n.sessions), sorted(n.samplers))
        for n in t.nodes
    ]


def test_tree_inserts_a_claimed_call_from_its_parent_and_builds_the_same_tree(monkeypatch):
    recs, eps = nl2repo_group(spec_len=400, group_size=3, main_tokens=300, sub_tokens=100)
    assert sum(r.shares_parent for r in recs) > len(recs) // 2
    unclaimed = [copy.copy(r) for r in recs]
    for r in unclaimed:
        r.prefix_len = None
    compared = []
    real = tree._common_prefix

    def counting(a, b):
        compared.append(min(len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(tree, "_common_prefix", counting)
    searched = tree.build_trees(unclaimed, eps)
    searched_cost, compared[:] = sum(compared), []
    claimed = tree.build_trees(recs, eps)
    claimed_cost = sum(compared)
    assert [_shape(t) for t in claimed] == [_shape(t) for t in searched]
    assert [t.call_end for t in claimed] == [t.call_end for t in searched]
    # only roots (each session's first call, branches without parent) walk from the root
    roots = sum(len(r.prompt_ids) + len(r.output_ids) for r in recs if not r.shares_parent)
    assert claimed_cost <= roots < searched_cost / 3


def test_store_reads_arrays_for_trees(tmp_path):
    recs, eps = nl2repo_group(spec_len=200, group_size=2, main_tokens=120, sub_tokens=60)
    with TrajectoryStore(tmp_path / "s.db") as store:
        for e in eps:
            store.add_episode(e)
        for r in recs:
            store.write(r)
        arrays = list(store.records([eps[0].session], arrays=True))
        trees = store.trees()
    assert all(
        isinstance(r.prompt_ids, np.ndarray) and r.prompt_ids.dtype == np.int32 for r in arrays
    )
    want = {(r.session, r.call_index): r for r in recs}
    for r in arrays:
        assert r.prompt_ids.tolist() == want[(r.session, r.call_index)].prompt_ids
    assert [_shape(t) for t in trees] == [_shape(t) for t in tree.build_trees(recs, eps)]


class _GatedSink:
    def __init__(self, fail_on=()):
        self.written, self.threads, self.closed = [], set(), False
        self.fail_on, self.gate = set(fail_on), threading.Event()
        self.gate.set()

    def write(self, record):
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        if record.call_index in self.fail_on:
            raise OSError("disk full")
        self.written.append(record.call_index)

    def close(self):
        self.closed = True


def test_writer_writes_in_order_on_its_thread_and_close_loses_nothing():
    sink = _GatedSink()
    sink.gate.clear()  # the sink hangs: writing must not wait for it
    writer = RecordWriter(sink, max_pending=64)
    for i in range(40):
        writer.write(_rec("s", i, [1], [2]))
    assert sink.written == []
    threading.Timer(0.05, sink.gate.set).start()
    writer.close()
    assert sink.written == list(range(40)) and sink.closed
    assert sink.threads == {"gyre-records"}
    writer.close()  # idempotent
    with pytest.raises(RecordWriteError, match="closed"):
        writer.write(_rec("s", 99, [1], [2]))


def test_writer_surfaces_failures_at_flush_and_close():
    sink = _GatedSink(fail_on={1, 3})
    writer = RecordWriter(sink)
    futures = [writer.submit(_rec("s", i, [1], [2])) for i in range(5)]
    with pytest.raises(RecordWriteError, match=r"2 record\(s\) could not be written.*disk full"):
        writer.flush()
    assert isinstance(futures[1].exception(), OSError) and futures[0].exception() is None
    assert sink.written == [0, 2, 4]
    writer.flush()  # reported once
    writer.submit(_rec("s", 3, [1], [2]))
    with pytest.raises(RecordWriteError, match="1 record"):
        writer.close()
    assert sink.closed
