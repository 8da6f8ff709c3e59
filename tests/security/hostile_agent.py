"""A hostile agent, run as a script by ``test_answers.py`` under the Python whose install
is attacked (a venv holding a non-editable ``gyre-env``): it plays episodes through the
public env API (``gym.make``, ``env.step`` with tool calls) and records what it saw.

    python hostile_agent.py PLAN.json RESULT.json

The plan names the env (``make``: ``gym.make`` keyword arguments, with ``env_id``), the
bash commands to try (``attacks``: name -> command) and the episodes to submit
(``submissions``: name -> {path: text}); the result holds each attack's observation and
each submission's hidden-test score, plus where ``gyre_env`` was imported from.
"""

from __future__ import annotations

import json
import sys

import gymnasium as gym

import gyre_env


def play(plan: dict) -> dict:
    make = dict(plan["make"])
    env = gym.make(make.pop("env_id"), **make)
    result: dict = {"gyre_env": gyre_env.__file__, "attacks": {}, "scores": {}}
    try:
        env.reset(seed=0)
        for name, command in plan.get("attacks", {}).items():
            obs, _, terminated, truncated, info = env.step(
                {"name": "bash", "arguments": {"command": command}}
            )
            assert not (terminated or truncated), f"episode ended at attack {name}: {obs}"
            result["attacks"][name] = obs
        for name, files in plan.get("submissions", {}).items():
            env.reset(seed=0)
            for path, text in files.items():
                env.step({"name": "write_file", "arguments": {"path": path, "content": text}})
            obs, _, _, _, info = env.step({"name": "submit", "arguments": {}})
            grading = env.unwrapped.last_grading
            result["scores"][name] = {
                "outcome": info["outcome"],
                "score": grading.score if grading is not None else None,
                "obs": obs,
            }
    finally:
        env.close()
    return result


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        plan = json.load(fh)
    with open(sys.argv[2], "w") as fh:
        json.dump(play(plan), fh)
