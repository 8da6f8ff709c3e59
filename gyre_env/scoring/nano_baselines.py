"""No-learning baselines on nano tasks: what a policy scores that never reads which
operation the spec asks for.

Each baseline answers a task with one operation's gold body (``def solve(a): return
a.upper()``), chosen without reading the spec's words, and every answer is graded by
the real grader on the task's own hidden tests, like a model's attempt:

- ``majority-op``: the operation most frequent in the training pool, on every task;
- ``type-guess``: an operation drawn uniformly among the training operations of the
  task's argument kind (int, str, list): the expected pass rate is the mean over them;
- ``best-op-per-kind``: per argument kind, the one operation that passes the most of
  these very tasks: an upper bound on any policy that sees only the argument's kind
  (chosen on the tasks it is scored on, so it is an oracle, not a heuristic one could
  run).

With ``holdout="names"`` the argument name of a held-out task appears in no training
task, so the name itself says nothing about the operation; the spec's verbatim
phrasings are gone with ``phrasings="words"``, so there is no expression to copy.
"""

from __future__ import annotations

import collections
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gyre_env.tasks.nano import TEMPLATES, Template

BASELINES = ("majority-op", "type-guess", "best-op-per-kind")
_BY_ID = {t.key.replace("_", "-"): t for t in TEMPLATES}
_ID = re.compile(r"^nano-(?P<op>[a-z-]+)-[0-9a-f]{10}$")


def template_of(task) -> Template:
    """The operation template of a generated nano task (from its id)."""
    m = _ID.match(task.id)
    if not m or m["op"] not in _BY_ID:
        raise ValueError(f"{task.id!r} is not a generated nano task")
    return _BY_ID[m["op"]]


def family(task) -> str:
    """The task family the statistics cluster by: its operation."""
    return template_of(task).key


def answer(task, op: Template) -> str:
    """``solution.py`` answering ``task`` with ``op``'s body, the task's own signature."""
    sig = task.title  # "solve(args)", the signature the spec names
    m = re.fullmatch(r"(?P<name>\w+)\((?P<args>[^)]*)\)", sig)
    if not m:
        raise ValueError(f"task {task.id}: title {sig!r} is not a signature")
    names = [a.strip() for a in m["args"].split(",")]
    body = op.body.format(a=names[0], b=names[-1], k="")
    return f"def {sig}:\n    return {body}\n"


def pass_matrix(tasks, ops: dict[str, list[Template]], grading, *, parallel: int = 4) -> dict:
    """``{task_id: {op_key: 1.0 | 0.0}}``: whether ``op``'s answer passes every hidden
    test of the task, for the ops ``ops[task_id]``, graded with ``grading``
    (``scoring.final.GradingConfig``). An answer the grader could not grade (an infra
    error) is left out, as a model's would be."""
    from gyre_env.scoring.final import grade_workspace

    jobs = [(t, op) for t in tasks for op in ops[t.id]]

    def one(job):
        task, op = job
        with tempfile.TemporaryDirectory(prefix="gyre-baseline-") as tmp:
            Path(tmp, "solution.py").write_text(answer(task, op), encoding="utf-8")
            result = grade_workspace(task, tmp, grading)
        return task.id, op.key, result

    out: dict[str, dict[str, float]] = {t.id: {} for t in tasks}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for task_id, key, result in pool.map(one, jobs):
            if result.valid:
                out[task_id][key] = float(result.score >= 1.0)
    return out


def no_learning_baselines(heldout, train, grading, *, parallel: int = 4) -> dict:
    """``{baseline: {task_id: expected pass}}`` on ``heldout`` (see the module docstring),
    the operations and their frequencies taken from ``train``."""
    counts = collections.Counter(template_of(t).key for t in train)
    known = [t for t in TEMPLATES if t.key in counts]
    majority = max(known, key=lambda t: (counts[t.key], t.key))
    kind_ops = {k: [t for t in known if t.kind == k] for k in {t.kind for t in known}}
    ops = {}
    for t in heldout:
        mine = kind_ops.get(template_of(t).kind, [])
        ops[t.id] = mine + ([majority] if all(op.key != majority.key for op in mine) else [])
    passes = pass_matrix(heldout, ops, grading, parallel=parallel)
    graded = [t for t in heldout if passes[t.id]]
    out: dict[str, dict[str, float]] = {name: {} for name in BASELINES}
    for t in graded:
        p = passes[t.id]
        out["majority-op"][t.id] = p.get(majority.key, 0.0)
        guesses = [p.get(op.key, 0.0) for op in kind_ops.get(template_of(t).kind, [])]
        out["type-guess"][t.id] = sum(guesses) / len(guesses) if guesses else 0.0
    for kind, kops in kind_ops.items():
        mine = [t for t in graded if template_of(t).kind == kind]
        if not mine:
            continue
        best = max(kops, key=lambda op: (sum(passes[t.id].get(op.key, 0.0) for t in mine), op.key))
        for t in mine:
            out["best-op-per-kind"][t.id] = passes[t.id].get(best.key, 0.0)
    for t in graded:  # a task of a kind no training operation has
        out["best-op-per-kind"].setdefault(t.id, 0.0)
    return out
