"""benchmarks/tree_packing.py runs end to end at toy sizes on a JSONL records file.

Checks the plumbing and the invariants it prints (token ratio, exactness of the Hugging
Face Qwen2 it trains, progress on stderr), not speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gyre_env.proxy.records import JsonlSink
from gyre_env.trajectory.synthetic import grpo_group

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tree_packing.py"
TOY = ["--d-model", "32", "--heads", "2", "--kv-heads", "1", "--layers", "1", "--repeats", "0"]
TOY += ["--block-size", "32"]


@pytest.mark.slow
def test_benchmark_on_recorded_trajectories(tmp_path):
    records, episodes = grpo_group(group_size=3, prompt_len=96, turns=2, turn_tokens=24)
    sink = JsonlSink(tmp_path / "calls.jsonl")
    for r in records:
        sink.write(r)
    sink.close()
    (tmp_path / "eps.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in episodes))
    out = tmp_path / "figures.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--scenarios",
        "--records",
        str(tmp_path / "calls.jsonl"),
        "--episodes",
        str(tmp_path / "eps.jsonl"),
        "--json-out",
        str(out),
        *TOY,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "records" in res.stdout
    assert "[1/1] records: time" in res.stderr  # a progress line per scenario step
    figures = json.loads(out.read_text())
    rec = figures["records"]
    assert rec["flat"]["tokens"] == 3 * (96 + 2 * 24)  # every path with its full prefix
    assert rec["tree"]["tokens"] == 96 + 3 * 2 * 24  # the prompt once
    assert rec["flat"]["loss_tokens"] == rec["tree"]["loss_tokens"] == 3 * 2 * 12
    assert figures["records"]["time"]["max_abs_diff"] <= 1e-5
    assert rec["tree"]["peak_mib"] > 0 and figures["records"]["time"]["flat_cpu_s"] > 0
