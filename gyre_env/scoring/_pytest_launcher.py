"""The grader's pytest entry point, run INSIDE the evaluator as ``python -I launch.py ARGS``.

``-I`` keeps the current folder, the user site (where ``pip install`` of the workspace
went) and every ``PYTHON*`` variable out of ``sys.path`` at start-up, so no
``sitecustomize.py``, ``.pth`` file or fake ``pytest`` from the workspace runs. This file
then imports the real pytest and the image's own plugins (entry points visible *now*,
before the workspace is importable), and only then appends the workspace, its ``src/``
and the user site (plus plain path lines of its ``.pth`` files, never their ``import``
lines) to the end of ``sys.path``; setuptools' editable import hooks are replaced by a
finder of its own, at the end of ``sys.meta_path``, that reads their mappings as data.
pytest runs with the grader's config file (``-c``), rootdir and confcutdir pinned to the
workspace, no cache, plugin autoload off (set by the grader's environment) and xunit1
JUnit reports (they carry each case's file).
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


def _editable_mapping() -> dict:
    userbase = os.environ.get("PYTHONUSERBASE")
    v = sys.version_info
    site = os.path.join(userbase or "/nonexistent", "lib", f"python{v[0]}.{v[1]}", "site-packages")
    mapping: dict = {}
    if os.path.isdir(site):
        for name in sorted(os.listdir(site)):
            if name.startswith("__editable___") and name.endswith("_finder.py"):
                mapping.update(_finder_mapping(os.path.join(site, name)))
    return mapping


def _finder_mapping(finder: str) -> dict:
    """``{package: folder}`` of a setuptools editable finder, read from its ``MAPPING``
    literal with ``ast``: the finder's code (written by the workspace's build) never runs."""
    import ast

    try:
        with open(finder, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if getattr(target, "id", None) == "MAPPING" and node.value is not None:
            try:
                mapping = ast.literal_eval(node.value)
            except ValueError:
                return {}
            if isinstance(mapping, dict):
                return {str(k): str(v) for k, v in mapping.items()}
    return {}


class _MappedFinder:
    """Imports the top-level names of editable installs from their mapped folders. It sits
    at the END of ``sys.meta_path``: it cannot shadow the stdlib, pytest or its plugins."""

    def __init__(self, mapping: dict):
        self.mapping = mapping

    def find_spec(self, fullname, path=None, target=None):
        from importlib.util import spec_from_file_location

        where = self.mapping.get(fullname)
        if where is None or "." in fullname:
            return None
        init = os.path.join(where, "__init__.py")
        if os.path.isfile(init):
            return spec_from_file_location(fullname, init, submodule_search_locations=[where])
        if os.path.isfile(where) and where.endswith(".py"):
            return spec_from_file_location(fullname, where)
        return None


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
    mapping = _editable_mapping()
    if mapping:
        sys.meta_path.append(_MappedFinder(mapping))
    args = list(sys.argv[1:])
    args += ["-c", os.environ["GYRE_GRADER_INI"], "--rootdir", root, "--confcutdir", root]
    args += ["-p", "no:cacheprovider", "-o", "junit_family=xunit1"]
    for module in plugins:
        args += ["-p", module]
    return int(pytest.main(args))


if __name__ == "__main__":
    sys.exit(main())
