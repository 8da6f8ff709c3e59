"""Harbor / terminal-bench task folders: loading, the grading commands, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gyre_env.tasks import TaskFormatError, load_suite, load_task_folder
from gyre_env.tasks.harbor import EXAMPLES, count_tests, load_harbor_task, pytest_targets
from gyre_env.tasks.registry import task_format


@pytest.fixture
def harbor(tmp_path):
    dest = tmp_path / "csv-total"
    shutil.copytree(EXAMPLES / "csv-total", dest)
    return dest


@pytest.fixture
def tbench(tmp_path):
    dest = tmp_path / "fix-wordcount"
    shutil.copytree(EXAMPLES / "fix-wordcount", dest)
    return dest


def test_shipped_examples_load_through_the_registered_suite(tmp_path):
    tasks = {t.id: t for t in load_suite("harbor", cache_dir=tmp_path)}
    assert sorted(tasks) == ["csv-total", "fix-wordcount"]
    csv_total, wc = tasks["csv-total"], tasks["fix-wordcount"]
    # Harbor: task.toml's timeouts, environment/Dockerfile, solution/solve.sh
    assert csv_total.wall_clock_s == 600.0 and csv_total.grading_timeout_s == 120.0
    assert csv_total.dockerfile == EXAMPLES / "csv-total" / "environment" / "Dockerfile"
    assert csv_total.solution_script.name == "solve.sh"
    assert csv_total.domain == "data-processing"
    assert csv_total.test_count == 7  # 5 functions, one parametrized over 3 cases
    assert csv_total.image == "gyre-harbor-csv-total:latest"
    # terminal-bench: task.yaml, Dockerfile at the top, run-tests.sh, solution.sh
    assert wc.spec.startswith("The script /app/wordcount.py")
    assert wc.wall_clock_s == 600.0 and wc.grading_timeout_s == 60.0
    assert wc.test_count == 6  # parametrize over a module-level list of 5, plus one
    assert wc.solution_script.name == "solution.sh"
    for task in tasks.values():
        # The grader runs the tests with its own pytest, after pointing the WORKDIR link
        # at the graded copy; the hidden overlay is the tests/ folder.
        assert task.test_commands == [
            'ln -sfn "$PWD" /tmp/gyre-workdir',
            "python -m pytest -p no:cacheprovider -q -rA tests/test_outputs.py",
        ]
        assert task.setup_commands == ['ln -sfn "$PWD" /tmp/gyre-workdir']
        assert task.hidden_test_paths == ["tests/test_outputs.py"]
        assert (task.hidden_tests_dir / "tests" / "test_outputs.py").is_file()
        assert task.remove_before_grading == ["tests"]
        assert task.gold_dir is None and task.has_gold


def test_a_folder_of_mixed_formats_loads_each_by_its_layout(tmp_path, harbor, tbench):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.move(harbor, suite / "a")
    shutil.move(tbench, suite / "b")
    assert task_format(suite / "a") == "harbor" and task_format(suite / "b") == "harbor"
    assert [t.id for t in load_task_folder(suite)] == ["a", "b"]
    assert [t.id for t in load_suite(str(suite))] == ["a", "b"]


def test_run_script_targets():
    script = EXAMPLES / "csv-total" / "tests" / "test.sh"
    assert pytest_targets(script) == ["test_outputs.py"]


@pytest.mark.parametrize(
    "line,expected",
    [
        ("pytest $TEST_DIR/test_outputs.py -rA", ["test_outputs.py"]),
        (
            "uv run pytest ${TEST_DIR}/unit/test_a.py ${TEST_DIR}/test_b.py",
            ["unit/test_a.py", "test_b.py"],
        ),
        ("python -m pytest tests/test_x.py::test_one -q", ["test_x.py::test_one"]),
    ],
)
def test_run_script_forms(tmp_path, line, expected):
    script = tmp_path / "run-tests.sh"
    script.write_text(f"#!/bin/bash\n# pytest /tests/commented_out.py\n{line}\n")
    assert pytest_targets(script) == expected


def test_run_script_through_sourced_scripts(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_outputs.py").write_text("def test_x(): pass\n")
    script = tmp_path / "run-tests.sh"
    # terminal-bench's common form: shared runners copied into $TEST_DIR at test time
    script.write_text(
        "#!/bin/bash\nsource $TEST_DIR/setup-uv-pytest.sh\nbash $TEST_DIR/run-uv-pytest.sh\n"
    )
    assert pytest_targets(script, tests) == ["test_outputs.py"]
    (tests / "run.sh").write_text("uv run pytest $TEST_DIR/test_more.py\n")
    script.write_text("#!/bin/bash\nbash $TEST_DIR/run.sh\n")
    assert pytest_targets(script, tests) == ["test_more.py"]


def test_count_tests_selector_and_classes(tmp_path):
    f = tmp_path / "test_c.py"
    f.write_text(
        "import pytest\n"
        "def test_a(): pass\n"
        "def helper(): pass\n"
        "class TestB:\n"
        "    @pytest.mark.parametrize('x', (1, 2))\n"
        "    def test_b(self, x): pass\n"
        "    def test_c(self): pass\n"
    )
    assert count_tests(f, "test_c.py") == 4
    assert count_tests(f, "test_c.py::TestB") == 3
    assert count_tests(f, "test_c.py::test_a") == 1


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "remove,named",
    [
        ("environment/Dockerfile", "Dockerfile"),
        ("tests/test.sh", "test.sh"),
        ("instruction.md", "instruction.md"),
        ("task.toml", "task.toml"),
        ("tests/test_outputs.py", "test_outputs.py"),
    ],
)
def test_malformed_harbor_folder_names_the_missing_file(harbor, remove, named):
    path = harbor / remove
    path.unlink()
    with pytest.raises(TaskFormatError, match=named):
        load_task_folder(harbor)


@pytest.mark.parametrize(
    "remove,named",
    [("Dockerfile", "Dockerfile"), ("run-tests.sh", "run-tests.sh"), ("task.yaml", "task.yaml")],
)
def test_malformed_terminal_bench_folder_names_the_missing_file(tbench, remove, named):
    (tbench / remove).unlink()
    if remove == "task.yaml":  # with neither marker file it is no task folder at all
        with pytest.raises(TaskFormatError, match="instruction.md|task.yaml"):
            load_harbor_task(tbench)
        return
    with pytest.raises(TaskFormatError, match=named):
        load_task_folder(tbench)


def test_run_script_without_pytest_is_refused(harbor):
    (harbor / "tests" / "test.sh").write_text("#!/bin/bash\nbash /tests/check.sh\n")
    with pytest.raises(TaskFormatError, match=r"test\.sh: runs no pytest file"):
        load_task_folder(harbor)


def test_bad_metadata_is_named(harbor, tbench):
    (harbor / "task.toml").write_text("[verifier]\ntimeout_sec = -1\n")
    with pytest.raises(TaskFormatError, match="timeout_sec must be a positive number"):
        load_task_folder(harbor)
    (tbench / "task.yaml").write_text("instruction: [unclosed\n")
    with pytest.raises(TaskFormatError, match="task.yaml: invalid YAML"):
        load_task_folder(tbench)


def test_prebuilt_image_without_dockerfile_is_named(harbor):
    (harbor / "environment" / "Dockerfile").unlink()
    toml = harbor / "task.toml"
    toml.write_text(toml.read_text() + 'docker_image = "example/task:1"\n')
    with pytest.raises(
        TaskFormatError, match=r"docker_image = 'example/task:1' and no .*Dockerfile"
    ):
        load_task_folder(harbor)


def test_multi_service_compose_is_refused(tbench):
    compose = tbench / "docker-compose.yaml"
    compose.write_text("services:\n  client: {build: .}\n  db: {image: postgres}\n")
    with pytest.raises(TaskFormatError, match=r"services \['client', 'db'\]"):
        load_task_folder(tbench)


def test_not_a_task_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskFormatError, match="no task folders"):
        load_task_folder(tmp_path / "empty")
    with pytest.raises(TaskFormatError, match="no such folder"):
        load_suite("harbor", path=Path(tmp_path / "missing"))
