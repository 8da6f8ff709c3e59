"""Tree packing vs flat sequences: tokens computed, fwd+bwd time and peak memory.

"Flat" is what systems without tree training do: every root-to-leaf path (each branch,
each group member) is its own sequence carrying its full prefix. Both layouts go through
the same model - a random-init Hugging Face Qwen2, the family the engine serves, trained
through ``gyre_env.trainers.hf_tree`` - the same block-sparse CPU attention kernel and the
same loss (``-(w * adv * logprob).sum()``), so the ratios isolate what sharing saves.

Scenarios: synthetic groups sweeping the sharing (0, 25, 50, 75 % of flat tokens that the
tree does not need), an NL2Repo-shaped group (a ~6k-token spec shared by a group of 8,
sub-agent branches starting from the main context halfway through), and, with
``--records``, trees built from real TITO records (a proxy ``JsonlSink`` file).

Peak memory is measured in a fresh subprocess per (scenario, layout): the RSS high-water
mark of the fwd+bwd step above the RSS just before it (the peak is reset via
``/proc/self/clear_refs``), which sees torch's allocations that tracemalloc would not.
Time is measured in one more subprocess that alternates flat and tree steps (so load on
a shared machine falls on both alike) and keeps the best process-CPU time of each; it
then compares the logprobs of every loss token between the two layouts.

    python benchmarks/tree_packing.py                 # all synthetic scenarios, small (~2 min)
    python benchmarks/tree_packing.py --full          # the full sizes (long: tens of minutes)
    python benchmarks/tree_packing.py --records calls.jsonl --episodes episodes.jsonl

A progress line per scenario and step goes to stderr; the table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SCENARIOS = ("share0", "share25", "share50", "share75", "nl2repo")
SIZES = {  # option: (default, with --full)
    "path_len": (512, 2048),
    "spec_len": (1500, 6000),
    "main_tokens": (500, 2000),
    "sub_tokens": (250, 1000),
    "repeats": (1, 2),
}


def _units(args, name: str):
    from gyre_env.trajectory.sampling import SampleConfig, bounded_samples
    from gyre_env.trajectory.synthetic import nl2repo_group, sharing_group
    from gyre_env.trajectory.tree import build_trees, trees_from_jsonl

    if name == "records":
        trees = trees_from_jsonl(args.records, args.episodes)
    elif name == "nl2repo":
        trees = build_trees(
            *nl2repo_group(
                spec_len=args.spec_len,
                group_size=8,
                main_tokens=args.main_tokens,
                sub_tokens=args.sub_tokens,
                turns=8,
                vocab=args.vocab,
            )
        )
    else:
        sharing = int(name.removeprefix("share")) / 100
        trees = build_trees(
            *sharing_group(sharing, group_size=8, path_len=args.path_len, vocab=args.vocab)
        )
    units, _ = bounded_samples(trees, SampleConfig(token_budget=args.budget))
    return trees, units


def _model(args, vocab: int):
    from gyre_env.trainers.hf_tree import tiny_qwen2

    return tiny_qwen2(
        vocab_size=vocab,
        hidden_size=args.d_model,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=3 * args.d_model,
    )


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _step(model, packed, layouts, norm) -> tuple[float, float]:
    """One fwd+bwd over the packed units: (wall seconds, process CPU seconds)."""
    from gyre_env.trainers.hf_tree import tree_logprobs

    t0, c0 = time.perf_counter(), time.process_time()
    for p, layout in zip(packed, layouts, strict=True):
        batch = p.tensors()
        lp, _ = tree_logprobs(model, batch, layout)
        sel = batch["loss_mask"]
        loss = -(batch["weights"][sel] * batch["advantages"][sel] * lp).sum() / norm
        loss.backward()
    return time.perf_counter() - t0, time.process_time() - c0


def _prepare(args, flat: bool):
    import torch
    from gyre_env.trainers.tree_attention import TreeBlockLayout

    from gyre_env.trajectory.packing import pack

    torch.set_num_threads(args.threads)
    trees, units = _units(args, args.measure)
    packed = [pack(u, flat=flat) for u in units]
    layouts = [TreeBlockLayout(p.parent_index, args.block_size) for p in packed]
    return trees, units, packed, layouts


def measure_memory(args) -> dict:
    """Fresh process, one layout: RSS high-water of the first fwd+bwd above the RSS before it."""
    import torch

    trees, units, packed, layouts = _prepare(args, flat=args.layout == "flat")
    vocab = _vocab(args, units)
    model = _model(args, vocab)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # gradient buffers exist in both layouts before the step
    norm = float(sum(p.num_loss_tokens for p in packed))
    before = _rss_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the RSS high-water mark (VmHWM)
        peak_field = "VmHWM"
    except OSError:
        peak_field = "maxrss"
    _step(model, packed, layouts, norm)
    peak = _rss_kib(peak_field) - before
    return {
        "tokens": int(sum(len(p) for p in packed)),
        "loss_tokens": int(norm),
        "pairs": int(sum(layout.pairs for layout in layouts)),
        "macs": _forward_macs(args, vocab, packed, layouts),
        "peak_mib": peak / 1024,
        "units": len(units),
        "sharing": sum(t.flat_tokens - t.num_tokens for t in trees)
        / max(1, sum(t.flat_tokens for t in trees)),
    }


def measure_time(args) -> dict:
    """One process, both layouts, steps interleaved flat/tree so load on a shared machine
    hits both alike; best of ``repeats + 1`` each. Then the exactness check."""
    _, units, flat_p, flat_l = _prepare(args, flat=True)
    _, _, tree_p, tree_l = _prepare(args, flat=False)
    model = _model(args, _vocab(args, units))
    norm = float(sum(p.num_loss_tokens for p in flat_p))
    runs: dict[str, list] = {"flat": [], "tree": []}
    for _ in range(args.repeats + 1):
        runs["flat"].append(_step(model, flat_p, flat_l, norm))
        runs["tree"].append(_step(model, tree_p, tree_l, norm))
    out = {
        f"{k}_{what}": min(t[i] for t in v)
        for k, v in runs.items()
        for i, what in enumerate(("wall_s", "cpu_s"))
    }
    if not args.no_exactness:
        out["max_abs_diff"] = _exactness(model, units, args)
    return out


def _vocab(args, units) -> int:
    top = max(
        int(n.tokens.max())
        for u in units
        for part in u.parts
        for n in (part.tree.nodes[i] for i in part.nodes)
    )
    return max(args.vocab, top + 1)


def _forward_macs(args, vocab: int, packed, layouts) -> int:
    """Multiply-accumulates of one forward: linear layers per token, attention per
    (query, key) pair the kernel computes, LM head per loss token."""
    d, ff = args.d_model, 3 * args.d_model
    kv = d * args.kv_heads // args.heads  # width of k and v (grouped-query attention)
    tokens = sum(len(p) for p in packed)
    pairs = sum(layout.pairs for layout in layouts)
    loss = sum(p.num_loss_tokens for p in packed)
    return (
        args.layers * (tokens * (2 * d * d + 2 * d * kv + 3 * d * ff) + pairs * 2 * d)
        + loss * d * vocab
    )


def _exactness(model, units, args) -> float:
    """Largest |tree - flat| logprob over every loss token (same key: tree, node, depth)."""
    import numpy as np
    import torch
    from gyre_env.trainers.hf_tree import tree_logprobs
    from gyre_env.trainers.tree_attention import TreeBlockLayout

    from gyre_env.trajectory.packing import pack

    worst = 0.0
    with torch.no_grad():
        for unit in units:
            lp = {}
            for flat in (False, True):
                p = pack(unit, flat=flat)
                vals, _ = tree_logprobs(
                    model, p.tensors(), TreeBlockLayout(p.parent_index, args.block_size)
                )
                idx = np.flatnonzero(p.loss_mask)
                keys = zip(p.tree_index[idx], p.node_ids[idx], p.position_ids[idx], strict=True)
                lp[flat] = dict(zip(keys, vals.tolist(), strict=True))
            worst = max([worst] + [abs(lp[False][k] - v) for k, v in lp[True].items()])
    return worst


def _run_child(args, name: str, layout: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", name, "--layout", layout]
    for key in ("records", "episodes"):
        if getattr(args, key):
            cmd += [f"--{key}", getattr(args, key)]
    for key in (
        "budget",
        "d_model",
        "layers",
        "heads",
        "kv_heads",
        "vocab",
        "block_size",
        "repeats",
        "path_len",
        "spec_len",
        "main_tokens",
        "sub_tokens",
        "threads",
    ):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    if args.no_exactness:
        cmd.append("--no-exactness")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{name}/{layout} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for key, (small, full) in SIZES.items():
        if getattr(args, key) is None:
            setattr(args, key, full if args.full else small)
    if args.kv_heads is None:
        args.kv_heads = args.heads // 2 if args.heads % 2 == 0 else args.heads
    if args.measure:
        fn = measure_time if args.layout == "both" else measure_memory
        print(json.dumps(fn(args)))
        return 0
    names = list(args.scenarios) + (["records"] if args.records else [])
    print(
        f"Qwen2 (random init) d={args.d_model} layers={args.layers} heads={args.heads} "
        f"kv_heads={args.kv_heads}; {'full' if args.full else 'small (--full for all)'} sizes; "
        f"block {args.block_size}; threads {args.threads}; best of {args.repeats + 1} steps\n"
        "mac x: ratio of forward multiply-adds (linear + attention pairs + LM head); "
        "cpu: process CPU seconds of one fwd+bwd (flat and tree steps interleaved);\n"
        "wall x: wall-clock ratio; "
        "MiB: RSS high-water of the step above the RSS before it"
    )
    head = (
        f"{'scenario':<10}{'sharing':>8}{'flat tok':>10}{'tree tok':>10}{'tok x':>7}{'mac x':>7}"
        f"{'flat cpu':>9}{'tree cpu':>9}{'cpu x':>7}{'wall x':>7}{'flat MiB':>10}{'tree MiB':>10}"
        f"{'mem x':>7}{'max|dlp|':>10}"
    )
    print(head)
    results = {}
    start = time.perf_counter()
    for i, name in enumerate(names, 1):
        run = {}
        for layout, what in (("flat", "flat memory"), ("tree", "tree memory"), ("both", "time")):
            _progress(f"[{i}/{len(names)}] {name}: {what} ...", start)
            run[layout] = _run_child(args, name, layout)
        flat, tree, timing = run["flat"], run["tree"], run["both"]
        results[name] = {"flat": flat, "tree": tree, "time": timing}
        print(
            f"{name:<10}{tree['sharing']:>8.1%}{flat['tokens']:>10}{tree['tokens']:>10}"
            f"{tree['tokens'] / flat['tokens']:>7.2f}{tree['macs'] / flat['macs']:>7.2f}"
            f"{timing['flat_cpu_s']:>9.2f}{timing['tree_cpu_s']:>9.2f}"
            f"{timing['tree_cpu_s'] / timing['flat_cpu_s']:>7.2f}"
            f"{timing['tree_wall_s'] / timing['flat_wall_s']:>7.2f}"
            f"{flat['peak_mib']:>10.0f}{tree['peak_mib']:>10.0f}"
            f"{tree['peak_mib'] / flat['peak_mib']:>7.2f}"
            f"{timing.get('max_abs_diff', float('nan')):>10.1e}",
            flush=True,
        )
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


def _progress(msg: str, start: float) -> None:
    print(f"{time.perf_counter() - start:7.1f}s {msg}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--records", help="proxy JsonlSink file of CallRecords (real runs)")
    p.add_argument("--episodes", help="JSONL of EpisodeInfo for those records (groups, rewards)")
    p.add_argument("--budget", type=int, default=1 << 20, help="token budget per training unit")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, help="key/value heads (default: half the heads)")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--full", action="store_true", help="full sizes (sizes not given below)")
    p.add_argument("--repeats", type=int, help="extra timed steps after the first (1; full 2)")
    p.add_argument("--path-len", type=int, help="path length of sharing scenarios (512; 2048)")
    p.add_argument("--spec-len", type=int, help="NL2Repo shared spec tokens (1500; 6000)")
    p.add_argument("--main-tokens", type=int, help="NL2Repo main-branch tokens (500; 2000)")
    p.add_argument("--sub-tokens", type=int, help="NL2Repo sub-agent tokens (250; 1000)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1 keeps CPU time meaningful on a shared machine)",
    )
    p.add_argument("--no-exactness", action="store_true", help="skip the logprob comparison")
    p.add_argument("--json-out", help="also write the raw figures here")
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--layout", choices=("tree", "flat", "both"), help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    sys.exit(main())
