"""Faults that used to give the wrong message, or pass unguarded (issue 34, item 7).

Each bad input is driven through the public entry point it reaches in a real run
(``gyre train``'s config and CLI, ``gyre proxy serve``, the weight-sync publishers and
the engine they push into, the weight board) and its message is asserted: a missing
Docker daemon is named with its start command before any work; ``auto`` resolving to the
unisolated ``local`` sandbox is refused unless asked for by name; gold replay whose
episodes were infra errors does not blame the gold; a port in use is refused by number
before the model loads; SIGTERM checkpoints like Ctrl-C. (A weight version accepted
only whole: ``tests/weightsync/test_whole_versions.py``; the elastic loss's staleness
bound: ``tests/trainers/test_torch_trainer.py``.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from gyre_env.config import ConfigError
from gyre_env.train.config import TrainConfig, apply_overrides

# ---- Docker checked before any work -----------------------------------------------------


@pytest.fixture
def no_docker_daemon(monkeypatch, tmp_path):
    """A real unreachable daemon: the docker client pointed at a socket nobody serves."""
    from gyre_env.sandbox import docker as docker_sandbox

    pytest.importorskip("docker")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-daemon.sock'}")
    monkeypatch.setattr(docker_sandbox, "_client", None)  # the cached client: rebuilt
    monkeypatch.delenv("GYRE_SANDBOX", raising=False)
    return tmp_path / "no-daemon.sock"


def test_a_missing_docker_daemon_is_named_with_its_start_command(no_docker_daemon):
    from gyre_env.sandbox import SandboxError
    from gyre_env.sandbox.docker import require_docker

    with pytest.raises(SandboxError) as e:
        require_docker()
    message = str(e.value)
    assert f"not reachable at unix://{no_docker_daemon}" in message
    assert "systemctl start docker" in message and "'bwrap'" in message


def test_gyre_train_refuses_docker_without_a_daemon_before_any_work(
    no_docker_daemon, tmp_path, capsys
):
    """Before: every episode an ``infra_error``, then SFT blamed the tasks' gold."""
    from gyre_env.cli import main

    out = tmp_path / "run"
    argv = ["train", "--preset", "cpu-demo", "--out", str(out),
            "--set", 'tasks.env_kwargs={reward_mode="sparse", sandbox_backend="docker"}']  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "tasks.env_kwargs.sandbox_backend: sandbox backend 'docker'" in err
    assert "Docker daemon is not reachable" in err and "systemctl start docker" in err
    assert not out.exists(), "refused before the run folder was made"
    # the elastic driver checks too, before its warm start
    assert main([*argv, "--elastic"]) == 2
    assert "Docker daemon is not reachable" in capsys.readouterr().err
    assert not out.exists()


def test_gyre_bench_refuses_docker_without_a_daemon_before_any_work(
    no_docker_daemon, tmp_path, capsys
):
    """Fixed by a registered env (a ``gym.make`` default) or by ``env_kwargs``: no output
    folder, no model loaded, a message naming the setting and the start command."""
    import gymnasium as gym

    from gyre_env import register_task_env
    from gyre_env.bench import BenchConfig, run_bench
    from gyre_env.cli import main
    from gyre_env.sandbox import SandboxError

    env_id = "GyreTest/BenchOnDocker-v0"
    register_task_env(env_id, suite="builtin", sandbox_backend="docker")
    try:
        out = tmp_path / "bench"
        assert (
            main(["bench", env_id, "--agent", "gold", "--tasks", "micro", "--out", str(out)]) == 2
        )
        err = capsys.readouterr().err
        assert "gyre bench: env_kwargs.sandbox_backend: sandbox backend 'docker'" in err, err
        assert "Docker daemon is not reachable" in err and "systemctl start docker" in err
        assert not out.exists(), "refused before the output folder was made"
    finally:
        del gym.registry[env_id]
    cfg = BenchConfig(
        agent="gold",
        out_dir=str(out),
        env_kwargs={"sandbox_backend": "local", "grading": {"backend": "docker"}},
    )
    with pytest.raises(SandboxError, match=r"env_kwargs.grading.backend: .*not reachable"):
        run_bench(cfg)
    assert not out.exists()


def test_gold_replay_of_infra_errors_names_the_infrastructure_not_the_gold():
    from gyre_env.runner import EpisodeResult
    from gyre_env.train.run import gold_failure

    def infra(i):
        return EpisodeResult(
            episode_id=f"sft.{i}", task_id=f"t{i}", outcome="infra_error",
            message="env start failed: SandboxError: Docker daemon is not reachable",
        )  # fmt: skip

    def graded(i, score):
        outcome = "success" if score == 1.0 else "failure"
        return EpisodeResult(episode_id=f"sft.{i}", task_id=f"t{i}", outcome=outcome,
                             score=score, reward_valid=True)  # fmt: skip

    with pytest.raises(RuntimeError) as e:
        gold_failure([infra(0), infra(1), infra(2)])
    assert str(e.value) == (
        "gold replay: 3 of 3 gold episodes were infra errors (never graded; not the gold's "
        "fault): env start failed: SandboxError: Docker daemon is not reachable"
    )
    assert "check the tasks' gold" not in str(e.value)
    with pytest.raises(RuntimeError, match=r"did not solve \['t1'\]: check the tasks' gold"):
        gold_failure([graded(0, 1.0), graded(1, 0.5)])
    with pytest.raises(
        RuntimeError, match=r"did not solve \['t1'\].*\(and 1 infra errors, not graded: env start"
    ):
        gold_failure([graded(0, 1.0), graded(1, 0.0), infra(2)])
    gold_failure([graded(0, 1.0), graded(1, 1.0), infra(2)])  # solved; the infra one left out


# ---- no silent fall-back to the local backend ---------------------------------------------


@pytest.fixture
def nothing_isolates(monkeypatch):
    """A machine with no Docker daemon and no bubblewrap: ``auto`` resolves to ``local``."""
    monkeypatch.setattr("gyre_env.sandbox.docker.daemon_available", lambda: False)
    monkeypatch.setattr("gyre_env.sandbox.bwrap.bwrap_available", lambda: False)
    monkeypatch.delenv("GYRE_SANDBOX", raising=False)


def test_auto_resolving_to_local_is_refused_unless_asked_for_by_name(
    nothing_isolates, monkeypatch, tmp_path, capsys
):
    from gyre_env.cli import main
    from gyre_env.sandbox import choose_backend
    from gyre_env.train import train

    assert choose_backend("auto") == "local"
    cfg = apply_overrides(TrainConfig(), [f"out={str(tmp_path / 'run')!r}"])  # auto
    with pytest.raises(ConfigError) as e:
        cfg.check_sandboxes()
    message = str(e.value)
    assert "tasks.env_kwargs.sandbox_backend = 'auto' resolved to the 'local' sandbox" in message
    assert "isolates nothing" in message
    assert "--set tasks.env_kwargs.sandbox_backend='local'" in message
    with pytest.raises(ConfigError, match="resolved to the 'local' sandbox"):
        train(cfg)
    assert not (tmp_path / "run").exists()
    # the CLI says it and exits 2 before any work
    argv = ["train", "--preset", "cpu-demo", "--out", str(tmp_path / "cli"),
            "--set", 'tasks.env_kwargs={reward_mode="sparse"}']  # fmt: skip
    assert main(argv) == 2
    assert "resolved to the 'local' sandbox" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()
    # named, it is asked for: sandbox_backend = "local" (grading's auto follows it), or
    # GYRE_SANDBOX=local
    named = apply_overrides(
        TrainConfig(), ['tasks.env_kwargs={reward_mode="sparse", sandbox_backend="local"}']
    )
    named.check_sandboxes()
    grading_auto = apply_overrides(
        TrainConfig(),
        ['tasks.env_kwargs={sandbox_backend="local", grading={backend="auto"}}'],
    )
    grading_auto.check_sandboxes()
    monkeypatch.setenv("GYRE_SANDBOX", "local")
    cfg.check_sandboxes()


def test_gyre_bench_refuses_auto_resolving_to_local_unless_asked_for_by_name(
    nothing_isolates, monkeypatch, tmp_path, capsys
):
    from gyre_env.bench import BenchConfig
    from gyre_env.bench.run import check_sandboxes
    from gyre_env.cli import main
    from gyre_env.sandbox import SandboxError

    out = tmp_path / "bench"
    assert main(["bench", "--agent", "gold", "--tasks", "micro", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "env_kwargs.sandbox_backend = 'auto' resolved to the 'local' sandbox" in err, err
    assert "gyre bench refuses" in err and "GYRE_SANDBOX=local" in err
    assert not out.exists()
    with pytest.raises(SandboxError, match="sandbox_backend = 'auto' resolved to the 'local'"):
        check_sandboxes(BenchConfig(env_kwargs={"grading": {"backend": "local"}}))
    check_sandboxes(BenchConfig(env_kwargs={"sandbox_backend": "local"}))  # named
    monkeypatch.setenv("GYRE_SANDBOX", "local")
    check_sandboxes(BenchConfig())


# ---- a proxy port in use ------------------------------------------------------------------


def test_a_proxy_port_in_use_is_refused_by_number_before_the_model_loads(monkeypatch):
    from gyre_env.cli import main
    from gyre_env.proxy.cli import check_port

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr("gyre_env.engines.tiny.load_tokenizer", no_model)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            main(["proxy", "serve", "--port", str(port)])
        assert f"port {port} on 127.0.0.1 is in use: pick another --port" in str(e.value)
    check_port("127.0.0.1", port)  # free again: accepted
    with pytest.raises(SystemExit, match="cannot listen on 192.0.2.1"):
        check_port("192.0.2.1", port)  # TEST-NET-1: not an address of this machine


# ---- SIGTERM checkpoints like Ctrl-C ------------------------------------------------------

TINY = [
    "schedule.epochs=1",  # the toy makes one pass over each iteration's groups
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
    "model.context_length=1024", "tasks.train_count=50", "tasks.heldout_count=2",
    "rollout.group_size=2", "rollout.tasks_per_iteration=2", "rollout.max_new_tokens=16",
    "rollout.max_steps=1", "algorithm.skip_zero_variance=false", "sft.trajectories=0",
    "schedule.eval_random=false", "schedule.eval_every=100", "rollout.parallel=2",
]  # fmt: skip


def _rows(out, kind):
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _gyre_train(out, iterations, *extra):
    sets = [a for kv in TINY for a in ("--set", kv)]
    argv = ["train", "--preset", "cpu-demo", "--out", str(out), "--no-progress",
            "--iterations", str(iterations), *sets, *extra]  # fmt: skip
    return [sys.executable, "-m", "gyre_env.cli", *argv]


@pytest.mark.bwrap  # the cpu-demo preset's sandboxes
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_sigterm_mid_run_saves_a_checkpoint_and_resume_finishes(tmp_path):
    """A preempted ``gyre train`` (SIGTERM, as Slurm or Kubernetes send) stops like
    Ctrl-C: it saves a checkpoint, says how to continue, exits 130; ``--resume`` goes on
    to the end. Before, SIGTERM killed it with nothing saved since the last iteration."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        _gyre_train(out, 3), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 600
        while not _rows(out, "rl") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # mid-run: its first optimizer step is logged
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "terminated (SIGTERM): checkpoint saved at step" in stderr
    assert f"continue with `gyre train ... --out {out} --resume`" in stderr
    assert (out / "checkpoints" / "ckpt.pt").is_file()
    cursor = json.loads((out / "checkpoints" / "cursor.json").read_text())
    done = len(_rows(out, "rl"))
    assert 1 <= done < 6 and cursor["rl_step"] == done, (cursor, done)
    resumed = subprocess.run(
        _gyre_train(out, 3, "--resume"), capture_output=True, text=True, env=env, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr
    assert [r["step"] for r in _rows(out, "rl")] == [1, 2, 3, 4, 5, 6]
    assert (out / "model" / "config.json").is_file()
