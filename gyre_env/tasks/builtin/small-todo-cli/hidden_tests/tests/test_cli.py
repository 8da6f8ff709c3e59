import os
import subprocess
import sys

import pytest
import todo.cli as cli


@pytest.fixture
def run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TODO_FILE", raising=False)
    path = str(tmp_path / "todo.json")

    def _run(*args):
        code = cli.main(["--file", path, *args])
        out, err = capsys.readouterr()
        return code, out, err

    return _run


def test_add_prints_id_and_title(run):
    assert run("add", "Buy milk") == (0, "Added #1: Buy milk\n", "")
    assert run("add", "Walk", "--priority", "high")[1] == "Added #2: Walk\n"


def test_list_format(run):
    run(
        "add",
        "Buy milk",
        "--priority",
        "high",
        "--due",
        "2024-05-01",
        "--tag",
        "shop",
        "--tag",
        "home",
    )
    run("add", "Read")
    code, out, _ = run("list")
    assert code == 0
    assert out == "  1 [ ] H Buy milk due:2024-05-01 +home +shop\n  2 [ ] N Read\n"


def test_list_empty(run):
    assert run("list") == (0, "No items.\n", "")


def test_list_filters(run):
    run("add", "a", "--tag", "x")
    run("add", "b")
    run("done", "1")
    assert run("list")[1] == "  2 [ ] N b\n"
    assert run("list", "--done")[1] == "  1 [x] N a +x\n"
    assert run("list", "--all", "--tag", "x")[1] == "  1 [x] N a +x\n"


def test_list_sort_priority(run):
    run("add", "a", "--priority", "low")
    run("add", "b", "--priority", "high")
    out = run("list", "--sort", "priority")[1]
    assert out.splitlines() == ["  2 [ ] H b", "  1 [ ] L a"]


def test_done_reopen_rm_messages(run):
    run("add", "a")
    assert run("done", "1")[1] == "Completed #1.\n"
    assert run("reopen", "1")[1] == "Reopened #1.\n"
    assert run("rm", "1")[1] == "Removed #1.\n"
    assert run("list", "--all")[1] == "No items.\n"


def test_edit_and_no_due(run):
    run("add", "a", "--due", "2024-01-01")
    assert run("edit", "1", "--title", "b", "--priority", "high")[1] == "Updated #1.\n"
    assert run("list")[1] == "  1 [ ] H b due:2024-01-01\n"
    run("edit", "1", "--no-due")
    assert run("list")[1] == "  1 [ ] H b\n"


def test_unknown_id_is_error_1(run):
    assert run("done", "42") == (1, "", "error: no item #42\n")
    assert run("rm", "7")[0] == 1


def test_invalid_date_is_error_1(run):
    code, out, err = run("add", "x", "--due", "01/02/2024")
    assert code == 1 and out == ""
    assert err.startswith("error: ")


def test_stats_with_today(run):
    run("add", "a", "--due", "2024-01-01")
    run("add", "b", "--due", "2024-12-01")
    run("add", "c")
    run("done", "3")
    assert run("--today", "2024-06-01", "stats")[1] == "open: 2, done: 1, overdue: 1\n"


def test_usage_errors_exit_2(run):
    with pytest.raises(SystemExit) as info:
        run("frobnicate")
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        run("add", "x", "--priority", "urgent")
    assert info.value.code == 2


def test_todo_file_env_and_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TODO_FILE", str(tmp_path / "env.json"))
    assert cli.main(["add", "from env"]) == 0
    assert (tmp_path / "env.json").exists()
    monkeypatch.delenv("TODO_FILE")
    assert cli.main(["add", "default"]) == 0
    assert (tmp_path / "todo.json").exists()
    capsys.readouterr()


def test_python_dash_m(tmp_path):
    env = {**os.environ, "TODO_FILE": str(tmp_path / "t.json")}
    add = subprocess.run(
        [sys.executable, "-m", "todo", "add", "via module"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert add.returncode == 0 and add.stdout == "Added #1: via module\n"
    bad = subprocess.run(
        [sys.executable, "-m", "todo", "done", "5"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and bad.stderr == "error: no item #5\n"
