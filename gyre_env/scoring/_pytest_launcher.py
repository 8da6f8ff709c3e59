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

The verdict does not come from the JUnit file, nor from this process. When the grader
hands it a pipe (``GYRE_GRADER_VERDICT_FD``, taken out of the environment before pytest
imports any workspace code), the ``--junitxml`` option is taken out of the arguments (no
report file is written, nothing names one) and ``_Relay`` streams pytest's own events to
that pipe as they happen: a ``start`` record, every phase report (setup, call, teardown)
and every failed or skipped collection, raw (outcome, message, node id), and a ``finish``
record with their count. This process holds no key and decides nothing: the evaluator's
root process reads the pipe while the command runs and authenticates what it received for
the host, and the host (``gyre_env.scoring.verdict``) turns the events into cases and
checks them. ``verdict`` says what that does and does not guarantee.

The relay also watches for the generic ways to interfere from inside (a tripwire, not a
guarantee): plugins registered at run time (found through ``gc`` and
``config.pluginmanager``); pytest's and pluggy's functions, classes and methods replaced,
and this file's own, checked against a snapshot taken before collection at each
collection report and after each test's teardown (so a test's own ``monkeypatch`` is
undone by then); the few functions the relay writes with (``os.write``, JSON quoting) are
bound before collection. Any of those is answered with a ``tampered`` record and no
``finish``. (A hidden suite that patches pytest itself and leaves it so would read as
tampering.) Code in this process can still write records itself or patch for one call:
see ``verdict``.
"""

from __future__ import annotations

import json
import os
import sys
import types

# Bound before any workspace code runs: a later monkeypatch of these names does not reach
# the verdict's own writes (and is caught by the fingerprint check besides).
_write = os.write
_close = os.close
try:
    from json.encoder import c_encode_basestring_ascii as _quote
except ImportError:  # a Python built without the C accelerator
    from json.encoder import py_encode_basestring_ascii as _quote
if _quote is None:
    from json.encoder import py_encode_basestring_ascii as _quote

JUNIT_OPTIONS = ("--junitxml", "--junit-xml")
WATCHED = ("pytest", "_pytest", "pluggy")
"""Packages whose functions and classes the verdict checks for replacement."""


def _image_plugins() -> list[str]:
    """The plugin modules to load: the grader's list, else the image's entry points."""
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


def _strip_junit(args: list[str]) -> tuple[list[str], bool]:
    """``args`` without any ``--junitxml`` option; True if there was one."""
    out, found, skip = [], False, False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in JUNIT_OPTIONS:
            found = True
            skip = "=" not in arg
            continue
        out.append(arg)
    return out, found


def _serialize(record: dict) -> str:
    """A flat dict of str/int/bool/None as canonical JSON, with functions bound at start."""
    parts = []
    for key in sorted(record):
        value = record[key]
        if value is None or isinstance(value, bool):
            text = {None: "null", True: "true", False: "false"}[value]
        elif isinstance(value, int):
            text = int.__repr__(value)
        else:
            text = _quote(str.__str__(value))
        parts.append(_quote(key) + ":" + text)
    return "{" + ",".join(parts) + "}"


def _watch(module: types.ModuleType) -> list[tuple]:
    """(owner, name, object) for the functions and classes a module defines, and the
    methods and properties of those classes: what turns a test into a report."""
    out = []
    modname = module.__name__
    for name, value in list(vars(module).items()):
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            out.append((module, name, value))
        elif isinstance(value, type) and value.__module__ == modname:
            out.append((module, name, value))
            out.append((value, "__dict__ keys", frozenset(vars(value))))
            for attr, member in list(vars(value).items()):
                if isinstance(member, (types.FunctionType, classmethod, staticmethod, property)):
                    out.append((value, attr, member))
    return out


def _code_of(obj):
    inner = getattr(obj, "__func__", None) or getattr(obj, "fget", None) or obj
    return getattr(inner, "__code__", None)


class _Fingerprint:
    """Identities of watched functions, classes, methods and code objects, taken before
    collection imports any workspace code, and compared at every report."""

    def __init__(self, extra: list[types.ModuleType]):
        self.modules = {
            name: mod
            for name, mod in list(sys.modules.items())
            if mod is not None and name.split(".")[0] in WATCHED
        }
        self.entries = []
        for mod in [*self.modules.values(), *extra]:
            for owner, name, value in _watch(mod):
                self.entries.append((owner, name, value, _code_of(value)))

    def changed(self) -> str | None:
        for name, mod in self.modules.items():
            if sys.modules.get(name) is not mod:
                return f"module {name} was replaced"
        for owner, name, value, code in self.entries:
            if name == "__dict__ keys":
                # Plain values pytest caches on its classes are fine; a new method or
                # property (say an ``outcome`` that always says "passed") is not.
                added = [k for k, v in list(vars(owner).items()) if k not in value]
                if any(hasattr(type(vars(owner)[k]), "__get__") for k in added):
                    return f"methods were added to {owner.__qualname__}: {sorted(added)}"
                continue
            current = vars(owner).get(name)
            if current is not value:
                where = getattr(owner, "__qualname__", getattr(owner, "__name__", "?"))
                return f"{where}.{name} was replaced"
            if code is not None and _code_of(current) is not code:
                return f"the code of {name} was replaced"
        return None


def _longrepr(report, limit: int = 4000) -> str:
    try:
        text = str(report.longrepr) if report.longrepr is not None else ""
    except Exception as e:  # a repr that raises is the test's problem, not the verdict's
        text = f"<unprintable longrepr: {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2 :]


class _Relay:
    """The pytest plugin that streams pytest's events to the grader (see the module
    docstring): raw reports, no key, no verdict."""

    def __init__(self, fd: int, conftests: list[str]):
        self._fd = fd
        self._conftests = {os.path.realpath(p) for p in conftests}
        self._seq = 0
        self._sent = 0
        self._dead = False
        self._plugins: list | None = None
        self._fingerprint: _Fingerprint | None = None
        self._config = None

    def pytest_configure(self, config) -> None:
        self._config = config

    def _emit(self, kind: str, **fields) -> None:
        if self._dead:
            return
        line = (_serialize({**fields, "i": self._seq, "k": kind}) + "\n").encode()
        self._seq += 1
        while line:
            try:
                n = _write(self._fd, line)
            except OSError:
                self._dead = True
                return
            line = line[n:]

    def _tampered(self, why: str) -> None:
        self._emit("tampered", why=why)
        self._dead = True

    def _check(self, config) -> bool:
        """Whether the runner is as it was before collection; if not, say so and stop."""
        if self._dead or self._fingerprint is None:
            return not self._dead
        why = self._fingerprint.changed()
        if why is None:
            for plugin in config.pluginmanager.get_plugins():
                if not any(plugin is p for p in self._plugins) and not self._allowed(plugin):
                    why = f"a plugin was registered during the run: {plugin!r}"[:500]
                    break
        if why is not None:
            self._tampered(why)
        return why is None

    def _allowed(self, plugin) -> bool:
        """A conftest.py of the hidden tests, or a module of the image's own Python."""
        path = getattr(plugin, "__file__", None)
        if not isinstance(plugin, types.ModuleType) or not path:
            return False
        path = os.path.realpath(path)
        if path in self._conftests:
            return True
        prefixes = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix)}
        root = os.path.realpath(os.getcwd()) + os.sep
        return any(path.startswith(p) for p in prefixes) and not path.startswith(root)

    def pytest_collection(self, session) -> None:
        """Before any test module (and so any workspace code) is imported."""
        pm = session.config.pluginmanager
        self._plugins = list(pm.get_plugins())
        self._fingerprint = _Fingerprint(extra=[sys.modules[__name__]])
        self._emit("start", rootdir=str(session.config.rootpath), pid=os.getpid())

    def pytest_collectreport(self, report) -> None:
        if self._check(self._config) and not report.passed and report.nodeid:
            self._sent += 1
            self._emit(
                "collect",
                nodeid=report.nodeid,
                file=report.nodeid.split("::")[0],
                outcome=report.outcome,
                message=_longrepr(report),
            )

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "teardown" and not self._check(self._config):
            return
        self._sent += 1
        self._emit(
            "phase",
            nodeid=report.nodeid,
            file=report.location[0],
            when=report.when,
            outcome=report.outcome,
            message=_longrepr(report),
        )

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if self._check(session.config):
            self._emit("finish", reports=self._sent, exit=int(exitstatus))
        self._dead = True


def main() -> int:
    # First, before anything of the workspace runs: the channel leaves the environment
    # (a pytest started by a test does not report), only this process keeps it.
    verdict_fd = os.environ.pop("GYRE_GRADER_VERDICT_FD", None)
    conftests = json.loads(os.environ.pop("GYRE_GRADER_CONFTESTS", "[]"))
    args, reports = _strip_junit(list(sys.argv[1:]))
    sys.argv[1:] = args
    import pytest

    plugins = _image_plugins()
    root = os.getcwd()
    for path in _workspace_paths(root):
        if path not in sys.path:
            sys.path.append(path)
    mapping = _editable_mapping()
    if mapping:
        sys.meta_path.append(_MappedFinder(mapping))
    args += ["-c", os.environ["GYRE_GRADER_INI"], "--rootdir", root, "--confcutdir", root]
    args += ["-p", "no:cacheprovider", "-o", "junit_family=xunit1"]
    for module in plugins:
        args += ["-p", module]
    extra = []
    if reports and verdict_fd is not None:
        fd = int(verdict_fd)
        os.set_inheritable(fd, False)  # not handed to processes the tests start
        extra.append(_Relay(fd, conftests))
    return int(pytest.main(args, plugins=extra))


if __name__ == "__main__":
    sys.exit(main())
