"""The package's import structure (``shared/ARCHITECTURE.md``, "Layering").

Every module of the installed package is read (not imported) and every import it makes,
function-level ones included, is mapped to the folder it comes from: ``gyre_env/<folder>``
or the top-level ``envs/``, ``agents/``, ``trainers/`` under their installed names
(``gyre_env.envs`` ...); a module at the package root (``gyre_env/config.py``) is a node
of its own. The rules:

- no import cycle between folders;
- no private name (``_x``, a module or an object) of one folder imported by another
  (``gyre_env._optional``, private to the package, is shared by all of it);
- a task is data: ``tasks`` imports no ``sandbox``, ``scoring`` or ``engines``;
- the proxy serves any agent: ``proxy`` imports no ``agents``;
- ``trajectory`` imports no ``proxy``; ``agents`` import no ``engines`` (they get an
  endpoint);
- ``scheduler`` never imports ``sim`` or ``train``; ``sim`` drives the scheduler's policy
  objects (a simulated result is a result of the shipped code).
"""

from __future__ import annotations

import ast
import importlib.util
from collections import defaultdict
from pathlib import Path

import pytest

FORBIDDEN = {
    "tasks": {"sandbox", "scoring", "engines"},
    "proxy": {"agents"},
    "trajectory": {"proxy"},
    "agents": {"engines"},
    "scheduler": {"sim", "train"},
}
SHARED_PRIVATE = {"gyre_env._optional"}


def package_modules() -> dict[str, Path]:
    """Installed module name -> source file, over ``gyre_env`` and its mapped folders
    (task data such as ``tasks/builtin`` is not package code and is left out)."""
    roots = {"gyre_env": Path(importlib.util.find_spec("gyre_env").origin).parent}
    for sub in ("envs", "agents", "trainers"):
        spec = importlib.util.find_spec(f"gyre_env.{sub}")
        roots[f"gyre_env.{sub}"] = Path(spec.origin).parent
    modules = {}
    for prefix, root in roots.items():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("").parts
            if "builtin" in rel or "presets" in rel:
                continue
            if prefix == "gyre_env" and rel[0] in ("envs", "agents", "trainers"):
                continue  # not where these install from
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            modules[".".join((prefix, *parts))] = path
    return modules


def folder_of(module: str, modules: dict[str, Path]) -> str:
    """``gyre_env.proxy.core`` -> ``proxy``; a root module is its own node."""
    parts = module.split(".")
    if len(parts) == 1:
        return "gyre_env"
    if len(parts) == 2 and f"{module}.__init__" not in modules:
        path = modules.get(module)
        if path is not None and path.name != "__init__.py":
            return module.removeprefix("gyre_env.")  # a root module: gyre_env.config -> config
    return parts[1]


def imports_of(module: str, source: str, is_package: bool) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import statement in ``source``,
    relative ones resolved against ``module``."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join([*here, *([base] if base else [])])
            out += [(base, a.name) for a in node.names]
    return out


def edges(modules: dict[str, Path]) -> list[tuple[str, str, str]]:
    """(importing module, imported module, imported name or '') within the package; an
    imported name that is a module counts as that module."""
    found = []
    for mod, path in modules.items():
        is_package = path.name == "__init__.py"
        for target, name in imports_of(mod, path.read_text(encoding="utf-8"), is_package):
            if not target.startswith("gyre_env"):
                continue
            if name and f"{target}.{name}" in modules:
                target, name = f"{target}.{name}", None
            found.append((mod, target, name or ""))
    return found


def violations(modules: dict[str, Path]) -> list[str]:
    bad = []
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, target, name in edges(modules):
        src, dst = folder_of(mod, modules), folder_of(target, modules)
        if src == dst:
            continue
        graph[src].add(dst)
        where = f"{mod} imports {target}" + (f":{name}" if name else "")
        if dst in FORBIDDEN.get(src, ()):
            bad.append(f"layering: {src} must not import {dst} ({where})")
        private_parts = [p for p in target.split(".")[1:] if p.startswith("_")]
        if target not in SHARED_PRIVATE and (
            private_parts or (name.startswith("_") and not name.startswith("__"))
        ):
            bad.append(f"private name across folders: {where}")
    bad += [f"folder cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected group of folders."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(_closed_path(graph, set(group)))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def _closed_path(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path from the group's first folder back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ()) & group):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return sorted(group)


def test_the_package_keeps_its_layering():
    modules = package_modules()
    assert "gyre_env.agents.base" in modules and "gyre_env.trainers.protocol" in modules
    assert "gyre_env.sim.simulator" in modules
    bad = violations(modules)
    assert not bad, "\n".join(bad)


def test_the_simulator_drives_the_schedulers_policy_objects():
    modules = package_modules()
    sim_imports = {t for m, t, _ in edges(modules) if folder_of(m, modules) == "sim"}
    assert "gyre_env.scheduler.policy" in sim_imports


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"tasks/x.py": "def f():\n    from gyre_env.sandbox import make_sandbox\n"},
            "layering: tasks must not import sandbox",
        ),
        (
            {"proxy/x.py": "from gyre_env.agents.base import _thing\n"},
            "private name across folders",
        ),
        (
            {
                "train/x.py": "from gyre_env.scheduler import y\n",
                "scheduler/y.py": "from ..train import x\n",
            },
            "folder cycle: scheduler -> train -> scheduler",
        ),
    ],
)
def test_the_checker_finds_each_kind_of_violation(tmp_path, files, expected):
    """The checker itself, on a made-up package: a function-level import, a private
    name, and a relative import that closes a cycle are each caught."""
    modules = {}
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        (path.parent / "__init__.py").write_text("", encoding="utf-8")
        folder = rel.split("/")[0]
        modules[f"gyre_env.{folder}"] = path.parent / "__init__.py"
        modules[f"gyre_env.{folder}.{Path(rel).stem}"] = path
    assert any(expected in v for v in violations(modules)), violations(modules)
