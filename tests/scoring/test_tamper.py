"""Each trick a workspace can plant to change the hidden suite's result, and the grader
ignoring it. Every test first shows the trick WORKING against a naive runner
(``calc_task.naive_score``: the same commands with plain pytest), so none of them can pass
vacuously; then the grader must still give the honest score (1 of 4 tests: 0.25).

Tricks that act through ``pip install`` (installed modules, .pth files, entry points)
use a variant of the task whose first command installs the workspace. Every trick runs
on both isolating backends, Docker and bubblewrap (whose evaluator drops privileges like
Docker's); tricks that need that privilege drop (writing into the image's own
site-packages, rewriting the hidden tests, a daemon forging the report) are not tried on
the local backend, where they would write into this machine's Python. Forgeries from
inside the pytest process (the tested code itself) are in ``tests/security/test_forge.py``.
"""

from __future__ import annotations

import pytest
from calc_task import PYPROJECT, naive_score, write_tree

from gyre_env.scoring import GradingConfig, grade_workspace

HONEST = 0.25

# A pytest plugin that turns every test report into a pass.
EVIL_PLUGIN = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""

# A fake pytest: writes a report where all four hidden tests pass.
FAKE_PYTEST = """
import sys
cases = "".join(
    f'<testcase classname="tests.test_calc" name="test_{n}" file="tests/test_calc.py"/>'
    for n in ("add", "sub", "mul", "div"))
for arg in sys.argv:
    if arg.startswith("--junitxml="):
        with open(arg.split("=", 1)[1], "w") as fh:
            fh.write(f'<testsuites><testsuite name="pytest" tests="4">{cases}</testsuite></testsuites>')
print("4 passed")
sys.exit(0)
"""

SETUP_PY_HEAD = "import os, site\nfrom setuptools import setup\n"
ADDOPTS = 'os.environ["PYTEST_ADDOPTS"] = "-p evil_plugin"\n'

TRICKS = {
    "conftest_root": {"conftest.py": EVIL_PLUGIN},
    "conftest_in_tests": {"tests/conftest.py": EVIL_PLUGIN},
    "pytest_ini_addopts": {
        "pytest.ini": "[pytest]\naddopts = -p evil_plugin\n",
        "evil_plugin.py": EVIL_PLUGIN,
    },
    "pyproject_addopts": {
        "pyproject.toml": PYPROJECT + '\n[tool.pytest.ini_options]\naddopts = "-p evil_plugin"\n',
        "evil_plugin.py": EVIL_PLUGIN,
    },
    "fake_pytest_module": {"pytest.py": FAKE_PYTEST},
    "fake_pytest_package": {"pytest/__init__.py": "", "pytest/__main__.py": FAKE_PYTEST},
    # Installed by `pip install -e .` as a top-level module of the user site.
    "sitecustomize": {
        "pyproject.toml": PYPROJECT.replace('["calc"]', '["calc", "sitecustomize", "evil_plugin"]'),
        "sitecustomize.py": "import os\n" + ADDOPTS,
        "evil_plugin.py": EVIL_PLUGIN,
    },
    # setup.py drops a .pth with an import line into the user site while installing.
    "pth_file": {
        "pyproject.toml": PYPROJECT.replace('["calc"]', '["calc", "evil_plugin"]'),
        "setup.py": SETUP_PY_HEAD
        + "os.makedirs(site.getusersitepackages(), exist_ok=True)\n"
        + "open(os.path.join(site.getusersitepackages(), 'zz_evil.pth'), 'w').write("
        + repr("import os; " + ADDOPTS)
        + ")\nsetup()\n",
        "evil_plugin.py": EVIL_PLUGIN,
    },
    "plugin_entry_point": {
        "pyproject.toml": PYPROJECT.replace('["calc"]', '["calc", "evil_plugin"]')
        + '\n[project.entry-points.pytest11]\nevil = "evil_plugin"\n',
        "evil_plugin.py": EVIL_PLUGIN,
    },
}


INSTALLED = {"sitecustomize", "pth_file", "plugin_entry_point"}
_NAIVE: dict[str, float] = {}
"""Each trick's naive score: the same files every time, so one naive run per trick (it
takes 5-10 s for the installed ones) serves each backend's test."""


def plugins_for(backend: str, trick: str | None = None) -> list | None:
    """Docker's image has no plugins, so its autoload (the default) costs nothing. Local and
    bubblewrap run this host's Python, whose many plugins take 4 s to load per run, and load
    none (as the cpu-demo preset does), except for the entry-point trick on bubblewrap: that
    trick is aimed at autoload, so the grader must resist it with autoload on."""
    if backend == "docker" or (backend == "bwrap" and trick == "plugin_entry_point"):
        return None
    return []


def _check_trick(trick, backend, calc_task, calc_pip_task, ws, tmp_path):
    task = calc_pip_task if trick in INSTALLED else calc_task
    write_tree(ws, TRICKS[trick])
    if trick not in _NAIVE:
        _NAIVE[trick] = naive_score(task, ws, tmp_path, autoload=trick == "plugin_entry_point")
    assert _NAIVE[trick] == 1.0, "the trick must work against a naive runner"
    config = GradingConfig(backend=backend, pytest_plugins=plugins_for(backend, trick))
    result = grade_workspace(task, ws, config)
    assert result.status == "ok", result.reason
    assert result.score == HONEST, (trick, result.summary())
    assert result.passed == 1 and result.collected == 4


ISOLATING = [
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("bwrap", marks=pytest.mark.bwrap),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ISOLATING)
@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_trick_cannot_change_the_hidden_result(
    trick, backend, calc_task, calc_pip_task, partial_ws, tmp_path
):
    """The real evaluators: a container from the task's image, or a bubblewrap sandbox,
    privileges dropped."""
    _check_trick(trick, backend, calc_task, calc_pip_task, partial_ws, tmp_path)


@pytest.mark.parametrize("trick", ["conftest_root", "fake_pytest_module"])
def test_trick_fails_on_the_local_backend_too(
    trick, calc_task, calc_pip_task, partial_ws, tmp_path
):
    """Without Docker the launcher's defences alone still hold (no privilege drop here)."""
    _check_trick(trick, "local", calc_task, calc_pip_task, partial_ws, tmp_path)


def test_extra_passing_tests_do_not_count(calc_task, partial_ws, tmp_path):
    """`pytest tests` collects every test file; only the hidden file's cases count."""
    extra = "".join(f"def test_free_{i}():\n    pass\n" for i in range(50))
    write_tree(partial_ws, {"tests/test_extra.py": extra, "tests/test_calc_more.py": extra})
    assert naive_score(calc_task, partial_ws, tmp_path) == 1.0  # counting every case
    result = grade_workspace(
        calc_task, partial_ws, GradingConfig(backend="local", pytest_plugins=[])
    )
    assert (result.score, result.collected) == (HONEST, 4)


@pytest.mark.parametrize("backend", ISOLATING)
def test_planted_copy_of_hidden_file_is_overwritten(backend, calc_task, partial_ws):
    write_tree(partial_ws, {"tests/test_calc.py": "def test_add():\n    pass\n" * 1})
    config = GradingConfig(backend=backend, pytest_plugins=plugins_for(backend))
    result = grade_workspace(calc_task, partial_ws, config)
    assert (result.score, result.collected) == (HONEST, 4)


PRIVILEGED_TRICKS = {
    # setup.py (run by `pip install` during grading) writes into the image's site-packages.
    "system_site_pth": {
        "setup.py": SETUP_PY_HEAD
        + "import sysconfig\n"
        + "try:\n    open(os.path.join(sysconfig.get_paths()['purelib'], 'zz_evil.pth'), 'w')"
        + ".write("
        + repr("import os; " + ADDOPTS)
        + ")\nexcept OSError:\n    pass\nsetup()\n",
        "pyproject.toml": PYPROJECT.replace('["calc"]', '["calc", "evil_plugin"]'),
        "evil_plugin.py": EVIL_PLUGIN,
    },
    # setup.py rewrites the hidden test file into four trivial passes.
    "rewrite_hidden_tests": {
        "setup.py": SETUP_PY_HEAD
        + "body = ''.join(f'def test_{n}():\\n    pass\\n' for n in ('add','sub','mul','div'))\n"
        + "try:\n    os.remove('tests/test_calc.py')\nexcept OSError:\n    pass\n"
        + "try:\n    open('tests/test_calc.py', 'w').write(body)\nexcept OSError:\n    pass\n"
        + "setup()\n",
    },
    # setup.py leaves a daemon that overwrites the report once pytest has written it.
    "daemon_forges_report": {
        "setup.py": SETUP_PY_HEAD
        + "import subprocess, sys\n"
        + "subprocess.Popen([sys.executable, '-c', "
        + repr(
            "import glob, os, time\n"
            'cases = \'\'.join(\'<testcase classname="tests.test_calc" name="test_%s" '
            "file=\"tests/test_calc.py\"/>' % n for n in ('add','sub','mul','div'))\n"
            "for _ in range(600):\n"
            "    time.sleep(0.1)\n"
            "    for p in glob.glob('/workspace/grader/out/*.xml'):\n"
            "        open(p, 'w').write('<testsuites><testsuite>' + cases + '</testsuite></testsuites>')\n"
        )
        + "], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
        + " stderr=subprocess.DEVNULL)\nsetup()\n",
    },
}


@pytest.mark.parametrize("backend", ISOLATING)
@pytest.mark.parametrize("trick", sorted(PRIVILEGED_TRICKS))
def test_trick_needing_privileges_cannot_change_the_hidden_result(
    trick, backend, calc_pip_task, partial_ws
):
    write_tree(partial_ws, PRIVILEGED_TRICKS[trick])
    config = GradingConfig(backend=backend, pytest_plugins=plugins_for(backend))
    result = grade_workspace(calc_pip_task, partial_ws, config)
    assert result.privilege_drop, f"the {backend} evaluator must drop privileges"
    assert result.status == "ok", result.reason
    assert (result.score, result.collected) == (HONEST, 4), result.summary()
