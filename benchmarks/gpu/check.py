"""Every GPU check of issue 35 in one process tree: one line per check (figure, target,
PASS/FAIL), then the exit status (1 if any FAIL).

    python benchmarks/gpu/check.py --out /tmp/gpu-check           # one H200: ~8 min
    python benchmarks/gpu/check.py --smoke --out /tmp/gpu-smoke   # the script itself, on CPU

Each check runs as its own process with its own time limit, so one that hangs or dies
(out of memory, a CUDA fault) is a FAIL line and the rest still run; their full output is
kept in ``OUT/<check>.log``. The checks:

- ``copy floors``: pinned host <-> device, pageable device -> host and host -> device,
  device -> device, GB/s over ``--copy-gb`` of bf16 (what a role switch is held to);
- ``switch``: ``benchmarks/cell_switch.py --size 1.5b --dtype bfloat16``, 8 requests in
  flight, median round trip (target <= 2 s) and the trainer state's GB/s in each moving
  phase (target: at least half the pinned floor, i.e. not pageable speed);
- ``megatron``: ``benchmarks/gpu/megatron_check.py --size 1.5b``, one line per check it
  makes (forward vs HF, train step, weights, offload/onload, tokens/s vs torch);
- ``tree vs flat``: ``benchmarks/train_throughput.py`` on the 1.5B shape in bf16, the
  speed-up over the ideal token ratio (target >= 0.7);
- ``gyre train``: the cpu-demo preset for ``--iterations`` on the GPU;
- ``gyre train --elastic --cells 2``: the same with both cells on the one device; its
  switch phases and busy fractions from ``elastic.json``;
- ``engine``: the embedded engine's tokens/s at batch 1 and 8 on the 1.5B shape.

Nothing downloads: the 1.5B model is random-init, built on the machine (``--smoke``: the
tiny shape, CPU, the GPU-only checks skipped).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
SWITCH_TARGET_S = 2.0
TREE_TARGET = 0.7


class Checks:
    """The lines printed so far; ``line`` prints one."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def line(self, name: str, ok: bool | None, figure: str, target: str = "") -> None:
        status = "INFO" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append((status, name, figure))
        tail = f" (target {target})" if target else ""
        print(f"{status:4} {name}: {figure}{tail}", flush=True)


def log_name(name: str) -> str:
    return f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}.log"


def run(name: str, cmd: list[str], out: Path, timeout_s: float) -> tuple[int | None, str, str]:
    """``cmd``'s exit status (None: past ``timeout_s``), its stdout, and what to say if
    no figure comes of it (its last stderr line, else its last stdout line, and the log);
    both streams go to ``out/<name>.log`` (``log_name``)."""
    log = out / log_name(name)
    start = time.perf_counter()
    print(f"  $ {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    wall = time.perf_counter() - start
    log.write_text(f"$ {' '.join(cmd)}\n# exit {code}, {wall:.0f} s\n{stdout}\n{stderr}")
    if code is None:
        return code, stdout, f"timed out; see {log.name}"
    last = [x.strip() for x in (stderr.strip() or stdout.strip()).splitlines() if x.strip()]
    return code, stdout, f"exit {code}: {last[-1] if last else 'no output'}; see {log.name}"


# ---- copy floors (run in a child: python check.py --copy-floors GB) ----------------------
def copy_floors(gb: float) -> dict[str, float]:
    """GB/s of each copy a switch can make, over ``gb`` GB of bf16 (median of 3)."""
    import statistics

    import torch

    n = int(gb * 1e9 / 2)
    dev = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.bfloat16)
    other = torch.empty_like(dev)

    def rate(fn) -> float:
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return n * 2 / 1e9 / statistics.median(times)

    return {
        "pinned h2d": rate(lambda: dev.copy_(pinned, non_blocking=True)),
        "pinned d2h": rate(lambda: pinned.copy_(dev, non_blocking=True)),
        "pageable h2d": rate(lambda: dev.copy_(pageable)),
        "pageable d2h": rate(lambda: pageable.copy_(dev)),
        "d2d": rate(lambda: other.copy_(dev)),
    }


def check_copy_floors(c: Checks, args, out: Path) -> dict[str, float]:
    code, stdout, why = run(
        "copy floors", [sys.executable, __file__, "--copy-floors", str(args.copy_gb)], out, 120
    )
    try:
        floors = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        c.line("copy floors", False, why)
        return {}
    c.line("copy floors", None, ", ".join(f"{k} {v:.1f} GB/s" for k, v in floors.items()))
    return floors


# ---- the checks that run other scripts --------------------------------------------------
def check_switch(c: Checks, args, out: Path, floors: dict) -> None:
    size = "tiny" if args.smoke else "1.5b"
    rounds = "1" if args.smoke else "3"  # --smoke checks the script, not the figure
    cmd = [sys.executable, str(BENCH / "cell_switch.py"), "--size", size, "--rounds", rounds]
    cmd += ["--dtype", "float32" if args.smoke else "bfloat16"]
    code, stdout, why = run("switch", cmd, out, args.timeout)
    trip = re.search(r"round trip \(both switches\): ([\d.]+) ms", stdout)
    if not trip:
        c.line(f"switch round trip ({size})", False, why)
        return
    phases = " | ".join(x for x in stdout.splitlines() if x.startswith("-> "))
    s = float(trip.group(1)) / 1e3
    c.line(f"switch round trip ({size})", s <= SWITCH_TARGET_S, f"{s:.2f} s; {phases}",
           f"<= {SWITCH_TARGET_S:g} s")  # fmt: skip
    floor = floors.get("pinned d2h")
    for phase, gbs in re.findall(r"^(\w+): trainer state at ([\d.]+) GB/s", stdout, re.M):
        if floor:
            ok = float(gbs) >= 0.5 * floor
            c.line(f"switch {phase} copy rate", ok, f"{gbs} GB/s, {float(gbs) / floor:.2f} of the pinned floor",
                   ">= 0.5 of the pinned floor")  # fmt: skip
        else:
            c.line(f"switch {phase} copy rate", None, f"{gbs} GB/s")


def check_megatron(c: Checks, args, out: Path) -> None:
    cmd = [sys.executable, str(HERE / "megatron_check.py"), "--size", "1.5b"]
    code, stdout, why = run("megatron", cmd, out, args.timeout)
    found = re.findall(r"^(PASS|FAIL)\s+(.+?): (.*)$", stdout, re.M)
    for status, name, note in found:
        c.line(f"megatron {name}", status == "PASS", note)
    if not found or code not in (0, 1):
        c.line("megatron_check.py", False, why)


def check_tree(c: Checks, args, out: Path, model: str | None) -> None:
    repeats = "1" if args.smoke else "3"
    cmd = [sys.executable, str(BENCH / "train_throughput.py"), "--repeats", repeats]
    cmd += ["--device", "cpu", "--groups", "2"] if args.smoke else ["--device", "cuda"]
    cmd += ["--dtype", "float32" if args.smoke else "bfloat16"]
    if model:
        cmd += ["--model", model]
    code, stdout, why = run("tree vs flat", cmd, out, args.timeout)
    tokens = dict(re.findall(r"^\s*(tree|flat)\s+(\d+)\s", stdout, re.M))
    speed = re.search(r"speed-up ([\d.]+)x", stdout)
    if not speed or set(tokens) != {"tree", "flat"}:
        c.line("tree vs flat", False, why)
        return
    ideal = int(tokens["flat"]) / int(tokens["tree"])
    got = float(speed.group(1))
    c.line("tree vs flat", got >= TREE_TARGET * ideal,
           f"{got:.2f}x of an ideal {ideal:.2f}x ({got / ideal:.2f}); sharing {1 - 1 / ideal:.0%}",
           f">= {TREE_TARGET:g} of the ideal")  # fmt: skip


def _train_cmd(args, out: Path, elastic: bool) -> list[str]:
    cmd = [sys.executable, "-m", "gyre_env.cli", "train", "--preset", "cpu-demo", "--out", str(out)]
    cmd += ["--iterations", str(args.iterations), "--no-progress"]
    if elastic:
        cmd += ["--elastic", "--cells", "2"]
    for kv in args.set:
        cmd += ["--set", kv]
    return cmd


def check_train(c: Checks, args, out: Path) -> None:
    for elastic in (False, True):
        name = "gyre train --elastic --cells 2" if elastic else "gyre train"
        folder = out / ("train-elastic" if elastic else "train")
        shutil.rmtree(folder, ignore_errors=True)  # this script's own run from before
        code, stdout, why = run(name, _train_cmd(args, folder, elastic), out, args.timeout)
        if code != 0:
            c.line(name, False, why)
            continue
        if not elastic:
            c.line(name, True, f"{args.iterations} iterations; {folder}")
            continue
        try:
            result = json.loads((folder / "elastic.json").read_text())
        except (OSError, ValueError) as e:
            c.line(name, False, f"no elastic.json ({e})")
            continue
        cells = result.get("cells") or {}
        busy = [f"cell {i} {f.get('busy', 0):.2f}" for i, f in sorted(cells.items())]
        switches = result.get("switches") or []
        phases = {}
        for sw in switches:
            for p, s in (sw.get("phases") or {}).items():
                phases.setdefault((sw.get("to"), p), []).append(s)
        parts = [f"{to}.{p} {1e3 * sum(v) / len(v):.0f} ms" for (to, p), v in phases.items()]
        c.line(name, True, f"{len(switches)} switches ({', '.join(parts) or 'none'}); "
               f"busy {', '.join(busy)}")  # fmt: skip


def check_engine(c: Checks, args, out: Path, model: str | None) -> None:
    cmd = [sys.executable, str(BENCH / "engine_throughput.py"), "--json", "--repeats", "2"]
    if model:
        cmd += ["--model-path", model]
    code, stdout, why = run("engine", cmd, out, args.timeout)
    try:
        result = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        c.line("engine tokens/s", False, why)
        return
    c.line("engine tokens/s", None, json.dumps(result)[:300])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/gpu-check")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: the script itself")
    p.add_argument("--timeout", type=float, default=240, help="seconds per check")
    p.add_argument("--iterations", type=int, default=2, help="gyre train's RL iterations")
    p.add_argument("--copy-gb", type=float, default=4.0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="to both gyre train runs (--smoke: a shorter preset unless given)")  # fmt: skip
    p.add_argument("--only", nargs="*", help="check names: copy switch megatron tree train engine")
    p.add_argument("--copy-floors", type=float, help=argparse.SUPPRESS)  # the child's part
    args = p.parse_args(argv)
    if args.copy_floors is not None:
        print(json.dumps(copy_floors(args.copy_floors)))
        return 0
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            p.error(
                "no CUDA device here: this script is for a GPU machine (--smoke runs it on CPU)"
            )
    if args.smoke and not args.set:  # the preset's 400 SFT steps take minutes on a CPU
        args.set = ["sft.steps=10", "tasks.heldout_count=4"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    want = set(args.only or ("copy", "switch", "megatron", "tree", "train", "engine"))
    c = Checks()
    start = time.perf_counter()
    floors = check_copy_floors(c, args, out) if "copy" in want and not args.smoke else {}
    model = None
    if not args.smoke and want & {"tree", "engine"}:
        sys.path.insert(0, str(HERE))
        from megatron_check import random_model

        model = random_model("1.5b", tempfile.mkdtemp(prefix="gyre-1.5b-"))
    if "switch" in want:
        check_switch(c, args, out, floors)
    if "megatron" in want and not args.smoke:
        check_megatron(c, args, out)
    if "tree" in want:
        check_tree(c, args, out, model)
    if "train" in want:
        check_train(c, args, out)
    if "engine" in want:
        check_engine(c, args, out, model)
    failed = sum(s == "FAIL" for s, *_ in c.rows)
    print(f"{len(c.rows)} lines, {failed} FAIL, {time.perf_counter() - start:.0f} s; logs in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
