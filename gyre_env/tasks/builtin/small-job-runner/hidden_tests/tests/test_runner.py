import io
import subprocess
import sys
import time

import jobrun.cli as cli
import jobrun.runner as runner
import pytest


def test_results_in_input_order_with_output():
    results = runner.run_commands(["echo one", "echo two >&2; exit 3", "printf x"], workers=3)
    assert results[0] == runner.CommandResult("echo one", "ok", 0, "one\n", "")
    assert (results[1].status, results[1].returncode, results[1].stderr) == ("failed", 3, "two\n")
    assert results[2].stdout == "x"


def test_commands_really_run_in_parallel(tmp_path):
    wait_all = (
        "touch {d}/{n}; for i in $(seq 100); do "
        "[ -e {d}/a ] && [ -e {d}/b ] && [ -e {d}/c ] && exit 0; sleep 0.05; done; exit 1"
    )
    cmds = [wait_all.format(d=tmp_path, n=n) for n in "abc"]
    assert [r.status for r in runner.run_commands(cmds, workers=3)] == ["ok"] * 3


def test_timeout_kills_the_process_group_quickly():
    start = time.monotonic()
    (result,) = runner.run_commands(["sleep 30 & sleep 30; echo never"], timeout=0.5)
    assert time.monotonic() - start < 10
    assert (result.status, result.returncode, result.stdout, result.stderr) == (
        "timeout",
        None,
        "",
        "",
    )


def test_fail_fast_skips_not_started():
    results = runner.run_commands(
        ["echo a", "exit 1", "echo b", "echo c"], workers=1, fail_fast=True
    )
    assert [r.status for r in results] == ["ok", "failed", "skipped", "skipped"]
    assert results[2] == runner.CommandResult("echo b", "skipped", None, "", "")


def test_without_fail_fast_everything_runs():
    results = runner.run_commands(["exit 1", "echo b"], workers=1)
    assert [r.status for r in results] == ["failed", "ok"]


def run_cli(capsys, monkeypatch, argv, stdin=""):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_example(capsys, monkeypatch):
    code, out, _ = run_cli(capsys, monkeypatch, ["--show-output", "-"], "echo hi\nexit 3\n")
    assert code == 1
    assert out == "[ok] echo hi\n    hi\n[exit 3] exit 3\n1 ok, 1 failed, 0 timed out, 0 skipped\n"


def test_cli_file_comments_and_success(capsys, monkeypatch, tmp_path):
    path = tmp_path / "cmds.txt"
    path.write_text("# setup\n\n  echo a  \necho b\n")
    code, out, _ = run_cli(capsys, monkeypatch, ["-j", "2", str(path)])
    assert code == 0
    assert out == "[ok] echo a\n[ok] echo b\n2 ok, 0 failed, 0 timed out, 0 skipped\n"


def test_cli_timeout_and_fail_fast(capsys, monkeypatch):
    code, out, _ = run_cli(
        capsys,
        monkeypatch,
        ["-j", "1", "--timeout", "0.3", "--fail-fast", "-"],
        "sleep 20\necho later\n",
    )
    assert code == 1
    assert (
        out == "[timeout] sleep 20\n[skipped] echo later\n0 ok, 0 failed, 1 timed out, 1 skipped\n"
    )


def test_cli_show_output_multiline(capsys, monkeypatch):
    out = run_cli(capsys, monkeypatch, ["--show-output", "-"], "printf 'a\\nb\\n'\n")[1]
    assert out == "[ok] printf 'a\\nb\\n'\n    a\n    b\n1 ok, 0 failed, 0 timed out, 0 skipped\n"


def test_cli_empty_input(capsys, monkeypatch):
    assert run_cli(capsys, monkeypatch, ["-"], "\n# nothing\n") == (
        0,
        "0 ok, 0 failed, 0 timed out, 0 skipped\n",
        "",
    )


def test_cli_unreadable_file(capsys, monkeypatch, tmp_path):
    code, out, err = run_cli(capsys, monkeypatch, [str(tmp_path / "nope.txt")])
    assert code == 2 and out == ""
    assert err == f"jobrun: error: cannot read {tmp_path / 'nope.txt'}\n"


def test_cli_usage_errors(capsys, monkeypatch):
    for argv in (["-j", "0", "-"], ["--timeout", "0", "-"], ["--timeout", "x", "-"]):
        with pytest.raises(SystemExit) as info:
            run_cli(capsys, monkeypatch, argv)
        assert info.value.code == 2


def test_python_dash_m(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jobrun", "-"],
        input="echo x\n",
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout == "[ok] echo x\n1 ok, 0 failed, 0 timed out, 0 skipped\n"
