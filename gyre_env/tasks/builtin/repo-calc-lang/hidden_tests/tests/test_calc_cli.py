import io
import subprocess
import sys

import calc.cli as cli
import pytest

EXAMPLE = "let r = 1/3\nr * 3; r + 1\ndef sq(x) = x * x\nsq(r) + undefined\n"


def run(capsys, monkeypatch, argv, stdin=""):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_example_from_stdin(capsys, monkeypatch):
    assert run(capsys, monkeypatch, [], EXAMPLE) == (
        1,
        "1/3\n1\n4/3\n",
        "error: 4:9: undefined variable 'undefined'\n",
    )


def test_decimal_option(capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, ["--decimal", "3"], EXAMPLE)
    assert out == "0.333\n1.000\n1.333\n"


def test_e_sources_share_state_and_count_as_lines(capsys, monkeypatch):
    code, out, err = run(capsys, monkeypatch, ["-e", "let a = 2", "-e", "a +", "-e", "a ** 3"])
    assert code == 1
    assert out == "2\n8\n"
    assert err == "error: 2:4: unexpected end of input\n"


def test_file_input_and_success(capsys, monkeypatch, tmp_path):
    path = tmp_path / "prog.calc"
    path.write_text("# comment line\ndef f(x) = x + 1\nf(1); f(f(1)) == 3\n")
    assert run(capsys, monkeypatch, [str(path)]) == (0, "2\ntrue\n", "")


def test_errors_continue_with_next_line(capsys, monkeypatch):
    code, out, err = run(capsys, monkeypatch, [], "1/0\n$\n5\n")
    assert code == 1 and out == "5\n"
    assert err == "error: 1:2: division by zero\nerror: 2:1: unexpected character '$'\n"


def test_unreadable_file(capsys, monkeypatch, tmp_path):
    missing = tmp_path / "missing.calc"
    assert run(capsys, monkeypatch, [str(missing)]) == (
        2,
        "",
        f"calc: error: cannot read {missing}\n",
    )


def test_bad_decimal_is_usage_error(capsys, monkeypatch):
    for bad in ("-1", "x"):
        with pytest.raises(SystemExit) as info:
            run(capsys, monkeypatch, ["--decimal", bad])
        assert info.value.code == 2


def test_python_dash_m(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "calc", "-e", "2 ** 100 / 3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout == "1267650600228229401496703205376/3\n"
