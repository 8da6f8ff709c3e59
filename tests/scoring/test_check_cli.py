"""`gyre tasks check` (the gold preflight) through its argparse entry point: scoring's
subcommand on the `gyre tasks` subparsers, wired as the root `gyre` command wires it."""

from __future__ import annotations

import argparse
import shutil

from gyre_env.scoring import cli as scoring_cli
from gyre_env.tasks import builtin_suite_dir
from gyre_env.tasks import cli as tasks_cli


def gyre(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gyre")
    scoring_cli.add_commands(tasks_cli.add_commands(parser.add_subparsers(dest="command")))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_check_one_task_passes(capsys):
    assert gyre("tasks", "check", "--task", "micro-roman-numerals") == 0
    out = capsys.readouterr().out
    assert "PASS micro-roman-numerals: gold 10/10 passed, 10 collected; empty 0/10" in out
    assert "1 passed, 0 failed" in out


def test_check_fails_on_broken_suite_folder(tmp_path, capsys):
    suite = tmp_path / "suite"
    shutil.copytree(builtin_suite_dir() / "micro-rational", suite / "micro-rational")
    gold = suite / "micro-rational" / "gold" / "rational.py"
    gold.write_text(gold.read_text().replace("return Rational(-self._n, self._d)", "return self"))
    assert gyre("tasks", "check", "--suite", str(suite)) == 1
    out = capsys.readouterr().out
    assert "FAIL micro-rational" in out and "0 passed, 1 failed" in out


def test_the_gyre_command_has_tasks_check():
    """The root parser wires `check` under `gyre tasks`, with its flags, beside `list`."""
    from gyre_env.cli import _build_parser

    parser = _build_parser()
    args = parser.parse_args(["tasks", "check", "--task", "a", "--jobs", "2", "--no-gold-ok"])
    assert args.func is scoring_cli._cmd_check
    assert (args.suite, args.task, args.jobs, args.backend, args.no_gold_ok) == (
        "builtin",
        ["a"],
        2,
        "auto",
        True,
    )
    assert parser.parse_args(["tasks", "list"]).func is tasks_cli._cmd_list
