"""A hostile agent looks for the answers (hidden tests, gold) from inside its sandbox.

The attacked install is the one ``pip install gyre-env`` makes: a venv holding gyre-env
from its wheel, so every built-in task's ``hidden_tests/`` and ``gold/`` lie in its
site-packages, which the bubblewrap and host-usr sandboxes bind read-only. The agent
(``hostile_agent.py``, run by that venv's Python) plays through ``gym.make`` and
``env.step``: it searches the filesystem, reads the known host paths (site-packages, the
source checkout, Gyre's cache with generated nano tasks), imports ``gyre_env`` to find or
regenerate the data, reads ``/proc`` for host processes and their environment, and submits
a solution that, in the evaluator, loads the gold it finds. Every attack must fail on
``docker`` (the task's own image), ``docker-hostusr`` (a host-usr image of that venv) and
``bwrap``; each test also checks that the attack really ran (its end marker is in the
output, and a real gold solution still scores 1.0 there).

``local`` isolates nothing, and these tests say so: there the same attacks find the
answers (the control that shows the attacks are real), and the local sandbox warns that it
isolates nothing at every start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scoring"))
from calc_task import write_tree  # noqa: E402

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TASK = "micro-roman-numerals"
BUILTIN = ROOT / "gyre_env" / "tasks" / "builtin" / TASK
HIDDEN = "hidden_tests/tests/test_roman.py"
GOLD = "gold/roman.py"
DONE = "ATTACK-RAN"
CANARY = f"gyre-canary-{uuid.uuid4().hex}"
NANO_MARKS = ("def test_returns_", "def test_value_")
FAST = {"env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}}

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("docker-hostusr", marks=pytest.mark.docker),
    pytest.param("bwrap", marks=pytest.mark.bwrap),
]


def _secrets() -> list[str]:
    """Lines of the task's hidden tests and gold that its spec does not give away."""
    spec = (BUILTIN / "spec.md").read_text()
    lines = [ln.strip() for f in (HIDDEN, GOLD) for ln in (BUILTIN / f).read_text().splitlines()]
    marks = [ln for ln in lines if ln.startswith(("def test_", "for value, symbol"))]
    assert len(marks) >= 3 and not any(m in spec for m in marks), marks
    return marks


def _leaks(text: str, marks) -> list[str]:
    return [m for m in marks if m in text]


@pytest.fixture(scope="module")
def install():
    """A venv with gyre-env installed from a wheel built here, offline, and a cache folder
    inside the venv's prefix (as if ``GYRE_CACHE`` pointed under a bound folder). The
    folder is world-readable: the host-usr evaluator reads the venv as an unprivileged user."""
    root = Path(tempfile.mkdtemp(prefix="gyre-answers-"))
    os.chmod(root, 0o755)
    try:
        src = root / "src"
        for name in ("gyre_env", "envs", "agents", "trainers"):
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, src / name)
        # --without-pip: the venv's pip and setuptools are the base Python's (a venv's own
        # setuptools may predate building wheels without the `wheel` package).
        venv = root / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
            check=True,
        )
        python = venv / "bin" / "python"
        pip = [python, "-m", "pip", "-q", "--disable-pip-version-check"]
        subprocess.run(
            [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", root / "dist", src],
            check=True,
            timeout=600,
        )
        [wheel] = (root / "dist").glob("gyre_env-*.whl")
        subprocess.run([*pip, "install", "--no-deps", "--no-index", wheel], check=True, timeout=600)
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        data = Path(site) / "gyre_env" / "tasks" / "builtin" / TASK
        assert (data / HIDDEN).is_file() and (data / GOLD).is_file(), "the wheel ships the tasks"
        yield {"python": str(python), "data": str(data), "cache": str(venv / "share" / "gyre")}
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def host_usr_image(install):
    """A host-usr image built by the installed venv's Python (so it binds that venv)."""
    tag = f"gyre-test-answers-{os.getpid()}:latest"
    build = (
        "from gyre_env.sandbox.images import build_base_image; "
        f"build_base_image({tag!r}, method='host-usr', force=True, progress=lambda *a: None)"
    )
    subprocess.run([install["python"], "-c", build], check=True, timeout=300)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def _attacks(install) -> dict[str, str]:
    data, cache, repo = install["data"], install["cache"], BUILTIN
    scan = (
        "import glob, sys\n"
        "for p in sys.path:\n"
        f"    for f in glob.glob(p + '/*/tasks/builtin/{TASK}/*/*.py') + "
        f"glob.glob(p + '/*/tasks/builtin/{TASK}/*/*/*.py'):\n"
        "        print(open(f).read())\n"
    )
    registry = (
        "from gyre_env.tasks import get_task\n"
        f"t = get_task({TASK!r})\n"
        "print(open(t.hidden_tests_dir / 'tests/test_roman.py').read())\n"
    )
    nano = (
        "from gyre_env.tasks.nano import all_variants, render\n"
        "print('\\n'.join(render(all_variants()[0]).values()))\n"
    )
    attacks = {
        "find": "find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o \\( "
        "-name hidden_tests -o -name test_roman.py -o -path '*/builtin/micro-*' \\) -print",
        "cat_site_packages": f"cat {data}/{HIDDEN} {data}/{GOLD}",
        "cat_checkout": f"cat {repo}/{HIDDEN} {repo}/{GOLD}",
        "python_sys_path": f"python3 -c {_q(scan)}",
        "python_registry": f"python3 -c {_q(registry)}",
        "nano_generator": f"python3 -c {_q(nano)}",
        "nano_cache": f"cat {cache}/tasks/nano/*/hidden_tests/* {cache}/tasks/nano/*/gold/*",
        "proc_environ": "cat /proc/[0-9]*/environ | tr '\\0' '\\n'; env",
        "proc_host": "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; "
        "readlink $p/cwd $p/root; done",
        "tmp": "find /tmp /var/tmp -name 'gyre-*' -o -name 'test_roman.py' -o -name 'pytest-of-*'",
    }
    return {name: f"{cmd} 2>&1; echo {DONE}" for name, cmd in attacks.items()}


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _thief(install) -> str:
    """A solution that, wherever it is imported (the evaluator), loads the gold it finds."""
    paths = [f"{install['data']}/{GOLD}", f"{BUILTIN}/{GOLD}"]
    return (
        "import glob, sys\n"
        f"_found = {paths!r}\n"
        "for _p in sys.path:\n"
        f"    _found += glob.glob(_p + '/*/tasks/builtin/{TASK}/gold/roman.py')\n"
        "for _f in _found:\n"
        "    try:\n"
        "        exec(open(_f).read())\n"
        "        break\n"
        "    except OSError:\n"
        "        pass\n"
    )


def _play(install, backend: str, image: str | None, tmp_path: Path, nano: bool = False) -> dict:
    """Run the hostile agent under the installed venv; its result (see hostile_agent.py)."""
    sandbox_backend = "docker" if backend.startswith("docker") else backend
    common = {
        "sandbox_backend": sandbox_backend,
        "reward_mode": "sparse",
        "sandbox": FAST,
        "grading": {"pytest_plugins": [], "sandbox": FAST},
    }
    if nano:
        make = {
            "env_id": "Gyre/NL2Repo-nano-v0",
            "suite_kwargs": {"split": "train", "count": 1, "seed": 0},
            "tools": None,
        }
        attacks = {k: v for k, v in _attacks(install).items() if k.startswith("nano")}
        submissions = {}
    else:
        task_dir = tmp_path / "task"
        shutil.copytree(BUILTIN, task_dir)
        if image is not None:  # the same task on another image (the data read is the wheel's)
            toml = task_dir / "task.toml"
            toml.write_text(toml.read_text() + f'image = "{image}"\n')
        make = {"env_id": "Gyre/NL2Repo-v0", "task_path": str(task_dir)}
        attacks = _attacks(install)
        submissions = {
            "thief": {"roman.py": _thief(install)},
            "gold": {"roman.py": (BUILTIN / GOLD).read_text()},
        }
    plan = {"make": {**make, **common}, "attacks": attacks, "submissions": submissions}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "GYRE_CACHE": install["cache"], "GYRE_TEST_CANARY": CANARY}
    env.pop("PYTHONPATH", None)
    run = subprocess.run(
        [
            install["python"],
            Path(__file__).with_name("hostile_agent.py"),
            tmp_path / "plan.json",
            tmp_path / "result.json",
        ],  # fmt: skip
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    result["stderr"] = run.stderr
    assert result["gyre_env"].startswith(str(Path(install["python"]).parent.parent)), result
    return result


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_path_to_the_hidden_tests_or_gold(backend, install, tmp_path, request):
    image = request.getfixturevalue("host_usr_image") if backend == "docker-hostusr" else None
    result = _play(install, backend, image, tmp_path)
    secrets = _secrets()
    for name, obs in result["attacks"].items():
        assert DONE in obs, f"attack {name} did not run to its end: {obs[-2000:]}"
        assert not _leaks(obs, secrets), f"{backend}: attack {name} read the answers:\n{obs}"
        assert CANARY not in obs, f"{backend}: attack {name} read the host's environment"
    for word in ("hidden_tests", "test_roman.py", "builtin/micro-"):
        assert word not in result["attacks"]["find"], result["attacks"]["find"]
    assert "hostile_agent.py" not in result["attacks"]["proc_host"], "a host process is visible"
    assert "gyre-bwrap-" not in result["attacks"]["tmp"], result["attacks"]["tmp"]
    scores = result["scores"]
    assert scores["gold"]["score"] == 1.0, f"grading does not work here: {scores['gold']}"
    assert scores["thief"]["score"] == 0.0, f"the evaluator handed out the gold: {scores}"


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0] != "docker-hostusr"])
def test_no_path_to_generated_nano_tasks(backend, install, tmp_path):
    """The nano cache (here inside the bound venv) and the nano generator itself. (Nano
    tasks name the base image, so Docker runs them on ``gyre-base``.)"""
    result = _play(install, backend, None, tmp_path, nano=True)
    cache = Path(install["cache"]) / "tasks" / "nano"
    assert any(cache.glob("*/hidden_tests")), "the env did not generate its task in the cache"
    for name, obs in result["attacks"].items():
        assert DONE in obs, f"attack {name} did not run to its end: {obs[-2000:]}"
        assert not _leaks(obs, NANO_MARKS), f"{backend}: attack {name} read the answers:\n{obs}"


def test_local_isolates_nothing_and_says_so(install, tmp_path):
    """The control: on ``local`` the same attacks reach the answers, which is why it logs
    that it isolates nothing at every start (and is for development only)."""
    result = _play(install, "local", None, tmp_path)
    assert "LocalSandbox isolates NOTHING" in result["stderr"]
    secrets, attacks = _secrets(), result["attacks"]
    # (python3 there is the host's first on PATH, not the venv's: its sys.path differs)
    for name in ("cat_site_packages", "cat_checkout", "python_registry"):
        assert _leaks(attacks[name], secrets), f"control {name} found nothing: {attacks[name]}"
    assert CANARY in attacks["proc_environ"]
    assert result["scores"]["thief"]["score"] == 1.0, result["scores"]
    assert result["scores"]["gold"]["score"] == 1.0, result["scores"]


# -- where task data is, computed from this host (no sandbox needed) ----------------------


def _tree(root: Path, *files: str) -> None:
    write_tree(root, dict.fromkeys(files, "x"))


def test_task_data_folders_are_found_where_they_are(tmp_path, monkeypatch):
    """Site folders of any Python version under a root, ``sys.path`` entries and the cache;
    nothing outside the roots."""
    from gyre_env.sandbox import hostusr

    prefix, extra, cache = tmp_path / "prefix", tmp_path / "prefix/extra", tmp_path / "prefix/c"
    _tree(prefix, "lib/python3.9/site-packages/gyre_env/tasks/builtin/t/gold/a.py")
    _tree(prefix, "local/lib/python3.12/dist-packages/gyre_env/__init__.py")
    _tree(extra, "gyre_env/tasks/nano.py")
    _tree(cache, "tasks/nano/t/hidden_tests/test_a.py")
    monkeypatch.setattr(sys, "path", [*sys.path, str(extra)])
    monkeypatch.setenv("GYRE_CACHE", str(cache))
    assert hostusr.task_data_folders([str(prefix)]) == sorted(
        [
            str(prefix / "lib/python3.9/site-packages/gyre_env"),
            str(prefix / "local/lib/python3.12/dist-packages/gyre_env"),
            str(extra / "gyre_env"),
            str(cache),
        ]
    )
    assert hostusr.masks([(str(prefix), "/opt/py")]) == [  # where the bind puts them
        "/opt/py/c",
        "/opt/py/extra/gyre_env",
        "/opt/py/lib/python3.9/site-packages/gyre_env",
        "/opt/py/local/lib/python3.12/dist-packages/gyre_env",
    ]
    assert hostusr.task_data_folders([str(tmp_path / "elsewhere")]) == []


def test_a_checkout_under_a_root_is_hidden_whole_unless_the_root_is_inside_it(
    tmp_path, monkeypatch
):
    """An editable install's checkout holds the tasks in its .git and tests too; a project's
    own .venv inside the checkout is bound without the checkout around it."""
    from gyre_env.sandbox import hostusr

    checkout = tmp_path / "src" / "gyre-env"
    _tree(checkout, "pyproject.toml", "gyre_env/__init__.py", ".venv/bin/python")
    monkeypatch.setattr(hostusr, "_package_dir", lambda: checkout / "gyre_env")
    monkeypatch.setenv("GYRE_CACHE", str(tmp_path / "no-cache"))
    assert hostusr.task_data_folders([str(tmp_path)]) == [str(checkout)]
    assert hostusr.task_data_folders([str(checkout / ".venv")]) == []


def test_a_root_inside_task_data_is_refused_by_name(tmp_path, monkeypatch):
    from gyre_env.sandbox import hostusr

    _tree(tmp_path, "cache/venv/bin/python")
    monkeypatch.setenv("GYRE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"refusing to bind .*/cache/venv into a sandbox"):
        hostusr.task_data_folders([str(tmp_path / "cache" / "venv")])


@pytest.mark.docker
def test_images_show_prints_the_task_data_masks_with_the_binds(tmp_path, monkeypatch, capsys):
    """``gyre images show`` prints the flags a sandbox really gets: each read-only bind,
    then an empty read-only tmpfs over every folder of task data under it; and refuses by
    name a bind that cannot be made without showing task data."""
    import io
    import tarfile

    from gyre_env.cli import main
    from gyre_env.sandbox import images
    from gyre_env.sandbox.docker import docker_client

    prefix = tmp_path / "prefix"
    _tree(prefix, "lib/python3.9/site-packages/gyre_env/tasks/builtin/t/gold/a.py")
    monkeypatch.setenv("GYRE_CACHE", str(prefix / "cache"))
    (prefix / "cache").mkdir()
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    tag = f"gyre-test-show-{uuid.uuid4().hex[:8]}:x"
    mounts = json.dumps([[str(prefix), "/opt/py"]])
    client = docker_client()
    client.api.import_image(
        src=empty.getvalue(),
        repository=tag.split(":")[0],
        tag="x",
        changes=[f"LABEL {images.LABEL_HOST_MOUNTS}={json.dumps(mounts)}"],
    )
    try:
        assert main(["images", "show", "--tag", tag]) == 0
        out = capsys.readouterr().out
        flags = out.split("docker run flags: ", 1)[1].split()
        assert flags == [
            "-v",
            f"{prefix}:/opt/py:ro",
            "--tmpfs",
            "/opt/py/cache:ro,size=4k",
            "--tmpfs",
            "/opt/py/lib/python3.9/site-packages/gyre_env:ro,size=4k",
        ], out
        monkeypatch.setenv("GYRE_CACHE", str(prefix))  # the bound prefix is now task data
        assert main(["images", "show", "--tag", tag]) == 1
        err = capsys.readouterr().err
        assert f"refusing to bind {prefix} into a sandbox" in err, err
    finally:
        client.images.remove(tag, force=True)
