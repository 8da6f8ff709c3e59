"""Harbor / terminal-bench and SWE-style tasks graded end to end in Docker: their images
built offline, gold 1.0 and empty 0 through the episodes' grader, infra_error when the
evaluator cannot start, the env over them, and Dockerfiles that cannot be built offline
refused with the line named."""

from __future__ import annotations

import dataclasses
import os
import shutil

import gymnasium as gym
import pytest

import gyre_env  # noqa: F401
from gyre_env.sandbox.images import DEFAULT_TAG
from gyre_env.sandbox.task_images import build_task_image, build_task_images
from gyre_env.scoring import GradingConfig, grade_workspace
from gyre_env.scoring.preflight import check_tasks
from gyre_env.tasks import load_suite
from gyre_env.tasks.harbor import EXAMPLES, load_harbor_task

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def harbor_tasks(tmp_path_factory):
    tasks = load_suite("harbor", cache_dir=tmp_path_factory.mktemp("harbor"))
    results = build_task_images(tasks, base=DEFAULT_TAG, progress=lambda line: None)
    assert all(r.ok for r in results), [r.message for r in results]
    return {t.id: t for t in tasks}


@pytest.mark.slow
def test_harbor_and_terminal_bench_gold_scores_one_and_empty_zero(harbor_tasks):
    checks = check_tasks(list(harbor_tasks.values()), backend="docker", workers=2)
    for check in checks:
        assert check.ok, (check.task.id, check.problems)
        assert check.gold.score == 1.0 and check.gold.collected == check.task.test_count
        assert check.empty.score == 0.0


def test_image_is_reused_and_workdir_becomes_the_workspace(harbor_tasks):
    import docker

    task = harbor_tasks["csv-total"]
    again = build_task_image(task, base=DEFAULT_TAG, progress=lambda line: None)
    assert again.status == "up to date"
    client = docker.from_env()
    try:
        out = client.containers.run(
            task.image,
            ["bash", "-c", "readlink /app; ls /workspace; pwd"],
            remove=True,
            network_mode="none",
        ).decode()
    finally:
        client.close()
    assert out.split() == ["/tmp/gyre-workdir", "sales.csv", "/workspace"]


def test_evaluator_that_cannot_start_is_infra_error(harbor_tasks):
    task = dataclasses.replace(harbor_tasks["csv-total"], image="gyre-no-such-image:latest")
    result = grade_workspace(task, None, GradingConfig(backend="docker", control_run=False))
    assert result.status == "infra_error" and not result.valid
    assert "could not start an evaluator sandbox" in result.reason


def _task_with_dockerfile(tmp_path, dockerfile: str):
    folder = tmp_path / "task"
    shutil.copytree(EXAMPLES / "csv-total", folder)
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    task = load_harbor_task(folder, cache_dir=tmp_path / "cache")
    return dataclasses.replace(task, image=f"gyre-test-harbor-{os.getpid()}:latest")


@pytest.mark.parametrize(
    "dockerfile,named",
    [
        (
            "FROM python:3.12-slim-gyre-absent\nWORKDIR /app\n",
            r"Dockerfile:1: `FROM python:3\.12-slim-gyre-absent`: no image",
        ),
        (
            f"FROM {DEFAULT_TAG}\nWORKDIR /app\nRUN apt-get update && apt-get install -y curl\n",
            r"Dockerfile:3: `RUN apt-get update .*installs system packages",
        ),
        (
            f"FROM {DEFAULT_TAG}\nRUN pip install \\\n    numpy\n",
            r"Dockerfile:2: `RUN pip install numpy`: installs Python packages",
        ),
        (
            f"FROM {DEFAULT_TAG}\nADD https://example.com/x.tar.gz /x\n",
            r"Dockerfile:2: `ADD https://example.com/x.tar.gz /x`: downloads a URL",
        ),
    ],
)
def test_dockerfile_that_needs_the_network_fails_naming_the_line(tmp_path, dockerfile, named):
    task = _task_with_dockerfile(tmp_path, dockerfile)
    result = build_task_image(task, base=DEFAULT_TAG, progress=lambda line: None)
    assert result.status == "failed"
    assert "cannot be built offline" in result.message
    assert __import__("re").search(named, result.message), result.message


def test_failing_run_step_names_its_line(tmp_path):
    task = _task_with_dockerfile(
        tmp_path, f"FROM {DEFAULT_TAG}\nWORKDIR /app\nRUN test -f /no/such/file\n"
    )
    result = build_task_image(task, base=DEFAULT_TAG, progress=lambda line: None)
    assert result.status == "failed"
    assert "Dockerfile:3: `RUN test -f /no/such/file` failed" in result.message


# ------------------------------------------------------------------------------ SWE-style


@pytest.fixture(scope="module")
def swe_task(tmp_path_factory):
    (task,) = load_suite("swe", cache_dir=tmp_path_factory.mktemp("swe"))
    return task


@pytest.mark.slow
def test_swe_gold_one_unchanged_zero_and_a_regression_counts(swe_task, tmp_path):
    config = GradingConfig(backend="docker", control_run=False)
    gold = grade_workspace(swe_task, swe_task.gold_dir, config)
    assert gold.status == "ok" and gold.score == 1.0 and gold.passed == 19
    unchanged = grade_workspace(swe_task, swe_task.workspace_dir, config)
    assert unchanged.score == 0.0 and unchanged.passed == 17  # PASS_TO_PASS still pass
    # Both fixes in, one PASS_TO_PASS broken: 2 passed of 2 + 1 regression.
    broken = tmp_path / "broken"
    shutil.copytree(swe_task.gold_dir, broken)
    encoder = broken / "toml" / "encoder.py"  # breaks test_inline_dict only
    encoder.write_text(encoder.read_text() + "\nTomlEncoder.dump_inline_table = None\n")
    regressed = grade_workspace(swe_task, broken, config)
    assert regressed.score == pytest.approx(2 / 3, abs=1e-3) and regressed.counts.failed == 1


def test_env_over_the_swe_suite_starts_from_the_repository(swe_task):
    env = gym.make(
        "Gyre/NL2Repo-v0", suite="swe", sandbox_backend="docker", tools=["bash", "submit"]
    )
    try:
        obs, info = env.reset(seed=0)
        assert info["task"]["id"] == "toml-load-paths" and "toml.load" in obs
        obs, *_ = env.step({"name": "bash", "arguments": {"command": "ls toml tests"}})
        assert "decoder.py" in obs and "test_api.py" in obs
        obs, reward, terminated, truncated, info = env.step({"name": "submit", "arguments": {}})
        assert terminated and info["outcome"] != "infra_error"
        assert info["grading"]["score"] == 0.0 and info["grading"]["passed"] == 17
    finally:
        env.close()
