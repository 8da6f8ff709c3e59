"""Visible tests: the agent may run these while it works (the hidden suite is larger)."""

from todo.cli import main
from todo.store import TodoStore


def test_store_add_and_list(tmp_path):
    store = TodoStore(tmp_path / "todo.json")
    store.add("a")
    assert [i["title"] for i in store.list()] == ["a"]


def test_cli_add_and_list(tmp_path, capsys):
    path = str(tmp_path / "todo.json")
    assert main(["--file", path, "add", "Buy milk", "--priority", "high"]) == 0
    assert main(["--file", path, "list"]) == 0
    assert capsys.readouterr().out == "Added #1: Buy milk\n  1 [ ] H Buy milk\n"
