"""The env pointed at an NL2RepoBench checkout (the documented way: suite="nl2repo")."""

from __future__ import annotations

import io
import json
import tarfile

import gymnasium as gym

import gyre_env  # noqa: F401

TESTS = (
    "from mini import double\n\n\ndef test_double():\n    assert double(2) == 4\n\n\n"
    "def test_zero():\n    assert double(0) == 0\n"
)
PYPROJECT = (
    '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
    '[project]\nname = "mini"\nversion = "0.1"\n'
)


def _checkout(tmp_path):
    task = tmp_path / "NL2RepoBench" / "test_files" / "mini"
    task.mkdir(parents=True)
    (task / "start.md").write_text("# mini\n\nA package `mini` with `double(x)` = 2x.\n")
    (task / "test_case_count.txt").write_text("2\n")
    (task / "test_commands.json").write_text(
        json.dumps(["pip install -e .", "pytest --continue-on-collection-errors tests"])
    )
    (task / "test_files.json").write_text(json.dumps(["tests"]))
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    with tarfile.open(upstream / "mini-0.1.tar.gz", "w:gz") as tf:
        for rel, text in {"tests/test_mini.py": TESTS, "mini/__init__.py": ""}.items():
            info = tarfile.TarInfo(f"mini-0.1/{rel}")
            info.size = len(text.encode())
            tf.addfile(info, io.BytesIO(text.encode()))
    return tmp_path / "NL2RepoBench", upstream


def test_env_on_an_nl2repobench_checkout(tmp_path):
    checkout, upstream = _checkout(tmp_path)
    env = gym.make(
        "Gyre/NL2Repo-v0",
        suite="nl2repo",
        suite_kwargs={
            "checkout": str(checkout),
            "tests": str(upstream),
            "cache_dir": str(tmp_path / "cache"),
        },
        sandbox_backend="local",
        sandbox={"env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}},
        grading={"pytest_plugins": []},
    )
    obs, info = env.reset(seed=0)
    assert info["task"]["id"] == "mini" and "double(x)" in obs
    rewards = []
    for action in (
        {"name": "write_file", "arguments": {"path": "pyproject.toml", "content": PYPROJECT}},
        {
            "name": "write_file",
            "arguments": {
                "path": "mini/__init__.py",
                "content": "def double(x):\n    return 2 * x\n",
            },
        },
        {"name": "submit", "arguments": {}},
    ):
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
    assert terminated and info["outcome"] == "success", (obs, env.unwrapped.last_grading)
    assert sum(rewards) == 1.0 and info["grading"]["passed"] == 2
    env.close()
