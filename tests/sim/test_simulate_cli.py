"""Configs, the examples with tiny budgets, the report, and a light import."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gyre_env.cli import main
from gyre_env.config import ConfigError
from gyre_env.sim.config import load_sim_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_unknown_key_is_rejected_by_name(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[workload.tool_s]\nmedian = 1.0\ntail_fractoin = 0.1\n")
    with pytest.raises(ConfigError, match="workload.tool_s.tail_fractoin"):
        load_sim_config(bad)
    bad.write_text("[cells]\ncount = 'many'\n")
    with pytest.raises(ConfigError, match="cells.count"):
        load_sim_config(bad)
    bad.write_text("[cells]\nshared_host = true\nhost_call_s = -0.1\n")
    with pytest.raises(ConfigError, match=r"must be >= 0: cells.host_call_s = -0.1"):
        load_sim_config(bad)


@pytest.mark.parametrize("name", ["simulate_small.toml", "simulate_nl2repo.toml"])
def test_examples_load(name):
    cfg = load_sim_config(EXAMPLES / name)
    assert cfg.cells.count >= 8 and cfg.workload.max_concurrent_episodes >= 96


@pytest.mark.slow
def test_simulate_small_example_writes_json_and_html(tmp_path, capsys):
    cfg = tmp_path / "small.toml"
    text = (EXAMPLES / "simulate_small.toml").read_text()
    # tiny budgets: 15 simulated minutes, sweeps of 5 minutes over two values each
    text = text.replace("[sweep]", "[sweep]\nduration_s = 300.0", 1)
    text = text.replace("[0.0, 0.1, 0.3]", "[0.0, 0.3]").replace("[4, 8, 16]", "[4, 8]")
    text = text.replace("[0.5, 1.0, 4.0]", "[1.0, 4.0]")
    cfg.write_text(text)
    assert main(["simulate", str(cfg), "--out", str(tmp_path / "out"), "--duration", "900"]) == 0
    printed = capsys.readouterr().out
    assert "waterlevel" in printed and "colocated" in printed
    cfg_loaded = load_sim_config(cfg)
    assert cfg_loaded.sweep.duration_s == 300.0
    data = json.loads((tmp_path / "out" / "simulation.json").read_text())
    assert set(data["policies"]) == {"colocated", "static_split", "async", "dynamic", "waterlevel"}
    for p in data["policies"].values():
        assert sum(p["state_fractions"].values()) == pytest.approx(1.0)
    assert set(data["sweeps"]) == {"tool_tail_fraction", "cells", "switch_cost_scale"}
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("<img") >= 5 + 2 + 3  # Gantt per policy, two k sweeps, three sweeps


def test_simulate_nl2repo_example_runs_with_a_tiny_budget(tmp_path, capsys):
    """Two simulated minutes finish no step: the run says why every throughput is 0."""
    out = tmp_path / "out"
    args = ["simulate", str(EXAMPLES / "simulate_nl2repo.toml"), "--out", str(out)]
    assert main([*args, "--duration", "120", "--no-sweeps"]) == 0
    data = json.loads((out / "simulation.json").read_text())
    assert data["policies"]["waterlevel"]["simulated_s"] == pytest.approx(120.0)
    assert "note: no policy finished a training step in 0.03 simulated h" in capsys.readouterr().out


def test_a_run_length_that_is_not_a_positive_time_is_refused_by_name(tmp_path, capsys):
    cfg = tmp_path / "cfg.toml"
    for text, message in [
        ("duration_s = -5\n", "duration_s must be > 0 simulated seconds, got -5.0"),
        ("decision_interval_s = 0\n", "decision_interval_s must be > 0"),
        ("max_steps = 0\n", "max_steps must be >= 1 (or left out), got 0"),
        ("[sweep]\nduration_s = 0\n", "sweep.duration_s must be > 0"),
    ]:
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_sim_config(cfg)
    cfg.write_text("")
    args = ["simulate", str(cfg), "--out", str(tmp_path / "out"), "--no-sweeps"]
    assert main([*args, "--duration", "0"]) == 2
    assert (
        "--duration: duration_s must be > 0 simulated seconds, got 0.0" in capsys.readouterr().err
    )
    assert not (tmp_path / "out").exists()


def test_import_stays_light():
    code = (
        "import sys, gyre_env, gyre_env.sim.simulator, gyre_env.sim.compare, "
        "gyre_env.sim.report, gyre_env.sim.cli\n"
        "bad = [m for m in ('matplotlib', 'torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def no_matplotlib(monkeypatch):
    """``import matplotlib`` fails, as without the ``plots`` extra."""
    import builtins

    real = builtins.__import__

    def blocked(name, *a, **kw):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)
    monkeypatch.setattr(builtins, "__import__", blocked)


def test_missing_plots_extra_names_the_install(no_matplotlib):
    from gyre_env._optional import MissingExtraError
    from gyre_env.sim import report

    with pytest.raises(MissingExtraError, match=r"pip install 'gyre-env\[plots\]'"):
        report._plt()


def test_without_the_plots_extra_the_simulation_json_is_kept_and_the_install_named(
    no_matplotlib, tmp_path, capsys
):
    """A user without matplotlib gets the simulation and one line on the page it could not
    draw, not a traceback after the whole run."""
    out = tmp_path / "out"
    args = ["simulate", str(EXAMPLES / "simulate_small.toml"), "--out", str(out)]
    assert main([*args, "--duration", "120", "--no-sweeps"]) == 0
    printed = capsys.readouterr().out
    assert "no report.html" in printed and "pip install 'gyre-env[plots]'" in printed
    assert json.loads((out / "simulation.json").read_text())["policies"]
    assert not (out / "report.html").exists()
