"""Packaging: every package is listed in pyproject, `import gyre_env` stays light, and a
missing extra names the `pip install` that fixes it.

Import checks run in a fresh interpreter: this test process has long imported everything.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "ray", "docker", "langgraph", "fastapi", "sglang", "megatron")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _folder_of(package: str, package_dir: dict[str, str]) -> Path:
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):  # the longest mapped prefix wins
        prefix = ".".join(parts[:cut])
        if prefix in package_dir:
            return ROOT / package_dir[prefix] / Path(*parts[cut:])
    return ROOT / Path(*parts)


def _data_roots(setuptools: dict) -> list[Path]:
    """Folders shipped as package data (e.g. task gold solutions): not packages of ours."""
    roots = []
    for package, patterns in setuptools.get("package-data", {}).items():
        for pattern in patterns if package != "*" else ():
            prefix = pattern.split("*", 1)[0].rstrip("/")
            if prefix:
                roots.append(_folder_of(package, setuptools["package-dir"]) / prefix)
    return roots


def test_every_data_file_in_a_package_folder_ships_in_the_wheel():
    """A file that is not Python (a preset, a template, a task's gold) in a package's
    folder or a data folder beneath it must match a package-data glob: a non-editable
    install otherwise lacks it (the cpu-demo preset under train/presets/ once did)."""
    setuptools = _pyproject()["tool"]["setuptools"]
    data = setuptools.get("package-data", {})
    folders = {p: _folder_of(p, setuptools["package-dir"]) for p in setuptools["packages"]}
    package_folders = set(folders.values())
    unshipped = []
    for package, folder in folders.items():
        shipped = set()
        for pattern in data.get(package, []) + data.get("*", []):
            shipped |= {f for f in folder.glob(pattern) if f.is_file()}
        for f in folder.rglob("*"):
            if not f.is_file() or f.suffix in (".py", ".pyc") or "__pycache__" in f.parts:
                continue
            owner = next(d for d in (f.parent, *f.parent.parents) if d in package_folders)
            if owner == folder and f not in shipped:
                unshipped.append(str(f.relative_to(ROOT)))
    assert not unshipped, f"add to [tool.setuptools.package-data] in pyproject.toml: {unshipped}"


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = _pyproject()["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    package_dir = setuptools["package-dir"]  # {"gyre_env.envs": "envs", ...}
    data = _data_roots(setuptools)
    found = set()
    for name, folder in package_dir.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            if any(init.is_relative_to(root) for root in data):
                continue
            rel = init.parent.relative_to(base)
            if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            found.add(".".join([name, *rel.parts]))
    missing = sorted(found - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert {"gyre_env.envs", "gyre_env.agents", "gyre_env.trainers"} <= set(package_dir)
    top_level = {name.split(".")[0] for name in listed}
    assert top_level == {"gyre_env"}, f"only gyre_env may be a top-level package: {top_level}"


def test_listed_packages_exist():
    setuptools = _pyproject()["tool"]["setuptools"]
    for name in setuptools["packages"]:
        folder = _folder_of(name, setuptools["package-dir"])
        assert (folder / "__init__.py").is_file(), f"{name} is listed but {folder} has no package"


def test_import_gyre_env_is_light():
    proc = _python(
        f"""
        import sys
        import gyre_env, gyre_env.sandbox
        heavy = {HEAVY!r}
        print(sorted(m for m in sys.modules if m.split(".")[0] in heavy))
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", f"import gyre_env pulled in {proc.stdout.strip()}"


@pytest.mark.parametrize(
    ("module", "extra"),
    [("docker", "docker"), ("torch", "train"), ("fastapi", "proxy"), ("langgraph", "langgraph")],
)
def test_a_missing_extra_names_the_pip_install(module, extra):
    proc = _python(
        f"""
        import sys
        sys.modules[{module!r}] = None  # what an uninstalled package looks like to import
        from gyre_env import MissingExtraError
        from gyre_env._optional import require
        try:
            require({module!r}, "a test")
        except MissingExtraError as e:
            print(e)
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"pip install 'gyre-env[{extra}]'" in proc.stdout, proc.stdout


def test_docker_sandbox_without_the_docker_extra():
    """Asking for Docker explicitly fails with the install hint; `auto` falls back."""
    proc = _python(
        """
        import sys, logging
        sys.modules["docker"] = None
        from gyre_env import MissingExtraError
        from gyre_env.sandbox import choose_backend, make_sandbox
        try:
            make_sandbox(backend="docker")
        except MissingExtraError as e:
            print("error:", e)
        print("auto:", choose_backend("auto"))
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pip install 'gyre-env[docker]'" in proc.stdout
    assert "auto: docker" not in proc.stdout
