import io
import subprocess
import sys
import types

import pytest
import wordcount.cli as cli


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_bytes(b"one two\nthree\n")
    (tmp_path / "b.txt").write_bytes(b"four\n")
    (tmp_path / "big.txt").write_bytes(b"x " * 600 + b"\n")
    return tmp_path


def run(capsys, monkeypatch, argv, stdin=b""):
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(stdin)))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_two_files_with_total(files, capsys, monkeypatch):
    code, out, err = run(capsys, monkeypatch, ["a.txt", "b.txt"])
    assert code == 0 and err == ""
    assert out == " 2  3 14 a.txt\n 1  1  5 b.txt\n 3  4 19 total\n"


def test_single_file_no_total(files, capsys, monkeypatch):
    assert run(capsys, monkeypatch, ["a.txt"])[1] == " 2  3 14 a.txt\n"


def test_column_order_ignores_flag_order(files, capsys, monkeypatch):
    assert run(capsys, monkeypatch, ["-L", "-c", "-l", "a.txt"])[1] == " 2 14  7 a.txt\n"


def test_all_columns(files, capsys, monkeypatch):
    out = run(capsys, monkeypatch, ["-l", "-w", "-m", "-c", "-L", "a.txt"])[1]
    assert out == " 2  3 14 14  7 a.txt\n"


def test_width_from_largest_number_including_total(files, capsys, monkeypatch):
    out = run(capsys, monkeypatch, ["-w", "b.txt", "big.txt"])[1]
    assert out == "  1 b.txt\n600 big.txt\n601 total\n"


def test_stdin_without_name(files, capsys, monkeypatch):
    assert run(capsys, monkeypatch, [], stdin=b"a b\nc\n")[1] == "2 3 6\n"


def test_dash_is_stdin_with_name(files, capsys, monkeypatch):
    out = run(capsys, monkeypatch, ["-l", "-", "b.txt"], stdin=b"x\ny\nz\n")[1]
    assert out == "3 -\n1 b.txt\n4 total\n"


def test_unreadable_file(files, capsys, monkeypatch):
    code, out, err = run(capsys, monkeypatch, ["-l", "a.txt", "missing.txt", "b.txt"])
    assert code == 1
    assert err == "wordcount: missing.txt: cannot read\n"
    assert out == "2 a.txt\n1 b.txt\n3 total\n"


def test_top_mode(files, capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, ["--top", "2"], stdin=b"b a b\nc b a\n")
    assert code == 0 and out == "3 b\n2 a\n"


def test_top_alignment_and_files(files, capsys, monkeypatch):
    (files / "c.txt").write_bytes(b"w " * 12 + b"v")
    out = run(capsys, monkeypatch, ["--top", "3", "c.txt", "a.txt"])[1]
    assert out == "12 w\n 1 one\n 1 three\n"


def test_top_with_stop_file(files, capsys, monkeypatch):
    (files / "stop.txt").write_text("The\n\n  a \n")
    out = run(capsys, monkeypatch, ["--top", "5", "--stop", "stop.txt"], stdin=b"the a cat the")[1]
    assert out == "1 cat\n"
    code, out, err = run(capsys, monkeypatch, ["--top", "1", "--stop", "nope.txt"], stdin=b"x")
    assert code == 1 and out == "1 x\n" and "nope.txt" in err


def test_top_no_words_prints_nothing(files, capsys, monkeypatch):
    assert run(capsys, monkeypatch, ["--top", "3"], stdin=b"... !!!") == (0, "", "")


def test_usage_errors(files, capsys, monkeypatch):
    for argv in (["--top", "-1"], ["--top", "x"], ["-z"]):
        with pytest.raises(SystemExit) as info:
            run(capsys, monkeypatch, argv)
        assert info.value.code == 2


def test_python_dash_m(files):
    proc = subprocess.run(
        [sys.executable, "-m", "wordcount", "-w", "a.txt"],
        cwd=files,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == "3 a.txt\n"
