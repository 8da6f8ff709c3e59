"""``gyre train`` with mini-swe-agent playing the episodes (``rollout.agent``): its calls
go through the proxy into the store like the LangGraph agent's, group into token trees
and train the model. Real parts throughout (Docker sandboxes, proxy, embedded tiny
model, store, torch trainer), tiny budgets."""

from __future__ import annotations

import json

import pytest

from gyre_env.train.config import ConfigError, TrainConfig, apply_overrides, load_config

TINY = [
    "schedule.epochs=1",  # the toy makes one pass over each iteration's groups
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
    "model.context_length=2048", "tasks.train_count=50", "tasks.heldout_count=1",
    "rollout.group_size=2", "rollout.tasks_per_iteration=2", "rollout.max_new_tokens=16",
    "rollout.max_steps=2", "logging.progress=false", "schedule.eval_random=false",
    "sft.trajectories=0", "schedule.iterations=1", "algorithm.skip_zero_variance=false",
    'rollout.agent="mini-swe-agent"',
    # the nano env's default tools have no bash, mini-swe-agent's only one
    'tasks.env_kwargs={reward_mode="sparse", sandbox_backend="bwrap", tools=["bash", "submit"], '
    "grading={memoize=true, pytest_plugins=[]}}",
]  # fmt: skip


def test_rollout_agent_is_checked():
    with pytest.raises(
        ConfigError, match=r"rollout.agent must be one of langgraph, mini-swe-agent"
    ):
        apply_overrides(TrainConfig(), ['rollout.agent="mini-swe"'])
    with pytest.raises(ConfigError, match=r"Gyre/NL2Repo-nano-v0 offers .*add 'bash'"):
        apply_overrides(load_config(preset="cpu-demo"), ['rollout.agent="mini-swe-agent"'])


def test_make_agent_follows_rollout_agent(tmp_path):
    from gyre_env.agents import MiniSweAgent

    from gyre_env.train.setup import make_agent

    cfg = apply_overrides(load_config(preset="cpu-demo"), TINY)
    agent = make_agent(cfg, 0.5, 0.1)
    assert isinstance(agent, MiniSweAgent)
    assert agent.config.temperature == 0.5 and agent.config.max_steps == 2
    assert agent.config.min_p == 0.1
    assert agent.agent_settings["step_limit"] == 2


@pytest.mark.docker
def test_a_run_trains_on_mini_swe_agent_trajectories(tmp_path):
    """One GRPO iteration of mini-swe-agent episodes: the store holds each task's group as
    a token tree of the episodes' recorded calls, and the trainer took its steps."""
    from gyre_env.train import train
    from gyre_env.trajectory.store import TrajectoryStore

    cfg = apply_overrides(load_config(preset="cpu-demo"), [*TINY, f"out={str(tmp_path / 'run')!r}"])
    summary = train(cfg)
    assert not summary.interrupted
    rows = [json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if r["kind"] == "iteration"]) == 1
    assert [r["step"] for r in rows if r["kind"] == "rl"]  # the trainer stepped
    with TrajectoryStore(cfg.out_dir / "store.db", readonly=True) as store:
        trees = store.trees(run="rl.0000.r0")
        assert len(trees) == 2 and all(len(t.episodes) == 2 for t in trees)
        assert all(n.weight_version == 0 for t in trees for n in t.nodes if n.sampled)
        assert sum(1 for t in trees for n in t.nodes if n.sampled) >= 4  # >= 1 call/episode
