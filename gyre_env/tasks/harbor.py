"""Harbor and terminal-bench tasks: an instruction, a Dockerfile, tests and a run script.

The two layouts those projects publish, one folder per task::

    Harbor                               terminal-bench
    instruction.md                       task.yaml      (instruction:, max_agent_timeout_sec,
    task.toml   ([agent] / [verifier]                    max_test_timeout_sec, ...)
                 timeout_sec, [environment])             Dockerfile (+ docker-compose.yaml)
    environment/Dockerfile                run-tests.sh
    tests/test.sh, tests/*.py             tests/*.py
    solution/solve.sh (optional)          solution.sh (optional)

Each becomes a Gyre ``Task`` graded like every other: the ``tests/`` folder is the hidden
overlay, copied into a fresh evaluator sandbox only, and the pytest files the run script
runs are run by the grader's own pytest (signed verdicts; ``infra_error`` when the
evaluator itself fails). The run script is read, not run: its pytest targets
(``$TEST_DIR/test_outputs.py``, ``/tests/test_outputs.py``, ``tests/...``) become the
grading command, and what else it does (``uv``/``pip install pytest``, ``curl``) needs a
network that neither episodes nor the grader have. A script that runs no pytest file is
rejected with a message naming it. The declared test count is the number of test
functions in those files (a literal ``parametrize`` list counts each case).

The image is built from the task's Dockerfile, offline (``gyre images build --suite
DIR``; ``Task.dockerfile``); its ``WORKDIR`` (e.g. ``/app``) becomes the workspace: the
build moves its files into ``/workspace`` and leaves ``/app`` a link that points at
the workspace an agent or the grader is in (``setup_commands`` and the first grading
command set ``/tmp/gyre-workdir``), so tests that open ``/app/out.txt`` read the graded
copy. Gold is the solution script, run in an agent sandbox (``Task.solution_script``).
A malformed folder is a ``TaskFormatError`` naming the missing file.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from pathlib import Path

from gyre_env.tasks.nl2repo import build_overlay
from gyre_env.tasks.task import Task, TaskFormatError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

EXAMPLES = Path(__file__).resolve().parent / "harbor_examples"
"""Small Harbor and terminal-bench tasks written for Gyre (``load_suite("harbor")``)."""
WORKDIR_LINK = "/tmp/gyre-workdir"
"""Where the image's WORKDIR link points; each sandbox points it at its workspace."""
_LINK_COMMAND = f'ln -sfn "$PWD" {WORKDIR_LINK}'
_SUB_SCRIPT = re.compile(r"(?:\$\{?TEST_DIR\}?|/tests|(?<![\w/.$])tests)/([\w./-]+\.sh)\b")
_SHARED_RUNNERS = ("run-uv-pytest.sh", "run-pytest.sh")
"""terminal-bench's shared runners, copied in at test time: they run test_outputs.py."""
_TEST_PATH = re.compile(
    r"(?:\$\{?TEST_DIR\}?|/tests|(?<![\w/.$])tests)/([\w./-]+\.py(?:::[\w\[\]-]+)?)"
)


def is_harbor_task(folder: Path) -> bool:
    """A Harbor task (``instruction.md``) or a terminal-bench one (``task.yaml``)."""
    return (folder / "instruction.md").is_file() or (folder / "task.yaml").is_file()


def load_harbor_suite(
    path: str | Path = EXAMPLES,
    *,
    cache_dir: str | Path | None = None,
    image_prefix: str = "gyre-harbor-",
) -> list[Task]:
    """Every Harbor or terminal-bench task folder under ``path`` (or ``path`` itself)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise TaskFormatError(f"{root}: no such folder of Harbor / terminal-bench tasks")
    if is_harbor_task(root):
        return [load_harbor_task(root, cache_dir=cache_dir, image_prefix=image_prefix)]
    folders = [p for p in sorted(root.iterdir()) if p.is_dir() and is_harbor_task(p)]
    if not folders:
        raise TaskFormatError(
            f"{root}: no Harbor / terminal-bench tasks (folders with instruction.md or task.yaml)"
        )
    return [load_harbor_task(p, cache_dir=cache_dir, image_prefix=image_prefix) for p in folders]


def load_harbor_task(
    folder: str | Path, *, cache_dir: str | Path | None = None, image_prefix: str = "gyre-harbor-"
) -> Task:
    """One Harbor or terminal-bench task folder as a Gyre task (see the module docstring)."""
    root = Path(folder).expanduser().resolve()
    if (root / "task.yaml").is_file():
        meta = _terminal_bench_meta(root)
    elif (root / "instruction.md").is_file():
        meta = _harbor_meta(root)
    else:
        raise TaskFormatError(
            f"{root}: missing instruction.md (Harbor) or task.yaml (terminal-bench)"
        )
    _need(meta["dockerfile"], "the task's environment")
    _need(meta["script"], "the tests' run script")
    tests_dir = root / "tests"
    if not tests_dir.is_dir():
        raise TaskFormatError(f"{root}: missing tests/ (the task's test files)")
    targets = pytest_targets(meta["script"], tests_dir)
    for target in targets:
        if not (tests_dir / target.split("::")[0]).is_file():
            raise TaskFormatError(f"{meta['script']}: runs tests/{target}, which is missing")
    count = sum(count_tests(tests_dir / t.split("::")[0], t) for t in targets)
    if count == 0:
        raise TaskFormatError(f"{tests_dir}: no test functions in {targets}")
    cache = Path(cache_dir or Path.home() / ".cache" / "gyre" / "harbor").expanduser()
    overlay = build_overlay(root, ["tests"], cache / root.name)
    rel_targets = [f"tests/{t}" for t in targets]
    pytest = "python -m pytest -p no:cacheprovider -q -rA " + shlex.join(rel_targets)
    task_id = re.sub(r"[^A-Za-z0-9_.-]+", "-", root.name).strip("-.") or "task"
    return Task(
        id=task_id,
        tier="repo",
        domain=meta.get("category") or "terminal",
        title=meta.get("title") or task_id,
        spec=meta["instruction"],
        image=f"{image_prefix}{task_id.lower()}:latest",
        dockerfile=meta["dockerfile"],
        setup_commands=[_LINK_COMMAND],
        test_commands=[_LINK_COMMAND, pytest],
        hidden_tests_dir=overlay,
        hidden_test_paths=sorted(p.split("::")[0] for p in rel_targets),
        test_count=count,
        remove_before_grading=["tests"],
        max_steps=200,
        wall_clock_s=meta["agent_timeout_s"],
        grading_timeout_s=meta["test_timeout_s"],
        solution_script=meta["solution"] if meta["solution"].is_file() else None,
        source=str(root),
    )


def _need(path: Path, what: str) -> None:
    if not path.is_file():
        raise TaskFormatError(f"{path.parent}: missing {path.name} ({what})")


def _harbor_meta(root: Path) -> dict:
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise TaskFormatError(f"{root}: missing task.toml (Harbor's task metadata)")
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(f"{toml_path}: invalid TOML: {e}") from e
    sections = {k: data.get(k, {}) for k in ("metadata", "agent", "verifier", "environment")}
    for key, value in sections.items():
        if not isinstance(value, dict):
            raise TaskFormatError(f"{toml_path}: [{key}] must be a table")
    env = sections["environment"]
    dockerfile = root / "environment" / "Dockerfile"
    if env.get("docker_image") and not dockerfile.is_file():
        raise TaskFormatError(
            f"{toml_path}: [environment] docker_image = {env['docker_image']!r} and no "
            f"{dockerfile}: Gyre builds a task's image from its Dockerfile (one line "
            f"`FROM {env['docker_image']}` will do, with that image on this Docker daemon)"
        )
    return {
        "instruction": _instruction(root / "instruction.md"),
        "dockerfile": dockerfile,
        "script": root / "tests" / "test.sh",
        "solution": root / "solution" / "solve.sh",
        "category": sections["metadata"].get("category"),
        "agent_timeout_s": _seconds(sections["agent"], "timeout_sec", 1800.0, toml_path),
        "test_timeout_s": _seconds(sections["verifier"], "timeout_sec", 300.0, toml_path),
    }


def _terminal_bench_meta(root: Path) -> dict:
    path = root / "task.yaml"
    try:
        import yaml
    except ImportError as e:
        raise ImportError(
            "reading terminal-bench's task.yaml needs PyYAML: pip install 'gyre-env[tasks]'"
        ) from e
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise TaskFormatError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise TaskFormatError(f"{path}: expected a mapping")
    instruction = data.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskFormatError(f"{path}: missing instruction")
    _check_compose(root / "docker-compose.yaml", yaml)
    return {
        "instruction": instruction,
        "dockerfile": root / "Dockerfile",
        "script": root / "run-tests.sh",
        "solution": root / "solution.sh",
        "category": data.get("category"),
        "agent_timeout_s": _seconds(data, "max_agent_timeout_sec", 1800.0, path),
        "test_timeout_s": _seconds(data, "max_test_timeout_sec", 300.0, path),
    }


def _check_compose(path: Path, yaml) -> None:
    """A compose file may build the one client container; other services are not run."""
    if not path.is_file():
        return
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise TaskFormatError(f"{path}: invalid YAML: {e}") from e
    services = data.get("services") if isinstance(data, dict) else None
    if isinstance(services, dict) and len(services) > 1:
        raise TaskFormatError(
            f"{path}: services {sorted(services)}: Gyre runs one container per task, so "
            "tasks with more than one service are not supported"
        )


def _instruction(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise TaskFormatError(f"{path}: the instruction is empty")
    return text


def _seconds(table: dict, key: str, default: float, where: Path) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TaskFormatError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def pytest_targets(script: Path, tests_dir: Path | None = None) -> list[str]:
    """The test files (``tests/``-relative, with ``::`` selectors) the run script runs.

    Scripts it runs or sources from ``tests_dir`` are read too; terminal-bench's shared
    ``run-uv-pytest.sh`` (not in the task folder) runs ``$TEST_DIR/test_outputs.py``."""
    tests_dir = tests_dir or script.parent
    found: list[str] = []
    seen = {script.resolve()}
    todo = [script]
    while todo:
        text = todo.pop().read_text(encoding="utf-8")
        for line in text.splitlines():
            code = line.split("#", 1)[0]
            for m in _TEST_PATH.finditer(code):
                if "pytest" in code and m.group(1) not in found:
                    found.append(m.group(1))
            for m in _SUB_SCRIPT.finditer(code):
                sub = (tests_dir / m.group(1)).resolve()
                if sub.is_file() and sub not in seen:
                    seen.add(sub)
                    todo.append(sub)
                elif m.group(1) in _SHARED_RUNNERS and (tests_dir / "test_outputs.py").is_file():
                    if "test_outputs.py" not in found:
                        found.append("test_outputs.py")
    if not found:
        raise TaskFormatError(
            f"{script}: runs no pytest file under tests/ ($TEST_DIR/..., /tests/...); Gyre "
            "grades a task by running its test files with pytest"
        )
    return found


def count_tests(path: Path, target: str) -> int:
    """Test cases in a pytest file: ``test_*`` functions (module level and in ``Test*``
    classes), each literal ``parametrize`` list counting its cases; ``::name`` selects."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise TaskFormatError(f"{path}: not valid Python: {e}") from e
    selector = target.split("::")[1:]
    literals = {  # module-level NAME = [...] that a parametrize may name
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple))
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    total = 0
    for node, owner in _test_functions(tree):
        names = [owner, node.name] if owner else [node.name]
        if selector and names[: len(selector)] != selector[: len(names)]:
            continue
        total += _cases(node, literals)
    return total


def _test_functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name.startswith("test"):
                yield node, None
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if item.name.startswith("test"):
                        yield item, node.name


def _cases(fn, literals: dict) -> int:
    n = 1
    for dec in fn.decorator_list:
        if not (
            isinstance(dec, ast.Call)
            and isinstance(dec.func, ast.Attribute)
            and dec.func.attr == "parametrize"
            and len(dec.args) >= 2
        ):
            continue
        values = dec.args[1]
        if isinstance(values, ast.Name):
            values = literals.get(values.id)
        if isinstance(values, (ast.List, ast.Tuple)):
            n *= len(values.elts)
    return n
