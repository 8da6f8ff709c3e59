"""``gyre proxy serve`` in a subprocess: the built-in tiny model behind the proxy, records
written, SIGTERM stops it."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from gyre_env.proxy.records import read_jsonl

RUN = (
    "import argparse, sys\n"
    "from gyre_env.proxy import cli\n"
    "p = argparse.ArgumentParser(prog='gyre'); cli.add_commands(p.add_subparsers(dest='command'))\n"
    "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))\n"
)


@pytest.mark.slow
def test_proxy_serve_command(tmp_path):
    records = tmp_path / "calls.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUN,
            "proxy",
            "serve",
            "--port",
            "0",
            "--records",
            str(records),
            "--max-new-tokens-cap",
            "4",
            "--compact",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("gyre proxy listening on http://127.0.0.1:"), proc.stderr.read()
        url = line.split()[-1]
        assert (
            httpx.get(url + "/health", timeout=30).json()["replicas"]["embedded-0"]["alive"] is True
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
        r = httpx.post(url + "/s/cli/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4
    finally:
        proc.terminate()
        proc.wait(30)
    recs = read_jsonl(records)
    assert len(recs) == 1 and recs[0].session == "cli" and 0 < len(recs[0].output_ids) <= 4
