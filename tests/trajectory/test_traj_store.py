"""The SQLite trajectory store: exact round trip, queries, export, CLI, and SIGKILL safety."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from gyre_env.proxy.records import JsonlSink
from gyre_env.trajectory import cli as traj_cli
from gyre_env.trajectory.store import StoreError, TrajectoryStore
from gyre_env.trajectory.synthetic import grpo_group, nl2repo_group


def _key(r):
    return (r.session, r.call_index)


@pytest.fixture
def filled(tmp_path):
    recs1, eps1 = nl2repo_group(spec_len=300, group_size=3, main_tokens=120, sub_tokens=60)
    recs2, eps2 = grpo_group(group_size=2, group="g2", run="run1", task="t2")
    for e in eps1:
        e.run = "run0"
    eps1[0].outcome = "infra_error"
    eps1[1].outcome = "failure"
    recs1[0].extra = {"note": "kept"}
    path = tmp_path / "store.db"
    with TrajectoryStore(path) as store:
        for e in eps1 + eps2:
            store.begin_episode(session=e.session, run=e.run, task=e.task, group=e.group)
        for r in recs1 + recs2:
            store.write(r)
        for e in eps1 + eps2:
            store.finish_episode(
                session=e.session, outcome=e.outcome, reward=e.reward, step_rewards=e.step_rewards
            )
    return path, recs1 + recs2, eps1 + eps2


def test_records_round_trip_exactly_and_deltas_save_disk(filled):
    path, records, episodes = filled
    with TrajectoryStore(path, readonly=True) as store:
        back = sorted(store.records(e.session for e in episodes), key=_key)
        assert [r.to_dict() for r in back] == [r.to_dict() for r in sorted(records, key=_key)]
        s = store.stats()
    assert s.calls == len(records) and s.episodes == len(episodes) and s.groups == 2
    assert s.stored_tokens < s.call_tokens / 4  # prompts that extend earlier calls are deltas
    assert s.outcomes == {"infra_error": 1, "success": 3, "failure": 1}
    assert 0 < s.sharing < 1 and s.tree_tokens < s.flat_tokens


def test_queries_by_run_task_outcome_and_weight_version(filled):
    path, _, episodes = filled
    with TrajectoryStore(path, readonly=True) as store:
        assert len(store.episodes(run="run0")) == 3
        assert [e.session for e in store.episodes(task="t2")] == ["g2-e0", "g2-e1"]
        assert len(store.episodes(outcome="infra_error")) == 1
        assert len(store.episodes(weight_version=3)) == 2  # grpo_group samples at version 3
        assert store.episodes(weight_version=99) == []
        (tree,) = store.trees(outcome="failure")  # whole group of the failing episode
        assert (
            len(tree.episodes) == 3 and tree.episodes[episodes[0].session].outcome == "infra_error"
        )
        (partial,) = store.trees(outcome="failure", whole_groups=False)
        assert len(partial.episodes) == 1


def test_outcome_can_be_superseded_append_only(filled):
    path, _, episodes = filled
    with TrajectoryStore(path) as store:
        store.finish_episode(session=episodes[0].session, outcome="success", reward=1.0)
        (e,) = [x for x in store.episodes() if x.session == episodes[0].session]
        assert (e.outcome, e.reward) == ("success", 1.0)
        assert store._db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0] == len(episodes) + 1


def test_bad_writes_and_files_are_refused(filled, tmp_path):
    path, records, _ = filled
    with TrajectoryStore(path) as store, pytest.raises(StoreError, match="already stored"):
        store.write(records[0])
    with (
        TrajectoryStore(path, readonly=True) as store,
        pytest.raises(StoreError, match="read-only"),
    ):
        store.write(records[0])
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a readable trajectory store"):
        TrajectoryStore(junk)
    with pytest.raises(FileNotFoundError):
        TrajectoryStore(tmp_path / "missing.db", readonly=True)


def test_parquet_export_calls_and_nodes(filled, tmp_path):
    import pyarrow.parquet as pq

    path, records, _ = filled
    with TrajectoryStore(path, readonly=True) as store:
        n_calls = store.export_parquet(tmp_path / "calls.parquet", run="run0")
        n_nodes = store.export_parquet(tmp_path / "nodes.parquet", kind="nodes")
        with pytest.raises(ValueError, match="kind must be"):
            store.export_parquet(tmp_path / "x.parquet", kind="rows")
    calls = pq.read_table(tmp_path / "calls.parquet").to_pylist()
    assert n_calls == len(calls) == sum(1 for r in records if r.session.startswith("nl2repo"))
    by_key = {_key(r): r for r in records}
    for row in calls:
        r = by_key[(row["session"], row["call_index"])]
        assert row["prompt_ids"] == r.prompt_ids and row["output_logprobs"] == r.output_logprobs
        assert row["run"] == "run0"
    nodes = pq.read_table(tmp_path / "nodes.parquet")
    assert nodes.num_rows == n_nodes and set(nodes.column("group").to_pylist()) == {"nl2repo", "g2"}


def test_cli_import_stats_export(tmp_path, capsys):
    records, episodes = grpo_group(group_size=3, group="cli")
    sink = JsonlSink(tmp_path / "calls.jsonl")
    for r in records:
        sink.write(r)
    sink.close()
    (tmp_path / "eps.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in episodes))
    store = str(tmp_path / "s.db")
    import argparse

    parser = argparse.ArgumentParser()
    traj_cli.add_commands(parser.add_subparsers())

    def run(*argv):
        args = parser.parse_args(list(argv))
        return args.func(args)

    assert (
        run(
            "trajectories",
            "import",
            "--store",
            store,
            "--records",
            str(tmp_path / "calls.jsonl"),
            "--episodes",
            str(tmp_path / "eps.jsonl"),
        )
        == 0
    )
    assert (
        run("trajectories", "import", "--store", store, "--records", str(tmp_path / "calls.jsonl"))
        == 0
    )
    assert "added 0 calls" in capsys.readouterr().out  # idempotent
    assert run("trajectories", "stats", "--store", store, "--json") == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["episodes"] == 3 and stats["calls"] == len(records)
    assert stats["sharing"] == pytest.approx(1 - stats["tree_tokens"] / stats["flat_tokens"])
    assert run("trajectories", "stats", "--store", store, "--outcome", "success") == 0
    assert "sharing" in capsys.readouterr().out
    assert (
        run("trajectories", "export", "--store", store, "--out", str(tmp_path / "o.parquet")) == 0
    )
    assert f"wrote {len(records)} calls rows" in capsys.readouterr().out
    assert run("trajectories", "stats", "--store", str(tmp_path / "nope.db")) == 1
    assert "no trajectory store" in capsys.readouterr().err


WRITER = textwrap.dedent(
    """
    import sys

    import numpy as np

    from gyre_env.proxy.records import CallRecord

    def make(rnd, i):
        # sessions of 10 calls whose prompts extend each other: deltas on disk
        rng = np.random.default_rng(rnd * 100003 + i // 10)
        ctx = rng.integers(1, 50000, 3000).tolist()
        for _ in range(i % 10 + 1):
            out = rng.integers(1, 50000, 400).tolist()
            lps = (-rng.random(400)).tolist()
            prompt = list(ctx)
            ctx = ctx + out + rng.integers(1, 50000, 4000).tolist()
        return CallRecord(session=f"r{rnd}-s{i // 10}", call_index=i % 10, branch="main",
                          parent=None if i % 10 == 0 else i % 10 - 1, role="main",
                          prompt_ids=prompt, output_ids=out, output_logprobs=lps,
                          weight_version=rnd, extra={"run": f"round{rnd}"})

    if __name__ == "__main__":
        from gyre_env.trajectory.store import TrajectoryStore
        store = TrajectoryStore(sys.argv[1])
        rnd = int(sys.argv[2])
        records = [make(rnd, i) for i in range(40)]  # generated first: the loop only writes
        for i, record in enumerate(records):
            store.write(record)
            print(i + 1, flush=True)
    """
)


def test_writer_killed_with_sigkill_loses_at_most_the_record_in_flight(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    scope: dict = {}
    exec(compile(WRITER, str(script), "exec"), scope)  # the same record generator
    db = tmp_path / "killed.db"
    rng = random.Random(0)
    for rnd in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(db), str(rnd)], stdout=subprocess.PIPE, text=True
        )
        target, done = rng.randrange(8, 25), 0
        while done < target:
            line = proc.stdout.readline()
            assert line, "writer died before the kill"
            done = int(line)
        time.sleep(rng.random() * 0.01)  # land somewhere inside the next write
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for line in proc.stdout:  # lines printed between our read and the kill
            done = int(line)
        assert proc.returncode == -signal.SIGKILL
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        con.close()
        with TrajectoryStore(db) as store:  # reopens for writing after the crash
            eps = store.episodes(run=f"round{rnd}")
            got = sorted(
                store.records(e.session for e in eps), key=lambda r: (r.session, r.call_index)
            )
        assert done <= len(got) <= done + 1
        want = [scope["make"](rnd, i) for i in range(len(got))]
        assert [r.to_dict() for r in got] == [
            w.to_dict() for w in sorted(want, key=lambda r: (r.session, r.call_index))
        ]
