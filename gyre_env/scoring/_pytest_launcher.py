"""The grader's pytest entry point, run INSIDE the evaluator as ``python -I launch.py ARGS``.

``-I`` keeps the current folder, the user site (where ``pip install`` of the workspace
went) and every ``PYTHON*`` variable out of ``sys.path`` at start-up, so no
``sitecustomize.py``, ``.pth`` file or fake ``pytest`` from the workspace runs. This file
then imports the real pytest and the image's own plugins (entry points visible *now*,
before the workspace is importable), and only then appends the workspace, its ``src/``
and the user site (plus plain path lines of its ``.pth`` files, never their ``import``
lines) to the end of ``sys.path``. pytest runs with the grader's config file (``-c``),
rootdir and confcutdir pinned to the workspace, no cache, plugin autoload off (set by the
grader's environment) and xunit1 JUnit reports (they carry each case's file).
"""

from __future__ import annotations

import os
import sys


def _image_plugins() -> list[str]:
    """The plugin modules to load: the grader's list, else the image's entry points."""
    import json

    if os.environ.get("GYRE_GRADER_PLUGINS") is not None:
        names = json.loads(os.environ["GYRE_GRADER_PLUGINS"])
        for module in names:
            __import__(module)  # a missing plugin the grader asked for is a grader error
        return names
    from importlib import metadata

    try:
        eps = metadata.entry_points(group="pytest11")
    except TypeError:  # Python < 3.10
        eps = metadata.entry_points().get("pytest11", [])
    names = []
    for ep in eps:
        module = ep.value.split(":")[0].strip()
        try:
            __import__(module)
        except Exception:
            continue
        names.append(module)
    return names


def _workspace_paths(root: str) -> list[str]:
    paths = [root]
    if os.path.isdir(os.path.join(root, "src")):
        paths.append(os.path.join(root, "src"))
    userbase = os.environ.get("PYTHONUSERBASE")
    if userbase:
        site = os.path.join(
            userbase, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages"
        )
        if os.path.isdir(site):
            paths.append(site)
            for name in sorted(os.listdir(site)):
                if name.endswith(".pth"):
                    paths.extend(_pth_paths(os.path.join(site, name), site))
    return paths


def _pth_paths(pth: str, site: str) -> list[str]:
    out = []
    try:
        with open(pth, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                path = os.path.normpath(os.path.join(site, line))
                if os.path.isdir(path):
                    out.append(path)
    except OSError:
        pass
    return out


def main() -> int:
    import pytest

    plugins = _image_plugins()
    root = os.getcwd()
    for path in _workspace_paths(root):
        if path not in sys.path:
            sys.path.append(path)
    args = list(sys.argv[1:])
    args += ["-c", os.environ["GYRE_GRADER_INI"], "--rootdir", root, "--confcutdir", root]
    args += ["-p", "no:cacheprovider", "-o", "junit_family=xunit1"]
    for module in plugins:
        args += ["-p", module]
    return int(pytest.main(args))


if __name__ == "__main__":
    sys.exit(main())
