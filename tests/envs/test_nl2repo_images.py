"""`gyre images build --suite nl2repo`: a task's own image, its pins winning over the base's.

The task is NL2RepoBench-shaped and built from local files, with the two traps real tasks
set: its spec pins a pytest other than the base image's (``pytest==8.4.1`` against the
base's 9.x), and its upstream declares a runtime dependency (``attrs``, in ``setup.cfg``)
that the spec names only in prose. The hidden tests check both from inside the image.
The build downloads wheels from PyPI on the host (CI has PyPI); episodes stay offline.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import gymnasium as gym
import pytest
from gyre_env.agents import GoldAgent
from gyre_env.agents.base import EpisodeClock
from gyre_env.agents.context import EpisodeContext
from gyre_env.envs.nl2repo.env import EnvInfraError

import gyre_env  # noqa: F401
from gyre_env.cli import main

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SPEC = """# mini

Build a package `mini` whose `Point(x, y)` is an attrs class (use the attrs library) with
a `norm1()` method returning |x| + |y|.

## Core Dependency Library Versions

```
pytest==8.4.1
```
"""
UPSTREAM = {
    "setup.cfg": "[metadata]\nname = mini\nversion = 0.1\n\n[options]\npackages = mini\n"
    "install_requires =\n    attrs>=19.2.0\n",
    "setup.py": "from setuptools import setup\n\nsetup()\n",
    "mini/__init__.py": "import attr\n\n\n@attr.s\nclass Point:\n    x = attr.ib()\n"
    "    y = attr.ib()\n\n    def norm1(self):\n        return abs(self.x) + abs(self.y)\n",
    "tests/test_mini.py": "import attr\nimport pytest\n\nfrom mini import Point\n\n\n"
    "def test_norm1():\n    assert Point(3, -4).norm1() == 7\n\n\n"
    "def test_is_attrs_class():\n    assert attr.has(Point)\n\n\n"
    "def test_the_task_pins_pytest():\n    assert pytest.__version__ == '8.4.1'\n",
}


@pytest.fixture
def suite(tmp_path):
    task = tmp_path / "NL2RepoBench" / "test_files" / "mini"
    task.mkdir(parents=True)
    (task / "start.md").write_text(SPEC)
    (task / "test_case_count.txt").write_text("3\n")
    (task / "test_commands.json").write_text(
        json.dumps(["pip install -e .", "pytest --continue-on-collection-errors tests"])
    )
    (task / "test_files.json").write_text(json.dumps(["tests"]))
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    with tarfile.open(upstream / "mini-0.1.tar.gz", "w:gz") as tf:
        for rel, text in UPSTREAM.items():
            info = tarfile.TarInfo(f"mini-0.1/{rel}")
            info.size = len(text.encode())
            tf.addfile(info, io.BytesIO(text.encode()))
    prefix = f"gyre-test-{os.getpid()}-"
    kwargs = {
        "checkout": str(tmp_path / "NL2RepoBench"),
        "tests": str(upstream),
        "cache_dir": str(tmp_path / "cache"),
        "image_prefix": prefix,
    }
    yield kwargs
    import docker

    try:
        docker.from_env().images.remove(f"{prefix}mini:latest", force=True)
    except docker.errors.ImageNotFound:
        pass


def _episode(kwargs, agent=None):
    env = gym.make(
        "Gyre/NL2Repo-v0", suite="nl2repo", suite_kwargs=kwargs, sandbox_backend="docker"
    )
    try:
        obs, info = env.reset(seed=0)
        if agent is None:
            obs, reward, terminated, truncated, info = env.step({"name": "submit", "arguments": {}})
        else:
            ctx = EpisodeContext(
                episode_id="gold", env=env, observation=obs, info=info, clock=EpisodeClock()
            )
            agent.run(ctx)
            info = ctx.info
        return env.unwrapped.last_grading, info
    finally:
        env.close()


def test_build_suite_images_then_gold_passes_and_empty_scores_zero(suite, capsys):
    # Before the build: reset names the exact command that builds this task's image.
    env = gym.make("Gyre/NL2Repo-v0", suite="nl2repo", suite_kwargs=suite, sandbox_backend="docker")
    with pytest.raises(EnvInfraError) as e:
        env.reset(seed=0)
    env.close()
    message = str(e.value)
    assert f"{suite['image_prefix']}mini:latest" in message
    assert "gyre images build --suite nl2repo -o checkout=" in message
    assert f"-o tests={suite['tests']}" in message and "--task mini" in message

    argv = ["images", "build", "--suite", "nl2repo", "--task", "mini"]
    argv += [f"-o{k}={v}" for k, v in suite.items()]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[1/1] mini: built" in out and "1 built" in out, out

    grading, info = _episode(suite, GoldAgent())
    assert grading.score >= 0.95, grading
    assert grading.passed == 3, grading  # incl. attrs imported and pytest 8.4.1 in the image
    grading, _ = _episode(suite)
    assert grading.score == 0.0 and grading.passed == 0

    # A second build only checks the recipe.
    assert main(argv) == 0
    assert "[1/1] mini: up to date" in capsys.readouterr().out
