"""Does RL itself learn on a CPU? RL's held-out gain against controls that isolate it and
against baselines that need no learning, over several seeds.

    python benchmarks/train_cpu.py                             # seeds 0 1 2, held-out
    python benchmarks/train_cpu.py --split validation --seeds 1  # for choosing settings
    python benchmarks/train_cpu.py --curve OUT/seed1/rl          # RL's training pass rate
    python benchmarks/train_cpu.py --answers OUT/seed1/rl        # what it wrote at coined words

Per seed S (the seed sets the model's initial weights, the tasks drawn and sampling):

- **RL** is ``gyre train --preset cpu-demo --seed S --iterations 72``: SFT on the
  preset's gold trajectories, then RL on the training tasks SFT had no gold for (with the
  preset's gold steps after each iteration's RL steps, if it has any). The benchmark runs
  ``ITERATIONS`` (72) RL iterations, twice the main job's 36, which fit its 15 minutes:
  chosen on validation (seed 1), where RL was still rising at 36 and (a) had stopped
  (``--iterations`` sets another count).
- Every control starts from the RL run's own SFT checkpoint (same weights, same gold data):
  - **(a) more SFT**: SFT continued at the RL arm's gold-step learning rate for as many
    steps as fit in the RL phase's wall time at the run's own gold-step speed (RL's
    wall time, in steps: a wall-clock limit would shrink on a loaded machine);
  - **(b) gold steps only**: the RL arm's schedule with the RL loss switched off
    (``schedule.rl_updates = false``: each iteration's gold steps, nothing else);
  - **(c) RL without gold steps** (``sft.steps_per_iteration = 0``).
- **SFT** is the SFT checkpoint itself.

Then every model is measured again on the evaluated split with ``--eval-attempts``
sampled attempts per task (default 4), and the no-learning baselines
(``gyre_env.scoring.nano_baselines``) are graded on the same tasks. The evaluated split is
``heldout`` (the benchmark's final run: no setting was chosen on it) or ``validation``
(cut from the training split; the held-out tasks are then never loaded).

Differences are paired by task; their standard errors are clustered by task family (the
operation: a family's tasks share their answer), and their 95% intervals use Student's t
with (families - 1) degrees of freedom. Over seeds, the per-task differences are
averaged first, then clustered the same way.

Prints the table, checks the targets, and writes ``summary.json`` and ``arms.png`` under
``--out`` and every figure, with the commit it was measured at, to ``--results``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ARMS = {
    "sft": "SFT checkpoint (every arm starts here)",
    "rl": "RL (rollouts + gold steps)",
    "a_more_sft": "(a) SFT continued at RL's gold-step lr, RL's wall time",
    "b_gold_only": "(b) RL's schedule, RL loss off (gold steps only)",
    "c_no_gold": "(c) RL without gold steps",
}
CONTROLS = ("a_more_sft", "b_gold_only", "c_no_gold")
ITERATIONS = 72
"""The RL arm's iterations (the preset's 36 fit the main job's 15 minutes). Chosen on the
validation split, seed 1: RL 0.578 at 36, 0.677 at 72; control (a) at RL's wall time 0.406
and 0.370 (README, "Does RL itself learn?")."""
NO_GOLD_STEPS = {"rl": "RL (rollouts only, no gold steps)"}
"""An RL arm without gold steps: (b) would take no step at all (it is the SFT checkpoint)
and (c) would be the RL arm itself, so (a) is its one control besides SFT."""


def controls_of(cfg) -> tuple[str, ...]:
    """The controls that isolate RL in ``cfg``'s RL arm (see ``NO_GOLD_STEPS``)."""
    return CONTROLS if cfg.gold_steps_per_iteration() else CONTROLS[:1]


def labels_of(res: dict) -> dict[str, str]:
    """Each measured arm's label (results files before ``controls`` ran all of them)."""
    controls = res.get("controls", CONTROLS)
    names = ["sft", "rl", *controls]
    extra = NO_GOLD_STEPS if tuple(controls) != CONTROLS else {}
    return {n: extra.get(n, ARMS[n]) for n in names}


TARGETS = {"rl_minus_best_control": 0.10, "rl_minus_sft": 0.15, "rl_minus_best_baseline": 0.15}
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
_T975.update({9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131})


def _t975(df: int) -> float:
    """Student's t 0.975 quantile (1.96 past 15 degrees of freedom, within 0.15)."""
    return _T975.get(df, 1.96) if df >= 1 else float("nan")


def clustered(diffs: dict[str, float], family: dict[str, str]) -> dict:
    """Mean of the per-task ``diffs`` with its cluster-robust standard error (clusters:
    ``family`` of each task; CR1 small-sample factor G/(G-1)) and 95% interval."""
    tasks = sorted(diffs)
    d = np.array([diffs[t] for t in tasks], dtype=float)
    n = len(d)
    mean = float(d.mean()) if n else float("nan")
    groups: dict[str, float] = {}
    for t, x in zip(tasks, d, strict=True):
        groups[family[t]] = groups.get(family[t], 0.0) + (x - mean)
    g = len(groups)
    if g < 2:
        return {"mean": mean, "se": float("nan"), "lo": float("nan"), "hi": float("nan"), "g": g}
    se = float(np.sqrt(g / (g - 1) * sum(v * v for v in groups.values())) / n)
    half = _t975(g - 1) * se
    return {"mean": mean, "se": se, "lo": mean - half, "hi": mean + half, "g": g}


def _rows(out: Path, kind: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _sft_steps_in(rl: Path) -> int:
    """How many SFT steps fit in the RL phase's wall time: its seconds over the median
    time of the run's own gold steps (the same batches; its SFT steps without them). Both
    were measured in the same run, so the count does not depend on how loaded the machine
    was, as a wall-clock limit on the control would."""
    steps = _rows(rl, "ptx") or _rows(rl, "sft")
    if not steps:  # e.g. RL from model.path with sft.steps = 0: nothing to time
        raise SystemExit(
            f"{rl}: the RL run took no SFT or gold step, so control (a)'s step count has no "
            "timing to come from: pass --a-steps N, or give the run a few SFT steps "
            "(--set sft.steps=8)"
        )
    return max(1, round(_rl_seconds(rl) / float(np.median([r["step_s"] for r in steps]))))


def _rl_seconds(out: Path) -> float:
    """Wall time of the RL phase: its iterations' rollouts, steps and weight pushes."""
    it = _rows(out, "iteration")
    return sum(r["time_rollout"] + r["time_train"] + r["time_sync"] for r in it)


class Interrupted(Exception):
    """A run was stopped (Ctrl-C): its checkpoint stands, the benchmark stops."""


def _finished(summary, out: Path) -> None:
    if summary.interrupted:
        raise Interrupted(out)


def _base(args, seed: int) -> list[str]:
    base = [
        *args.set,
        f"seed={seed}",
        "logging.tensorboard=false",
        f"schedule.eval_every={10**6}",  # the arms are measured after, on equal terms
        "schedule.eval_random=false",
        "schedule.baselines=false",  # graded once by the benchmark
        f"tasks.eval_split={args.split!r}",
    ]
    if args.iterations is not None:
        base.append(f"schedule.iterations={args.iterations}")
    if args.no_progress:
        base.append("logging.progress=false")
    return base


def run_rl(seed: int, args) -> Path:
    """The RL arm: the preset as ``gyre train`` runs it (reused when already finished)."""
    from gyre_env.train import load_config, train

    out = Path(args.out) / f"seed{seed}" / "rl"
    if (out / "model").is_dir() and (out / "checkpoint-sft").is_dir() and args.reuse:
        return out
    cfg = load_config(preset=args.preset, overrides=[*_base(args, seed), f"out={str(out)!r}"])
    resume = args.reuse and (out / "checkpoints" / "cursor.json").is_file()
    if not resume:
        shutil.rmtree(out, ignore_errors=True)
    _finished(train(cfg, resume=resume), out)
    return out


def run_control(seed: int, name: str, rl: Path, args) -> Path:
    """A control from the RL run's SFT checkpoint (see the module docstring)."""
    import torch

    from gyre_env.train import load_config, train

    out = Path(args.out) / f"seed{seed}" / name
    if (out / "model").is_dir() and args.reuse:
        return out
    cfg = load_config(preset=args.preset, overrides=_base(args, seed))
    extra = _control_settings(name, rl, cfg, args.a_steps)
    base = [*_base(args, seed), f"out={str(out)!r}"]
    if args.reuse and (out / "started").is_file():  # a stopped control: continue it
        cfg = load_config(preset=args.preset, overrides=[*base, *extra])
        _finished(train(cfg, resume=True), out)
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copytree(rl / "checkpoint-sft", out / "checkpoints")
    shutil.copy(rl / "store.db", out / "store.db")  # the gold episodes (run "sft")
    keep = []  # the run's rows up to the end of SFT
    for line in (rl / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["kind"] in ("phase", "sft") or row.get("phase") in ("random", "sft"):
            keep.append(line)
    (out / "metrics.jsonl").write_text("".join(x + "\n" for x in keep), encoding="utf-8")
    if name == "a_more_sft":
        lr = cfg.algorithm.optim.lr  # the gold steps' learning rate
        state = torch.load(out / "checkpoints" / "ckpt.pt", weights_only=False)
        state["cursor"]["phase"] = "sft_train"  # the steps done are kept
        for group in state["trainer"]["optimizer"]["param_groups"]:
            group["lr"] = lr
        sched = state["trainer"]["scheduler"]
        sched["base_lrs"] = [lr] * len(sched["base_lrs"])
        state["trainer"].pop("schedule", None)  # constant at that rate, whatever SFT's was
        torch.save(state, out / "checkpoints" / "ckpt.pt")
        cursor = json.dumps(state["cursor"])
        (out / "checkpoints" / "cursor.json").write_text(cursor, encoding="utf-8")
    (out / "started").write_text("", encoding="utf-8")
    cfg = load_config(preset=args.preset, overrides=[*base, *extra])
    _finished(train(cfg, resume=True), out)
    return out


def _control_settings(name: str, rl: Path, cfg, a_steps: int | None = None) -> list[str]:
    """The overrides that make control ``name`` of the RL run ``rl`` (``cfg``: its config;
    ``a_steps``: control (a)'s steps, default ``_sft_steps_in(rl)``)."""
    if name == "a_more_sft":
        lr = cfg.algorithm.optim.lr  # the gold steps' learning rate
        return [
            "schedule.iterations=0",
            f"sft.steps={len(_rows(rl, 'sft')) + (a_steps or _sft_steps_in(rl))}",
            f"sft.lr={lr}",
            'sft.lr_schedule="constant"',
        ]
    if name == "b_gold_only":
        return ["schedule.rl_updates=false"]
    if name == "c_no_gold":
        return ["sft.steps_per_iteration=0"]
    raise ValueError(f"unknown control {name!r}")


def measure(seed: int, name: str, model: Path, args) -> dict:
    """``model``'s pass rate per evaluated task over ``--eval-attempts`` sampled attempts,
    as an evaluation run of its own."""
    from gyre_env.train import load_config
    from gyre_env.train.run import evaluate_heldout

    out = Path(args.out) / f"seed{seed}" / "measure" / name
    result = out / "per_task.json"
    if result.is_file() and args.reuse:
        return json.loads(result.read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(
        preset=args.preset,
        overrides=[
            *_base(args, seed),
            f"out={str(out)!r}",
            f"rollout.eval_attempts={args.eval_attempts}",
        ],
    )
    row = evaluate_heldout(cfg, model, out, "measure")
    attempts: dict[str, list[float]] = {}
    for line in (out / "episodes.jsonl").read_text(encoding="utf-8").splitlines():
        ep = json.loads(line)
        if ep["reward_valid"] and ep["score"] is not None:
            attempts.setdefault(ep["task_id"], []).append(float(ep["score"] >= 1.0))
    data = {
        "pass_rate": row["pass_rate"],
        "per_task": {t: float(np.mean(v)) for t, v in attempts.items()},
        "episodes": row["episodes"],
        "seconds": row["time_eval"],
    }
    result.write_text(json.dumps(data), encoding="utf-8")
    return data


def baselines(args, cfg) -> tuple[dict, dict, dict]:
    """(no-learning baselines per task, family of each task, whether each task is of a
    kind that has gold: its operation and phrasing appear in some gold trajectory), on
    the tasks of ``cfg`` (the preset with the benchmark's settings)."""
    from gyre_env.scoring.nano_baselines import family, no_learning_baselines
    from gyre_env.train.setup import grading_config, task_pool

    pool = task_pool(cfg)
    grading = grading_config(cfg)
    path = Path(args.out) / f"baselines-{args.split}.json"
    if path.is_file() and args.reuse:
        base = json.loads(path.read_text(encoding="utf-8"))
    else:
        base = no_learning_baselines(pool.heldout, pool.train, grading, parallel=args.parallel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(base), encoding="utf-8")
    fam = {t.id: family(t) for t in pool.heldout}
    return base, fam, {t.id: t.gold_dir is not None for t in pool.heldout}


def _rl_attempts(run: Path) -> tuple[list, list[tuple[int, dict]]]:
    """The training tasks of ``run`` (a ``gyre train`` folder) and RL's graded attempts
    at them, as (iteration, episode row)."""
    from gyre_env.config import from_dict
    from gyre_env.train.config import TasksConfig
    from gyre_env.train.setup import task_splits

    tasks = json.loads((run / "config.json").read_text(encoding="utf-8"))["tasks"]
    train, _ = task_splits(from_dict(TasksConfig, tasks))
    ids = {task.id for task in train}
    attempts = []
    for line in (run / "episodes.jsonl").read_text(encoding="utf-8").splitlines():
        ep = json.loads(line)
        head, it = ep["session"].split(".")[:2]
        if head == "rl" and ep["reward_valid"] and ep["task_id"] in ids:
            attempts.append((int(it), ep))
    return train, attempts


def curve(run: Path, parts: int = 4) -> list[dict]:
    """RL's own training attempts in ``run`` (a ``gyre train`` folder), its iterations cut
    into ``parts`` equal blocks: per block, the pass rate on training tasks that carry gold
    and on those that do not (their operation and phrasing are in no gold trajectory, as
    with ``gold_phrasing``), and how many attempts ended without a tool call (the format
    lost). What RL learns where gold cannot teach, read during the run."""
    train, eps = _rl_attempts(run)
    gold = {task.id: task.gold_dir is not None for task in train}
    attempts = [  # (iteration, has gold, passed, ended without a tool call)
        (
            it,
            gold[ep["task_id"]],
            (ep["score"] or 0.0) >= 1.0,
            ep.get("end_reason") == "no_tool_call",
        )
        for it, ep in eps
    ]
    if not attempts:
        return []
    last = max(a[0] for a in attempts) + 1
    rows = []
    for b in range(parts):
        lo, hi = b * last // parts, (b + 1) * last // parts
        block = [a for a in attempts if lo <= a[0] < hi]
        row = {"iterations": f"{lo}-{hi - 1}"}
        for key, want in (("gold", True), ("no_gold", False)):
            passed = [p for _, g, p, _ in block if g == want]
            row[key] = {"passed": sum(passed), "attempts": len(passed)}
        row["no_tool_call"] = {"ended": sum(a[3] for a in block), "attempts": len(block)}
        rows.append(row)
    return rows


def print_curve(run: Path) -> None:
    print(f"{run}: RL's training attempts, pass rate by block of iterations")
    print(
        f"{'iterations':<12}{'tasks with gold':>22}{'tasks without gold':>24}"
        f"{'ended without a tool call':>28}"
    )
    for row in curve(run):
        cells = [
            f"{n}/{c['attempts']} = {n / c['attempts']:.2f}" if c["attempts"] else "-"
            for c, n in (
                (row["gold"], row["gold"]["passed"]),
                (row["no_gold"], row["no_gold"]["passed"]),
                (row["no_tool_call"], row["no_tool_call"]["ended"]),
            )
        ]
        print(f"{row['iterations']:<12}{cells[0]:>22}{cells[1]:>24}{cells[2]:>28}")


def _answer_patterns(keys) -> dict[str, re.Pattern]:
    """Per nano operation, a pattern for its returned expression around any names."""
    from gyre_env.tasks.nano import TEMPLATES

    out = {}
    for t in TEMPLATES:
        if t.key in keys:
            parts = re.split(r"(\{[abk]\})", t.body)
            body = "".join(r"\w+" if p in ("{a}", "{b}", "{k}") else re.escape(p) for p in parts)
            out[t.key] = re.compile(r"return\s+" + body)
    return out


def answers(run: Path, parts: int = 3) -> list[dict]:
    """What RL's training attempts in ``run`` wrote at tasks without gold, its iterations
    cut into ``parts`` blocks: per block and asked-for operation, how often each operation's
    expression was written (``?``: none of them) and how often that attempt passed. With
    the coined phrasings, these are the coined words, and this says which word RL learned
    and what it answers the others with."""
    from gyre_env.engines.tiny import load_tokenizer
    from gyre_env.scoring.nano_baselines import template_of
    from gyre_env.trajectory.store import TrajectoryStore

    train, eps = _rl_attempts(run)
    asked = {t.id: template_of(t).key for t in train if t.gold_dir is None}
    patterns = _answer_patterns(set(template_of(t).key for t in train))
    eps = [(it, ep) for it, ep in eps if ep["task_id"] in asked]
    if not eps:
        return []
    tok = load_tokenizer(run / "model-sft" if (run / "model-sft").is_dir() else run / "model")
    last = max(it for it, _ in eps) + 1
    parts = max(1, min(parts, last))  # no empty block
    counts: dict = collections.defaultdict(collections.Counter)
    with TrajectoryStore(run / "store.db") as store:
        for it, ep in eps:
            text = "".join(tok.decode(r.output_ids) for r in store.records([ep["session"]]))
            text = text.replace("\\n", "\n")  # the tool call's JSON-escaped file
            wrote = next((op for op, pat in patterns.items() if pat.search(text)), "?")
            block = min(parts - 1, it * parts // last)
            passed = (ep["score"] or 0.0) >= 1.0
            counts[(block, asked[ep["task_id"]])][(wrote, passed)] += 1
    rows = []
    for (block, op), c in sorted(counts.items()):
        lo, hi = block * last // parts, (block + 1) * last // parts - 1
        wrote = collections.Counter()
        for (w, _), n in c.items():
            wrote[w] += n
        rows.append(
            {
                "iterations": f"{lo}-{hi}",
                "asked": op,
                "attempts": sum(c.values()),
                "passed": sum(n for (_, p), n in c.items() if p),
                "wrote": dict(wrote.most_common()),
            }
        )
    return rows


def print_answers(run: Path) -> None:
    print(f"{run}: RL's training attempts at tasks without gold, what they wrote")
    for row in answers(run):
        wrote = ", ".join(f"{w} {n}" for w, n in row["wrote"].items())
        print(
            f"iterations {row['iterations']:<8} {row['asked']:<9} "
            f"passed {row['passed']}/{row['attempts']}: wrote {wrote}"
        )


def _mean(per_task: dict) -> float:
    return float(np.mean(list(per_task.values()))) if per_task else float("nan")


def _subset(per_task: dict, keep: dict, want: bool) -> dict:
    return {t: v for t, v in per_task.items() if keep[t] == want}


def _diff(a: dict, b: dict) -> dict:
    return {t: a[t] - b[t] for t in a if t in b}


def analyse(
    per_seed: dict, base: dict, fam: dict, gold: dict, controls: tuple[str, ...] = CONTROLS
) -> dict:
    """Every figure the README quotes, from the per-task pass rates (``controls``: those
    the RL arm has, ``controls_of``)."""
    seeds = sorted(per_seed)
    out: dict = {"seeds": seeds, "arms": {}, "baselines": {}, "per_seed": {}, "pooled": {}}
    out["controls"] = list(controls)
    for name, per_task in base.items():
        out["baselines"][name] = _mean(per_task)
    best_base = max(base, key=lambda n: _mean(base[n]))
    for arm in ("sft", "rl", *controls):
        rates = [_mean(per_seed[s][arm]) for s in seeds]
        with_gold = [_mean(_subset(per_seed[s][arm], gold, True)) for s in seeds]
        no_gold = [_mean(_subset(per_seed[s][arm], gold, False)) for s in seeds]
        out["arms"][arm] = {
            "mean": float(np.mean(rates)),
            "per_seed": dict(zip(map(str, seeds), rates, strict=True)),
            "gold_kind_mean": float(np.mean(with_gold)),
            "no_gold_kind_mean": float(np.mean(no_gold)),
        }
    for name, per_task in base.items():
        out["baselines_by_kind"] = out.get("baselines_by_kind", {})
        out["baselines_by_kind"][name] = {
            "gold_kind": _mean(_subset(per_task, gold, True)),
            "no_gold_kind": _mean(_subset(per_task, gold, False)),
        }
    for s in seeds:
        arms = per_seed[s]
        best_ctl = max(controls, key=lambda c: _mean(arms[c]))
        out["per_seed"][str(s)] = {
            "best_control": best_ctl,
            "rl_minus_best_control": clustered(_diff(arms["rl"], arms[best_ctl]), fam),
            "rl_minus_sft": clustered(_diff(arms["rl"], arms["sft"]), fam),
            "rl_minus_best_baseline": clustered(_diff(arms["rl"], base[best_base]), fam),
            **{f"rl_minus_{c}": clustered(_diff(arms["rl"], arms[c]), fam) for c in controls},
        }

    def pooled(other) -> dict:  # per-task differences averaged over seeds, then clustered
        per_task: dict[str, list[float]] = {}
        for s in seeds:
            for t, d in _diff(per_seed[s]["rl"], other(s)).items():
                per_task.setdefault(t, []).append(d)
        return clustered({t: float(np.mean(v)) for t, v in per_task.items()}, fam)

    best_mean_ctl = max(controls, key=lambda c: out["arms"][c]["mean"])
    out["pooled"] = {
        "best_control": best_mean_ctl,
        "best_baseline": best_base,
        "rl_minus_best_control": pooled(lambda s: per_seed[s][best_mean_ctl]),
        "rl_minus_sft": pooled(lambda s: per_seed[s]["sft"]),
        "rl_minus_best_baseline": pooled(lambda s: base[best_base]),
        **{f"rl_minus_{c}": pooled(lambda s, c=c: per_seed[s][c]) for c in controls},
    }
    per = out["per_seed"]
    out["targets"] = {
        "rl_minus_best_control": {
            "want": f">= {TARGETS['rl_minus_best_control']} on average, > 0 on every seed, "
            "95% interval excluding 0",
            "met": bool(
                out["pooled"]["rl_minus_best_control"]["mean"] >= TARGETS["rl_minus_best_control"]
                and out["pooled"]["rl_minus_best_control"]["lo"] > 0
                and all(per[str(s)]["rl_minus_best_control"]["mean"] > 0 for s in seeds)
            ),
        },
        "rl_minus_sft": {
            "want": f">= {TARGETS['rl_minus_sft']} on average",
            "met": bool(out["pooled"]["rl_minus_sft"]["mean"] >= TARGETS["rl_minus_sft"]),
        },
        "rl_minus_best_baseline": {
            "want": f">= {TARGETS['rl_minus_best_baseline']} on average",
            "met": bool(
                out["pooled"]["rl_minus_best_baseline"]["mean"] >= TARGETS["rl_minus_best_baseline"]
            ),
        },
    }
    return out


def _ci(c: dict) -> str:
    return f"{c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]"


def _rate(x: float) -> str:
    """A pass rate, or "-" for a subset with no tasks (its mean is nan)."""
    return "-" if np.isnan(x) else f"{x:.3f}"


def print_table(res: dict, split: str) -> None:
    seeds = res["seeds"]
    print(f"\n{split} pass rate, {res['attempts']} sampled attempts per task, {res['tasks']} tasks")
    print(
        f"{'arm':<58}"
        + "".join(f"  seed {s}" for s in seeds)
        + "    mean  gold-phrasing  no-gold-phrasing"
    )
    for arm, label in labels_of(res).items():
        a = res["arms"][arm]
        print(
            f"{label:<58}"
            + "".join(f"  {a['per_seed'][str(s)]:6.3f}" for s in seeds)
            + f"  {a['mean']:6.3f}  {_rate(a['gold_kind_mean']):>13}  "
            + f"{_rate(a['no_gold_kind_mean']):>16}"
        )
    for name, rate in res["baselines"].items():
        print(f"{'no-learning baseline: ' + name:<58}" + " " * (8 * len(seeds)) + f"  {rate:6.3f}")
    print("\ndifferences, paired by task; [95% interval, clustered by operation]")
    for s in seeds:
        p = res["per_seed"][str(s)]
        print(
            f"seed {s}: RL - best control ({p['best_control']}) {_ci(p['rl_minus_best_control'])}"
            f"   RL - SFT {_ci(p['rl_minus_sft'])}"
        )
    p = res["pooled"]
    print(f"over seeds: RL - best control ({p['best_control']}) {_ci(p['rl_minus_best_control'])}")
    for c in res.get("controls", CONTROLS):
        print(f"            RL - {c} {_ci(p['rl_minus_' + c])}")
    print(f"            RL - SFT {_ci(p['rl_minus_sft'])}")
    print(
        f"            RL - best baseline ({p['best_baseline']}) {_ci(p['rl_minus_best_baseline'])}"
    )
    for name, t in res["targets"].items():
        print(f"target {name} {t['want']}: {'met' if t['met'] else 'NOT met'}")


def _load_results(p: argparse.ArgumentParser, path: str) -> dict:
    """A results file for ``--show``, or a parser error that says what is wrong with it."""
    try:
        res = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        p.error(f"--show {path}: {e.strerror or e}")
    except json.JSONDecodeError as e:
        p.error(f"--show {path}: not JSON ({e})")
    if not isinstance(res, dict):
        p.error(f"--show {path}: not a results file of this benchmark (not a JSON object)")
    want = ["split", "arms", "commit", "measured_at", "command"]
    if res.get("kind") == "rl_variants":
        want += ["seed", "iterations", "attempts_per_task"]
    else:
        want += ["seeds", "per_seed", "baselines"]
    missing = [k for k in want if k not in res]
    if missing:
        p.error(f"--show {path}: not a results file of this benchmark (no {', '.join(missing)})")
    return res


def print_variants(res: dict) -> None:
    """A file of RL settings tried on one seed from one SFT checkpoint (no controls)."""
    print(
        f"{res['split']} pass rate, seed {res['seed']}, {res['iterations']} RL iterations, "
        f"{res['attempts_per_task']} sampled attempts per task"
    )
    print(f"{'arm':<16}{'all':>7}{'gold-phrasing':>15}{'coined':>8}  what it changed")
    for name, a in res["arms"].items():
        print(
            f"{name:<16}{a['all']:7.3f}{a['gold_phrasing']:15.3f}{a['coined']:8.3f}  {a['label']}"
        )
    for name, rate in res.get("baselines", {}).items():
        print(f"{'no-learning baseline: ' + name:<46}{rate:7.3f}")


def markdown(res: dict) -> str:
    """The README's table and differences, from a results file's figures."""
    seeds = res["seeds"]
    head = "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |"
    lines = [head, "|---" * (len(seeds) + 2) + "|"]
    for arm, label in labels_of(res).items():
        a = res["arms"][arm]
        cells = " | ".join(f"{a['per_seed'][str(s)]:.3f}" for s in seeds)
        lines.append(f"| {label} | {cells} | {a['mean']:.3f} |")
    for name, rate in res["baselines"].items():
        lines.append(f"| no-learning baseline: {name} |" + " |" * len(seeds) + f" {rate:.3f} |")
    p = res["pooled"]
    lines += [
        "",
        "| difference (paired by task; 95% interval clustered by operation) | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | over seeds |",
        "|---" * (len(seeds) + 2) + "|",
    ]
    rows = [("RL - best control", "rl_minus_best_control"), ("RL - SFT", "rl_minus_sft")]
    rows += [(f"RL - {c}", f"rl_minus_{c}") for c in res.get("controls", CONTROLS)]
    for label, key in rows:
        cells = " | ".join(_ci(res["per_seed"][str(s)][key]) for s in seeds)
        lines.append(f"| {label} | {cells} | {_ci(p[key])} |")
    lines.append(
        f"| RL - best baseline ({p['best_baseline']}) | "
        + " | ".join(_ci(res["per_seed"][str(s)]["rl_minus_best_baseline"]) for s in seeds)
        + f" | {_ci(p['rl_minus_best_baseline'])} |"
    )
    return "\n".join(lines)


def _commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def _plot(res: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(labels_of(res))
    x = np.arange(len(names))
    for i, s in enumerate(res["seeds"]):
        ax.scatter(x + (i - 1) * 0.12, [res["arms"][n]["per_seed"][str(s)] for n in names], s=18)
    ax.bar(x, [res["arms"][n]["mean"] for n in names], alpha=0.35, color="grey")
    for name, rate in res["baselines"].items():
        ax.axhline(rate, ls="--", lw=1, color="black")
        ax.text(len(names) - 0.5, rate, f" {name}", va="center", fontsize=8)
    ticks = {"sft": "SFT", "rl": "RL", "a_more_sft": "(a) more\nSFT"}
    ticks.update(b_gold_only="(b) gold\nsteps only", c_no_gold="(c) RL no\ngold steps")
    ax.set_xticks(x, [ticks[n] for n in names])
    ax.set_ylabel(f"{res['split']} pass rate")
    ax.set_title("bars: mean over seeds; dots: seeds; dashed: no-learning baselines")
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--split", choices=("heldout", "validation"), default="heldout")
    p.add_argument("--out", default="runs/train-cpu-bench")
    p.add_argument("--results", default=None, help="results file (default: OUT/results.json)")
    p.add_argument(
        "--iterations",
        type=int,
        default=ITERATIONS,
        help=f"RL iterations (default {ITERATIONS}; the preset's own 36 fit the main job)",
    )
    p.add_argument("--eval-attempts", type=int, default=4, metavar="N")
    p.add_argument("--parallel", type=int, default=8, help="baseline gradings in flight")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--reuse", action="store_true", help="keep finished arms under --out")
    p.add_argument(
        "--a-steps",
        type=int,
        default=None,
        metavar="N",
        help="control (a)'s SFT steps (default: as many as fit in the RL phase's wall time "
        "at the run's own gold-step speed; set it when the RL runs shared the machine)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--curve",
        metavar="RUN",
        nargs="+",
        help="run nothing: print RL's training pass rate by block of iterations in these "
        "gyre train folders, on tasks with gold and without",
    )
    p.add_argument(
        "--answers",
        metavar="RUN",
        nargs="+",
        help="run nothing: print what RL's training attempts in these gyre train folders "
        "wrote at the tasks without gold (coined words), by block of iterations",
    )
    p.add_argument(
        "--show",
        metavar="RESULTS",
        help="run nothing: print the table of a results file, and its README markdown",
    )
    args = p.parse_args(argv)
    if args.answers:
        for run in map(Path, args.answers):
            missing = [
                f for f in ("config.json", "episodes.jsonl", "store.db") if not (run / f).is_file()
            ]
            if missing:
                p.error(f"--answers {run}: not a gyre train folder (no {' or '.join(missing)})")
            print_answers(run)
        return 0
    if args.curve:
        for run in map(Path, args.curve):
            missing = [f for f in ("config.json", "episodes.jsonl") if not (run / f).is_file()]
            if missing:
                p.error(f"--curve {run}: not a gyre train folder (no {' or '.join(missing)})")
        for run in args.curve:
            print_curve(Path(run))
        return 0
    if args.show:
        res = _load_results(p, args.show)
        variants = res.get("kind") == "rl_variants"
        if variants:
            print_variants(res)
        else:
            print_table(res, res["split"])
        print(f"\nmeasured at {res['commit']} ({res['measured_at']}): {res['command']}\n")
        if not variants:
            print(markdown(res))
        return 0
    if args.eval_attempts < 1:
        p.error(f"--eval-attempts must be >= 1, got {args.eval_attempts}")
    if args.iterations is not None and args.iterations < 1:
        p.error(f"--iterations must be >= 1, got {args.iterations}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    print(f"== no-learning baselines on {args.split}", file=sys.stderr, flush=True)
    from gyre_env.train import load_config

    cfg = load_config(preset=args.preset, overrides=_base(args, 0))
    base, fam, gold = baselines(args, cfg)
    controls = controls_of(cfg)
    per_seed: dict[int, dict] = {}
    walls: dict[int, dict] = {}
    try:
        for seed in args.seeds:
            print(f"== seed {seed}: RL", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            rl = run_rl(seed, args)
            models = {"sft": rl / "model-sft", "rl": rl / "model"}
            wall = {"rl_run": time.monotonic() - t0, "rl_phase": _rl_seconds(rl)}
            for name in controls:
                print(f"== seed {seed}: control {name}", file=sys.stderr, flush=True)
                t0 = time.monotonic()
                models[name] = run_control(seed, name, rl, args) / "model"
                wall[name] = time.monotonic() - t0
            per_seed[seed] = {}
            for name, model in models.items():
                print(f"== seed {seed}: measure {name}", file=sys.stderr, flush=True)
                per_seed[seed][name] = measure(seed, name, model, args)["per_task"]
            walls[seed] = wall
    except Interrupted as stopped:
        print(f"interrupted in {stopped}; rerun with --reuse to continue", file=sys.stderr)
        return 130
    res = analyse(per_seed, base, fam, gold, controls)
    res.update(
        split=args.split,
        preset=args.preset,
        attempts=args.eval_attempts,
        tasks=len(fam),
        commit=_commit(),
        command=" ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        wall_seconds={str(s): w for s, w in walls.items()},
        total_seconds=time.monotonic() - start,
        tasks_of_gold_kind=sum(gold.values()),
        tasks_of_no_gold_kind=sum(not g for g in gold.values()),
    )
    print_table(res, args.split)
    (out / "summary.json").write_text(
        json.dumps({"result": res, "per_seed": per_seed, "baselines": base}, indent=1),
        encoding="utf-8",
    )
    results = Path(args.results) if args.results else out / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    _plot(res, out / "arms.png")
    print(f"results: {results}  per task: {out / 'summary.json'}  plot: {out / 'arms.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
