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

The verdict does not come from the JUnit file. When the grader hands this process a key
(an inherited pipe, ``GYRE_GRADER_KEY_FD``, read and closed here before pytest imports
any workspace code), the ``--junitxml`` option is taken out of the arguments (no report
file is written, nothing names one) and ``_Verdict`` streams one signed record per test
case to another inherited pipe (``GYRE_GRADER_VERDICT_FD``): a ``start`` record, each
case as pytest's JUnit writer would classify it, and a ``finish`` record with the count.
Each record carries the run's nonce, the command's index and a sequence number under an
HMAC-SHA256 whose key the workspace never sees in a file, argument, variable or pipe.
The host (``gyre_env.scoring.verdict``) accepts only an unbroken signed sequence that
ends in ``finish``.

What this covers, for code that runs inside this process (the agent's modules, imported
by the hidden tests): a report file written at any path; exiting early (``os._exit``,
``sys.exit``, a signal) or late (``atexit``), which leaves no ``finish`` record; anything
written to the verdict pipe without the key, or records dropped, reordered or replayed
from another run or command; plugins registered at run time (e.g. found through ``gc``
and ``config.pluginmanager``); outcomes changed on report objects after they were
recorded; pytest's and pluggy's functions, classes and methods replaced (and this
file's own), checked against a snapshot taken before collection at each collection
report and after each test's teardown (so a test's own ``monkeypatch`` is undone by
then); the few functions the verdict itself writes with (``os.write``, JSON quoting, the
HMAC) are bound before collection. Any of those is answered with a signed ``tampered``
record and no ``finish``. (A hidden suite that patches pytest itself and leaves it so
would read as tampering.)

What it does not cover: code in this process can read this process's memory. Code that
finds ``_Verdict`` (through ``gc``) and calls its signer, or that patches pytest for
exactly one call and restores it before the next report, can still forge records; so
can an object whose ``__eq__`` always answers True (a weakness of a test, not of the
grader). Those need a deliberate attack on this file; the grader's other layers (a fresh
uid, hidden tests it cannot change, a report it cannot reach) still hold.
"""

from __future__ import annotations

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


def _take_grant() -> dict | None:
    """The grader's key message (read once from its pipe, which is then closed), or None
    when this launcher is not the one that reports (no key fd, or the key already taken)."""
    import json

    fd_text = os.environ.pop("GYRE_GRADER_KEY_FD", None)
    if fd_text is None:
        return None
    fd = int(fd_text)
    data = b""
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    finally:
        try:
            _close(fd)
        except OSError:
            pass
    if not data.strip():
        return None
    return json.loads(data)


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


def _junit_names(nodeid: str) -> tuple[str, str]:
    """(classname, name) exactly as pytest's xunit1 JUnit writer mangles a node id."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".")
    if names[0].endswith(".py"):
        names[0] = names[0][:-3]
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def _longrepr(report, limit: int = 4000) -> str:
    try:
        text = str(report.longrepr) if report.longrepr is not None else ""
    except Exception as e:  # a repr that raises is the test's problem, not the verdict's
        text = f"<unprintable longrepr: {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2 :]


class _Verdict:
    """The pytest plugin that streams the signed verdict (see the module docstring)."""

    def __init__(self, grant: dict, fd: int):
        key = bytes.fromhex(grant["key"])
        grant["key"] = None
        try:  # a C object: its methods cannot be patched
            from _hashlib import hmac_new

            self._mac = hmac_new(key, digestmod="sha256")
        except ImportError:  # a Python without OpenSSL
            import hashlib
            import hmac

            self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._fd = fd
        self._base = {"n": grant["nonce"], "c": int(grant["index"])}
        self._conftests = {os.path.realpath(p) for p in grant.get("conftests", [])}
        self._seq = 0
        self._sent = 0
        self._phases: dict[str, dict] = {}
        self._dead = False
        self._plugins: list | None = None
        self._fingerprint: _Fingerprint | None = None
        self._config = None

    def pytest_configure(self, config) -> None:
        self._config = config

    def _emit(self, kind: str, **fields) -> None:
        if self._dead:
            return
        body = _serialize({**fields, **self._base, "i": self._seq, "k": kind}).encode()
        mac = self._mac.copy()
        mac.update(body)
        line = b'{"m":"' + mac.hexdigest().encode() + b'","r":' + _quote(body.decode()).encode()
        line += b"}\n"
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
            classname, name = _junit_names(report.nodeid)
            outcome = "error" if report.failed else "skipped"
            self._case(classname, name, report.nodeid.split("::")[0], outcome, _longrepr(report))

    def pytest_runtest_logreport(self, report) -> None:
        phases = self._phases.setdefault(report.nodeid, {})
        phases[report.when] = (report.outcome, _longrepr(report))
        if report.when == "teardown":
            self._phases.pop(report.nodeid)
            if not self._check(self._config):
                return
            outcome, message = _junit_outcome(phases)
            classname, name = _junit_names(report.nodeid)
            self._case(classname, name, report.location[0], outcome, message)

    def _case(self, classname: str, name: str, file: str, outcome: str, message: str) -> None:
        self._sent += 1
        self._emit(
            "case", classname=classname, name=name, file=file, outcome=outcome, message=message
        )

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if self._check(session.config):
            self._emit("finish", cases=self._sent, exit=int(exitstatus))
        self._dead = True


def _junit_outcome(phases: dict) -> tuple[str, str]:
    """One case's outcome from its setup/call/teardown reports, as the JUnit file has it
    once ``parse_junit`` reads it (an error wins, then a failure, then a skip)."""
    setup, call, teardown = (phases.get(w, ("passed", "")) for w in ("setup", "call", "teardown"))
    if setup[0] == "failed":
        return "error", setup[1]
    if setup[0] == "skipped":
        return "skipped", setup[1]
    if call[0] == "failed":
        return "failed", call[1]
    if teardown[0] == "failed":
        return "error", teardown[1]
    if call[0] == "skipped":
        return "skipped", call[1]
    return "passed", ""


def main() -> int:
    grant = _take_grant()  # first: nothing of the workspace has run yet
    verdict_fd = os.environ.pop("GYRE_GRADER_VERDICT_FD", None)
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
    if reports and grant is not None and verdict_fd is not None:
        fd = int(verdict_fd)
        os.set_inheritable(fd, False)  # not handed to processes the tests start
        extra.append(_Verdict(grant, fd))
    return int(pytest.main(args, plugins=extra))


if __name__ == "__main__":
    sys.exit(main())
