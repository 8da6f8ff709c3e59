"""``gyre train --elastic`` refuses, before any work, an ``--out`` whose store already
holds an elastic phase's episodes unless it is resumed (a second run's sessions would
collide with the first's); ``--resume`` with nothing to continue is refused too. No sandbox or model is started: the checks come first."""

from __future__ import annotations


def _main(out, *extra):
    from gyre_env.cli import main

    argv = ["train", "--preset", "cpu-demo", "--elastic", "--out", str(out), "--no-progress"]
    return main([*argv, *extra])


def _store_with(out, run: str):
    from gyre_env.trajectory.records import EpisodeInfo
    from gyre_env.trajectory.store import TrajectoryStore

    out.mkdir(parents=True)
    store = TrajectoryStore(out / "store.db")
    info = EpisodeInfo(session=f"{run}.t.0", run=run, task="t", group="g", outcome="success")
    store.add_episode(info)
    store.close()


def test_out_with_an_elastic_phase_is_refused_without_resume(tmp_path, capsys):
    out = tmp_path / "run"
    _store_with(out, "elastic.00000")
    before = (out / "store.db").read_bytes()
    assert _main(out) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "already holds an elastic run" in err
    assert "Continue it with --resume" in err
    assert "model-sft" in err and "sft.trajectories=0" in err  # how to reuse its SFT
    assert (out / "store.db").read_bytes() == before  # nothing touched
    assert not (out / "warm-start").exists()


def test_resume_without_a_run_is_refused(tmp_path, capsys):
    assert _main(tmp_path / "empty", "--resume") == 2
    assert "--resume: no elastic run to continue" in capsys.readouterr().err


def test_unreadable_store_is_named(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "store.db").write_bytes(b"not sqlite" * 100)
    assert _main(out) == 2
    err = capsys.readouterr().err
    assert "store.db" in err and "not a readable trajectory store" in err


def test_a_synchronous_runs_store_is_not_an_elastic_run(tmp_path):
    from gyre_env.train.elastic import _check_out

    out = tmp_path / "run"
    _store_with(out, "rl.0000.r0")  # the synchronous loop's sessions do not collide
    _check_out(out, resume=False)
    _check_out(tmp_path / "fresh", resume=False)
