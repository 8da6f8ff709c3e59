"""Proof that Gyre learns on a CPU: held-out nano pass rate of the random model, the SFT
checkpoint and the RL result, over several seeds, with a control.

    python benchmarks/train_cpu.py                       # seeds 0 1 2, preset cpu-demo
    python benchmarks/train_cpu.py --seeds 0 --iterations 4

RL runs ``--iterations`` iterations (default 24, the preset's; held-out is also evaluated
half-way). 48 (twice the README job's budget, the control getting the same longer wall
time) was measured on seeds 0 and 1 and gained nothing over 24 (README). About 25
minutes per seed on 2 cores at 24, 38 at 48.

Per seed, run A is ``gyre train --preset cpu-demo --seed S`` (random eval -> SFT on 64
gold trajectories -> RL on generated tasks that have no gold, rejection-sampling GRPO
with the preset's 8 SFT steps on SFT's gold after each iteration -> held-out eval). The
control starts from run A's own SFT checkpoint (same weights, optimizer, RNG and gold
data) and continues SFT for as long as run A's RL phase ran (its gold steps included),
then is evaluated on the same held-out tasks: it answers "is RL better than just more
SFT for the same time?". Held-out tasks come from the nano heldout split, disjoint from every
training task by variant key (template, function name or argument names, constant).

Then each model (the random init, run A's SFT checkpoint and RL result, the control) is
measured again on the held-out tasks with ``--eval-attempts`` sampled attempts per task
(default 4: 192 episodes; the runs' own single-attempt evaluations have a standard error
near 0.06, too much to tell +0.1 from +0.2), as an evaluation run of its own under
``--out/seedS-eval/``, with its standard error over tasks and the paired standard error
of RL - SFT. ``--existing`` / ``--existing-control`` measure finished folders.

Prints one row per seed and the mean and spread, and writes ``summary.json`` and
``pass_rate.png`` (held-out pass rate over iterations, per seed) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np


def _rows(out: Path, kind: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _phase_seconds(out: Path) -> dict[str, float]:
    totals: dict[str, float] = {}
    for r in _rows(out, "phase"):
        totals[r["phase"]] = totals.get(r["phase"], 0.0) + r["seconds"]
    it = _rows(out, "iteration")
    totals["rl"] = sum(r["time_rollout"] + r["time_train"] + r["time_sync"] for r in it)
    totals["eval"] = sum(r["time_eval"] for r in _rows(out, "eval"))
    return totals


def run_seed(seed: int, args) -> dict:
    from gyre_env.train import load_config, train

    base = [
        f"schedule.iterations={args.iterations}",
        f"schedule.eval_every={max(1, args.iterations // 2)}",
        *args.set,
        f"seed={seed}",
        "logging.tensorboard=false",
        "schedule.eval_random=true",
    ]
    if args.no_progress:
        base.append("logging.progress=false")
    if seed in args.existing:  # a finished `gyre train --preset P --seed S` run folder
        out = args.existing[seed]
        wall_a = None
    else:
        out = Path(args.out) / f"seed{seed}"
        shutil.rmtree(out, ignore_errors=True)
        cfg = load_config(preset=args.preset, overrides=[*base, f"out={str(out)!r}"])
        start = time.monotonic()
        _finished(train(cfg), out)
        wall_a = time.monotonic() - start
    evals = _rows(out, "eval")
    secs = _phase_seconds(out)

    # The control: run A's SFT checkpoint, SFT continued for as long as A's RL ran.
    if seed in args.existing_control:  # a finished control folder of this run A
        control = args.existing_control[seed]
        wall_c = None
    else:
        control, wall_c = _control(seed, args, base, out, secs)
    sft_steps = len(_rows(out, "sft"))
    control_steps = len(_rows(control, "sft"))
    last = {e["phase"]: e["pass_rate"] for e in evals}
    last["control"] = _rows(control, "eval")[-1]["pass_rate"]
    measured = {}
    if args.eval_attempts:
        from gyre_env.train.setup import prepare_model

        models = {
            "random": prepare_model(load_config(preset=args.preset, overrides=base)),
            "sft": out / "model-sft",
            "rl": out / "model",
            "control": control / "model",
        }
        for phase, model in models.items():
            measured[phase] = _measure(
                args, base, model, Path(args.out) / f"seed{seed}-eval" / phase
            )
    row = {
        "seed": seed,
        "run": str(out),
        **{k: (measured[k]["pass_rate"] if measured else last.get(k)) for k in PHASES},
        "measured": measured,
        "in_run": {k: last.get(k) for k in PHASES},
        "sft_steps": sft_steps,
        "control_sft_steps": control_steps,
        "seconds": secs,
        "wall_run": wall_a,
        "wall_control": wall_c,
        "curve": [(e["iteration"], e["phase"], e["pass_rate"]) for e in evals],
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"seed{seed}.json").write_text(json.dumps(row, indent=1), encoding="utf-8")
    return row


def _control(seed: int, args, base: list[str], out: Path, secs: dict) -> tuple[Path, float]:
    """The control: run A's SFT checkpoint, SFT continued for as long as A's RL ran."""
    from gyre_env.train import load_config, train
    from gyre_env.train.checkpoint import Cursor

    control = Path(args.out) / f"seed{seed}-control"
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir(parents=True)
    shutil.copytree(out / "checkpoint-sft", control / "checkpoints")
    shutil.copy(out / "store.db", control / "store.db")
    shutil.copy(out / "metrics.jsonl", control / "metrics.jsonl")
    _rewind_to_sft(
        control / "checkpoints", Cursor, load_config(preset=args.preset, overrides=base).sft.lr
    )
    ccfg = load_config(
        preset=args.preset,
        overrides=[
            *base,
            f"out={str(control)!r}",
            "schedule.iterations=0",
            f"sft.steps={10**6}",
            f"sft.max_seconds={secs['rl']}",
        ],
    )
    start = time.monotonic()
    _finished(train(ccfg, resume=True), control)
    return control, time.monotonic() - start


class Interrupted(Exception):
    """A run was stopped (Ctrl-C): its checkpoint stands, the benchmark stops."""


def _finished(summary, out: Path) -> None:
    if summary.interrupted:
        raise Interrupted(out)


def _measure(args, base: list[str], model: Path, out: Path) -> dict:
    """Held-out pass rate of ``model``: ``--eval-attempts`` sampled attempts per held-out
    task, as a run of its own under ``out``, with the standard error over tasks (attempts
    of one task are correlated, so the error is that of the per-task means)."""
    from gyre_env.train import load_config
    from gyre_env.train.run import evaluate_heldout

    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(
        preset=args.preset,
        overrides=[*base, f"out={str(out)!r}", f"rollout.eval_attempts={args.eval_attempts}"],
    )
    row = evaluate_heldout(cfg, model, out, "measure")
    attempts: dict[str, list[float]] = {}
    for line in (out / "episodes.jsonl").read_text(encoding="utf-8").splitlines():
        ep = json.loads(line)
        if ep["reward_valid"] and ep["score"] is not None:
            attempts.setdefault(ep["task_id"], []).append(float(ep["score"] >= 1.0))
    per_task = {task: float(np.mean(v)) for task, v in attempts.items()}
    return {
        "pass_rate": row["pass_rate"],
        "stderr": _stderr(list(per_task.values())),
        "per_task": per_task,
        "episodes": row["episodes"],
        "tasks": len(per_task),
        "seconds": row["time_eval"],
    }


def _rewind_to_sft(folder: Path, cursor_cls, sft_lr: float) -> None:
    """Point the copied post-SFT checkpoint back at the SFT phase (steps done kept) and
    its (fresh, RL) optimizer at the SFT learning rate: the control is SFT continued."""
    import torch

    state = torch.load(folder / "ckpt.pt", weights_only=False)
    state["cursor"]["phase"] = "sft_train"
    for group in state["trainer"]["optimizer"]["param_groups"]:
        group["lr"] = sft_lr
    state["trainer"]["scheduler"]["base_lrs"] = [sft_lr] * len(
        state["trainer"]["scheduler"]["base_lrs"]
    )
    torch.save(state, folder / "ckpt.pt")
    (folder / "cursor.json").write_text(json.dumps(state["cursor"]), encoding="utf-8")
    cursor_cls(**state["cursor"])  # still a valid cursor


PHASES = ("random", "sft", "rl", "control")


def _stderr(values) -> float:
    """Standard error of the mean of ``values`` (nan for fewer than two)."""
    v = np.asarray(values, dtype=float)
    return float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def _paired_se(a: dict, b: dict) -> float:
    """Standard error of a - b over the held-out tasks both measured (paired by task)."""
    return _stderr(
        [a["per_task"][t] - b["per_task"][t] for t in a["per_task"] if t in b["per_task"]]
    )


def _fmt(x) -> str:
    return "  -  " if x is None else f"{x:.3f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--out", default="runs/train-cpu-bench")
    p.add_argument(
        "--iterations",
        type=int,
        default=24,
        metavar="N",
        help="RL iterations per run (default 24, the preset's: the README job's 15 "
        "minutes); held-out is also evaluated at N/2",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--existing",
        action="append",
        default=[],
        metavar="SEED=DIR",
        help="use this finished run folder as run A of SEED (only its control runs)",
    )
    p.add_argument(
        "--existing-control",
        action="append",
        default=[],
        metavar="SEED=DIR",
        help="use this finished control folder of SEED's run A (with --existing)",
    )
    p.add_argument(
        "--eval-attempts",
        type=int,
        default=4,
        metavar="N",
        help="measure each model (random, SFT, RL, control) again with N sampled attempts "
        "per held-out task (0: report the runs' own single evaluations)",
    )
    p.add_argument(
        "--table-only",
        action="store_true",
        help="run nothing: print the table of the seed*.json results already under --out",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.eval_attempts < 0:
        p.error(f"--eval-attempts must be >= 0, got {args.eval_attempts}")
    if args.iterations < 1:
        p.error(f"--iterations must be >= 1, got {args.iterations}")
    for flag, attr, needs in (
        ("--existing", "existing", ("metrics.jsonl", "checkpoint-sft", "model-sft", "model")),
        ("--existing-control", "existing_control", ("metrics.jsonl", "model")),
    ):
        folders = {}  # parsed once here: SEED -> folder
        for item in getattr(args, attr):
            seed, sep, folder = item.partition("=")
            if not sep or not seed.lstrip("-").isdigit():
                p.error(f"{flag} {item!r}: expected SEED=DIR")
            missing = [n for n in needs if not (Path(folder) / n).exists()]
            if missing:
                p.error(
                    f"{flag} {item}: {folder} is not a finished run ({', '.join(missing)} missing)"
                )
            folders[int(seed)] = Path(folder)
        setattr(args, attr, folders)
    if args.table_only:
        rows = [json.loads(f.read_text()) for f in sorted(out.glob("seed*.json"))]
    else:
        rows = []
        for seed in args.seeds:
            print(f"== seed {seed}", file=sys.stderr, flush=True)
            try:
                rows.append(run_seed(seed, args))
            except Interrupted as stopped:
                done = ", ".join(f"seed{r['seed']}.json" for r in rows) or "none"
                print(
                    f"interrupted in {stopped}: finished seeds under {out}: {done} "
                    "(print them with --table-only)",
                    file=sys.stderr,
                )
                return 130
    (out / "summary.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    measured = all(r.get("measured") for r in rows)
    how = (
        f"{rows[0]['measured']['sft']['episodes'] // rows[0]['measured']['sft']['tasks']} "
        "sampled attempts per task, measured after the runs; +- standard error over tasks"
        if measured
        else "the runs' own evaluations"
    )
    iters = sorted({max((i for i, ph, _ in r["curve"] if ph == "rl"), default=0) for r in rows})
    print(
        f"\nheld-out nano pass rate (preset {args.preset}, "
        f"{'/'.join(map(str, iters))} RL iterations; {how})"
    )
    print("seed  random    sft     rl   control  rl-sft | wall s: sft_record sft_train   rl  eval")
    for r in rows:
        s = r["seconds"]
        print(
            f"{r['seed']:>4}  {_fmt(r['random'])}  {_fmt(r['sft'])}  {_fmt(r['rl'])}  "
            f"{_fmt(r['control'])}  {r['rl'] - r['sft']:+.3f} | "
            f"{s.get('sft_record', 0):>10.0f} {s.get('sft_train', 0):>9.0f} {s['rl']:>5.0f} "
            f"{s['eval']:>5.0f}"
        )
        if measured:
            m = r["measured"]
            print(
                "  +-"
                + "".join(f"{m[k]['stderr']:>7.3f}" for k in PHASES)
                + f"  {_paired_se(m['rl'], m['sft']):>6.3f}  (standard errors)"
            )
        if r.get("in_run"):
            print(
                "      "
                + "  ".join(_fmt(r["in_run"][k]) for k in PHASES)
                + "  (the runs' own evals)"
            )
    gains = np.array([r["rl"] - r["sft"] for r in rows])
    for key in ("random", "sft", "rl", "control"):
        vals = np.array([r[key] for r in rows if r[key] is not None], dtype=float)
        if len(vals) == 0:
            continue
        note = "" if len(vals) == len(rows) else f"  ({len(vals)} of {len(rows)} seeds measured it)"
        print(f"{key:>8}: mean {vals.mean():.3f}  std {vals.std():.3f}  min {vals.min():.3f}{note}")
    print(f"  rl-sft: mean {gains.mean():+.3f}  min {gains.min():+.3f}")
    print(
        f"target RL - SFT >= 0.15 on average and on every seed: "
        f"{'met' if gains.mean() >= 0.15 and gains.min() >= 0.15 else 'NOT met'}"
    )
    ctl = np.array([r["control"] - r["sft"] for r in rows])
    vs = np.array([r["rl"] - r["control"] for r in rows])
    print(f"control (SFT for RL's wall time) - SFT: mean {ctl.mean():+.3f}")
    print(f"RL - control: mean {vs.mean():+.3f}  min {vs.min():+.3f}")
    _plot(rows, out / "pass_rate.png")
    print(f"summary: {out / 'summary.json'}  plot: {out / 'pass_rate.png'}")
    return 0


def _plot(rows, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        pts = [(it, rate) for it, phase, rate in r["curve"] if phase in ("sft", "rl")]
        line = ax.plot(*zip(*pts, strict=True), marker="o", label=f"seed {r['seed']}")[0]
        c = line.get_color()
        ax.scatter([0], [r["random"]], marker="x", color=c)
        ax.scatter([pts[-1][0]], [r["control"]], marker="s", color=c)
        if r.get("measured"):  # the after-run measurements, with their standard errors
            m = r["measured"]
            ax.errorbar(
                [0, pts[-1][0]],
                [m["sft"]["pass_rate"], m["rl"]["pass_rate"]],
                yerr=[m["sft"]["stderr"], m["rl"]["stderr"]],
                fmt="D",
                color=c,
                capsize=3,
            )
    ax.set_xlabel(
        "RL iteration (line: the run's own evals; diamond: measured after, with std error;\n"
        "0 = SFT checkpoint; x = random model; square = control)"
    )
    ax.set_ylabel("held-out pass rate")
    ax.legend()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
