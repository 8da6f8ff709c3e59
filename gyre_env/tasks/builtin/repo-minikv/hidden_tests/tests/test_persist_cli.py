import io
import json
import subprocess
import sys

import minikv.cli as cli
import minikv.persist as persist
import minikv.protocol as protocol
import minikv.session as session_mod
import minikv.store as store_mod
import pytest


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def filled_store(clock):
    store = store_mod.Store(clock=clock)
    store.execute("SET", "s", "v")
    store.execute("RPUSH", "l", "a", "b")
    store.execute("HSET", "h", "f", "1")
    store.execute("SADD", "z", "y", "x")
    store.execute("SET", "t", "temp", "PX", "5000")
    return store


def test_snapshot_format(tmp_path):
    path = tmp_path / "snap.json"
    persist.save_snapshot(filled_store(Clock(100.0)), path)
    data = json.loads(path.read_text())
    assert data["version"] == 1
    assert data["keys"]["s"] == {"type": "string", "value": "v", "ttl_ms": None}
    assert data["keys"]["l"]["value"] == ["a", "b"]
    assert data["keys"]["h"]["value"] == {"f": "1"}
    assert data["keys"]["z"]["value"] == ["x", "y"]
    assert data["keys"]["t"]["ttl_ms"] == pytest.approx(5000)


def test_snapshot_round_trip_with_ttl(tmp_path):
    path = tmp_path / "snap.json"
    persist.save_snapshot(filled_store(Clock(100.0)), path)
    clock = Clock(9000.0)
    store = persist.load_snapshot(path, clock=clock)
    assert store.execute("LRANGE", "l", "0", "-1") == ["a", "b"]
    assert store.execute("SMEMBERS", "z") == ["x", "y"]
    assert store.execute("HGET", "h", "f") == "1"
    assert store.execute("PTTL", "t") == 5000
    clock.now += 5
    assert store.execute("GET", "t") is None


def test_expired_keys_not_saved(tmp_path):
    clock = Clock(0.0)
    store = filled_store(clock)
    clock.now = 10.0
    persist.save_snapshot(store, tmp_path / "s.json")
    assert "t" not in json.loads((tmp_path / "s.json").read_text())["keys"]


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"version": 2, "keys": {}}',
        '{"version": 1, "keys": {"k": {"type": "list", "value": "x"}}}',
    ],
)
def test_load_bad_snapshot(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError):
        persist.load_snapshot(path)


def test_load_missing_snapshot(tmp_path):
    with pytest.raises(ValueError):
        persist.load_snapshot(tmp_path / "missing.json")


def test_session_save(tmp_path):
    path = tmp_path / "snap.json"
    session = session_mod.Session(store_mod.Store(), snapshot_path=str(path))
    session.execute(["SET", "a", "1"])
    assert session.execute(["SAVE"]) == protocol.Status("OK")
    assert json.loads(path.read_text())["keys"]["a"]["value"] == "1"


def run_cli(capsys, monkeypatch, argv, stdin=""):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


EXAMPLE_IN = 'SET greeting "hello world"\nGET greeting\nLPUSH l a b\nLRANGE l 0 -1\nINCR greeting\n'
EXAMPLE_OUT = (
    'OK\n"hello world"\n(integer) 2\n1) "b"\n2) "a"\n'
    "(error) ERR value is not an integer or out of range\n"
)


def test_cli_stdin_example(capsys, monkeypatch):
    assert run_cli(capsys, monkeypatch, [], EXAMPLE_IN) == (0, EXAMPLE_OUT, "")


def test_cli_script_file_skips_comments(capsys, monkeypatch, tmp_path):
    script = tmp_path / "s.kv"
    script.write_text("# set things\n\nSET a 1\n  # more\nGET a\n")
    assert run_cli(capsys, monkeypatch, [str(script)]) == (0, 'OK\n"1"\n', "")


def test_cli_snapshot_persists_between_runs(capsys, monkeypatch, tmp_path):
    snap = str(tmp_path / "db.json")
    assert (
        run_cli(capsys, monkeypatch, ["--snapshot", snap], "SADD s m\nSAVE\n")[1]
        == "(integer) 1\nOK\n"
    )
    assert run_cli(capsys, monkeypatch, ["--snapshot", snap], "SMEMBERS s\n")[1] == '1) "m"\n'


def test_cli_errors(capsys, monkeypatch, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code, out, err = run_cli(capsys, monkeypatch, ["--snapshot", str(bad)], "PING\n")
    assert code == 1 and out == "" and err == f"minikv: error: cannot load snapshot {bad}\n"
    missing = tmp_path / "none.kv"
    code, _, err = run_cli(capsys, monkeypatch, [str(missing)])
    assert code == 1 and err == f"minikv: error: cannot read {missing}\n"


def test_python_dash_m(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "minikv"],
        input=EXAMPLE_IN,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == EXAMPLE_OUT
