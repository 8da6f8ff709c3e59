"""Configuration and bad input: unknown keys, backend choice, clear errors."""

from __future__ import annotations

import logging
import os

import pytest

from gyre_env.sandbox import (
    ExecResult,
    SandboxConfig,
    SandboxError,
    choose_backend,
    make_sandbox,
)


def test_unknown_config_keys_are_rejected_by_name():
    with pytest.raises(ValueError, match=r"unknown sandbox config keys \['memroy_mb'\]"):
        SandboxConfig.from_dict({"memroy_mb": 512})
    assert SandboxConfig.from_dict({"memory_mb": 512, "pids": 32}).pids == 32
    with pytest.raises(TypeError):
        SandboxConfig(512)  # kw_only: a positional value is a mistake


def test_backend_choice(monkeypatch):
    with pytest.raises(ValueError, match="unknown sandbox backend 'podman'"):
        choose_backend("podman")
    for name in ("docker", "bwrap", "local"):
        assert choose_backend(name) == name
    monkeypatch.setenv("GYRE_SANDBOX", "local")
    assert choose_backend("auto") == "local"
    assert choose_backend(None) == "local"
    assert choose_backend("bwrap") == "bwrap"  # an explicit choice beats the variable


@pytest.mark.docker
def test_auto_picks_docker_when_a_daemon_answers(monkeypatch):
    monkeypatch.delenv("GYRE_SANDBOX", raising=False)
    assert choose_backend("auto") == "docker"


def test_the_local_backend_warns_loudly(caplog):
    with caplog.at_level(logging.WARNING), make_sandbox(backend="local") as sandbox:
        assert sandbox.exec("echo hi").stdout == "hi\n"
    assert "isolates NOTHING" in caplog.text


@pytest.mark.docker
def test_a_missing_image_is_a_clear_error_and_leaves_nothing(make):
    from gyre_env.sandbox.docker import docker_client

    def ours() -> set[str]:  # other test sessions may start containers meanwhile
        mine = {"label": f"gyre.owner_pid={os.getpid()}"}
        return {
            c.id
            for c in docker_client().containers.list(all=True, filters=mine, ignore_removed=True)
        }

    before = ours()
    with pytest.raises(SandboxError, match="gyre-no-such-image:latest.*gyre images build"):
        make("docker", image="gyre-no-such-image:latest")
    assert ours() <= before


@pytest.mark.parametrize("timeout", [0, -1])
def test_a_timeout_that_is_not_positive_is_refused(make, timeout):
    sandbox = make("local")
    with pytest.raises(ValueError, match="timeout"):
        sandbox.exec("true", timeout=timeout)


def test_output_joins_stdout_and_stderr_like_a_terminal():
    result = ExecResult(exit_code=1, stdout="out", stderr="err\n", duration_s=0.1)
    assert result.output == "out\nerr\n" and not result.ok
    assert ExecResult(exit_code=0, stdout="", stderr="e", duration_s=0).output == "e"
    assert not ExecResult(exit_code=0, stdout="", stderr="", duration_s=0, timed_out=True).ok
