"""`gyre tasks list` and `gyre tasks show` through their argparse entry points
(`gyre tasks check` is scoring's: tests/scoring/test_check_cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gyre_env.tasks.cli import add_commands


def gyre(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gyre")
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_list_table(capsys):
    assert gyre("tasks", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "tier", "domain", "tests", "spec", "words"]
    row = next(line for line in lines if line.startswith("micro-lru-cache "))
    assert row.split() == ["micro-lru-cache", "micro", "data-structures", "12", row.split()[-1]]
    assert lines[-1].startswith("12 tasks, ")


def test_list_tier_filter(capsys):
    gyre("tasks", "list", "--tier", "repo")
    out = capsys.readouterr().out
    assert "repo-minikv" in out and "micro-lru-cache" not in out
    assert out.splitlines()[-1].startswith("2 tasks")


def test_unknown_suite_and_bad_option():
    with pytest.raises(SystemExit, match="Did you mean 'builtin'"):
        gyre("tasks", "list", "--suite", "bultin")
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        gyre("tasks", "list", "-o", "novalue")
    # a value the loader refuses: one line naming it, no traceback
    with pytest.raises(SystemExit, match=r"error: phrasings must be one of .*'cooked'"):
        gyre("tasks", "list", "--suite", "nano", "-o", "phrasings=cooked")


def test_list_nl2repo_checkout_with_options(checkout, tmp_path, capsys):
    """`-o KEY=VALUE` reaches the suite loader: the synthetic NL2RepoBench checkout lists."""
    repo, upstream = checkout
    with pytest.warns(UserWarning, match="pdfplumber-stable"):
        code = gyre(
            "tasks",
            "list",
            "--suite",
            "nl2repo",
            "-o",
            f"checkout={repo}",
            "-o",
            f"tests={upstream}",
            "-o",
            f"cache_dir={tmp_path / 'cache'}",
        )
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:4] for line in lines[1:3]] == [
        ["Other_Lib", "repo", "nl2repo", "1"],
        ["mini", "repo", "nl2repo", "2"],
    ]


def test_show_prints_metadata_and_spec(capsys):
    assert gyre("tasks", "show", "micro-token-bucket") == 0
    out = capsys.readouterr().out
    assert "domain         concurrency" in out
    assert "# Token-bucket rate limiter" in out
    with pytest.raises(SystemExit, match="Did you mean 'micro-token-bucket'"):
        gyre("tasks", "show", "micro-token-buket")


def test_check_nl2repo_gold_is_the_upstream_without_its_tests(checkout, tmp_path, capsys):
    """An NL2Repo task's gold is its upstream source minus the test paths; the preflight
    grades it (here only listed: its image is built and graded in
    tests/envs/test_nl2repo_images.py, and the local backend would pip-install the upstream
    into this Python)."""
    repo, upstream = checkout
    argv = ["--suite", "nl2repo", "-o", f"checkout={repo}", "-o", f"tests={upstream}"]
    argv += ["-o", f"cache_dir={tmp_path / 'cache'}", "mini"]
    with pytest.warns(UserWarning):
        assert gyre("tasks", "show", *argv) == 0
    out = capsys.readouterr().out
    gold = Path(next(line for line in out.splitlines() if line.startswith("gold")).split()[-1])
    files = sorted(p.relative_to(gold).as_posix() for p in gold.rglob("*") if p.is_file())
    assert files == ["mini/__init__.py", "pyproject.toml"], files  # tests/ left out
