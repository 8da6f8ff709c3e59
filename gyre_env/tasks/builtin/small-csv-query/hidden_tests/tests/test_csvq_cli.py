import io
import json
import subprocess
import sys

import csvq.cli as cli
import pytest

DATA = "name,age,city\nAl,7,Oslo\nBo,12,Rome\nCy,100,Oslo\n"


@pytest.fixture
def csvfile(tmp_path):
    path = tmp_path / "people.csv"
    path.write_text(DATA)
    return str(path)


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_default_table(capsys, csvfile):
    code, out, err = run(capsys, csvfile, "--where", "city=Oslo", "--select", "name,age")
    assert code == 0 and err == ""
    assert out == "name | age\n-----+----\nAl   | 7\nCy   | 100\n"


def test_csv_output_sorted_desc(capsys, csvfile):
    code, out, _ = run(capsys, csvfile, "--sort", "age", "--desc", "--format", "csv")
    assert out == "name,age,city\nCy,100,Oslo\nBo,12,Rome\nAl,7,Oslo\n"


def test_json_output(capsys, csvfile):
    code, out, _ = run(capsys, csvfile, "--limit", "1", "--format", "json", "--select", "city,name")
    assert out == json.dumps([{"city": "Oslo", "name": "Al"}], indent=2) + "\n"
    assert list(json.loads(out)[0]) == ["city", "name"]


def test_count(capsys, csvfile):
    assert run(capsys, csvfile, "--where", "age>=12", "--count") == (0, "2\n", "")


def test_stdin_and_delimiter(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("a;b\n1;x\n2;y\n"))
    code, out, _ = run(capsys, "-", "--delimiter", ";", "--where", "a>1", "--format", "csv")
    assert out == "a;b\n2;y\n"


def test_errors_return_1(capsys, tmp_path, csvfile):
    code, out, err = run(capsys, str(tmp_path / "missing.csv"))
    assert code == 1 and out == "" and err.startswith("csvq: error: ")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1\n")
    code, _, err = run(capsys, str(bad))
    assert code == 1 and "line 2" in err
    code, _, err = run(capsys, csvfile, "--select", "zip")
    assert code == 1 and "zip" in err


def test_usage_errors_exit_2(capsys, csvfile):
    with pytest.raises(SystemExit) as info:
        cli.main([csvfile, "--format", "xml"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        cli.main([csvfile, "--limit", "-1"])
    assert info.value.code == 2


def test_python_dash_m(tmp_path, csvfile):
    proc = subprocess.run(
        [sys.executable, "-m", "csvq", csvfile, "--count"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == "3\n"
