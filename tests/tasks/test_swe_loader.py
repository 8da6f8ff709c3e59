"""SWE-style tasks: loading from a folder or an archive, the hidden tests, bad input, and
the named-tests score (FAIL_TO_PASS share, PASS_TO_PASS regressions as failures)."""

from __future__ import annotations

import json
import shutil
import tarfile

import pytest

from gyre_env.scoring.final import named_tests_score
from gyre_env.scoring.junit import TestCase
from gyre_env.tasks import TaskFormatError, load_suite, load_task_folder
from gyre_env.tasks.swe import EXAMPLES, load_swe_task

EXAMPLE = EXAMPLES / "toml-load-paths"


@pytest.fixture
def example(tmp_path):
    dest = tmp_path / "toml-load-paths"
    shutil.copytree(EXAMPLE, dest)
    return dest


def test_shipped_example(tmp_path):
    (task,) = load_suite("swe", cache_dir=tmp_path)
    assert task.id == "toml-load-paths" and task.domain == "swe"
    assert task.fail_to_pass == [
        "tests/test_api.py::test_paths",
        "tests/test_api.py::test_warnings",
    ]
    assert len(task.pass_to_pass) == 17 and task.test_count == 19
    assert task.spec.startswith("# `toml.load` rejects")
    # The workspace starts as the repository with the bug; gold is it with gold.patch.
    ws, gold = task.workspace_dir, task.gold_dir
    assert "isinstance(f, basestring)" in (ws / "toml" / "decoder.py").read_text()
    assert "_ispath(f)" in (gold / "toml" / "decoder.py").read_text()
    assert (ws / "LICENSE").is_file()
    assert task.hidden_test_paths == ["tests/test_api.py"]
    cmd = task.test_commands[0]
    assert cmd.startswith("python -m pytest") and "tests/test_api.py::test_paths" in cmd
    again = load_swe_task(EXAMPLE, cache_dir=tmp_path)  # cached by digest, same folders
    assert again.workspace_dir == ws


def test_gyre_bench_selects_from_the_registered_suites():
    from gyre_env.bench.run import select_tasks

    assert [t.id for t in select_tasks("all", "swe")] == ["toml-load-paths"]
    assert [t.id for t in select_tasks("fix-wordcount", "harbor")] == ["fix-wordcount"]


def test_loads_from_an_archive_and_a_folder_suite(tmp_path, example):
    archive = tmp_path / "task.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(example, arcname="toml-load-paths")
    task = load_swe_task(archive, cache_dir=tmp_path / "cache")
    assert task.id == "toml-load-paths" and task.gold_dir is not None
    assert [t.id for t in load_task_folder(example)] == ["toml-load-paths"]


def test_test_patch_and_dataset_string_lists(tmp_path, example):
    meta = json.loads((example / "instance.json").read_text())
    meta["FAIL_TO_PASS"] = json.dumps(["tests/test_new.py::test_it"])  # as the dataset has it
    meta["PASS_TO_PASS"] = "[]"
    (example / "instance.json").write_text(json.dumps(meta))
    (example / "test.patch").write_text(
        "--- /dev/null\n+++ b/tests/test_new.py\n@@ -0,0 +1,2 @@\n+def test_it():\n+    pass\n"
    )
    task = load_swe_task(example, cache_dir=tmp_path / "cache")
    assert task.fail_to_pass == ["tests/test_new.py::test_it"] and task.test_count == 1
    assert (task.hidden_tests_dir / "tests" / "test_new.py").is_file()
    assert not (task.workspace_dir / "tests" / "test_new.py").exists()  # hidden from the agent


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: (d / "instance.json").unlink(), "missing instance.json"),
        (lambda d: (d / "repo.tar.gz").unlink(), "missing repo/ or repo.tar.gz"),
        (lambda d: _edit(d, FAIL_TO_PASS=[]), "FAIL_TO_PASS is empty"),
        (lambda d: _edit(d, FAIL_TO_PASS=["test_paths"]), "'test_paths' is not a pytest node"),
        (lambda d: _edit(d, FAIL_TO_PASS=["tests/nope.py::t"]), "'tests/nope.py'"),
        (lambda d: _edit(d, instance_id=None), "missing instance_id"),
        (lambda d: _edit(d, problem_statement=None), "missing issue.md"),
        (
            lambda d: (d / "gold.patch").write_text(
                "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
            ),
            "gold.patch: does not apply",
        ),
    ],
)
def test_malformed_task_names_what_is_wrong(tmp_path, example, change, message):
    change(example)
    with pytest.raises(TaskFormatError, match=message):
        load_swe_task(example, cache_dir=tmp_path / "cache")


def _edit(folder, **fields):
    meta = json.loads((folder / "instance.json").read_text())
    for key, value in fields.items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    (folder / "instance.json").write_text(json.dumps(meta))


def _case(nodeid: str, outcome: str) -> TestCase:
    path, _, name = nodeid.partition("::")
    return TestCase(classname=path[:-3].replace("/", "."), name=name, file=path, outcome=outcome)


def test_named_tests_score():
    f2p = ["tests/t.py::test_a", "tests/t.py::test_b"]
    p2p = ["tests/t.py::test_c", "tests/t.py::test_d[1]"]
    cases = lambda *outs: [_case(n, o) for n, o in zip(f2p + p2p, outs, strict=True)]  # noqa: E731
    assert named_tests_score(cases("passed", "passed", "passed", "passed"), f2p, p2p)[1] == 1.0
    # unchanged repository: the fixes fail, nothing regresses
    assert named_tests_score(cases("failed", "failed", "passed", "passed"), f2p, p2p)[1] == 0.0
    assert named_tests_score(cases("passed", "failed", "passed", "passed"), f2p, p2p)[1] == 0.5
    # both fixed, one regression: 2 of 3
    counts, score = named_tests_score(cases("passed", "passed", "failed", "passed"), f2p, p2p)
    assert score == pytest.approx(2 / 3) and counts.failed == 1 and counts.passed == 3
    # a named test that never ran (deleted, not collected) is an error, not a pass
    counts, score = named_tests_score([_case(f2p[0], "passed")], f2p, p2p)
    assert counts.errors == 3 and score == pytest.approx(1 / 4)
