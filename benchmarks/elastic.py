"""Gyre's waterlevel policy against colocated synchronous, static 1+1 and async 1+1, on real cells.

The same workload and number of RL steps under each policy object (the ones
``gyre simulate`` drives), run by the elastic driver on two cells of this machine (two
embedded engines behind the proxy, two torch trainers; cell 0 the core). Agents are chat
sessions whose tool calls wait (``--tool-delay`` seconds each, injected: a real tool on
this CPU would compete with the cells for the same cores). Prints wall time, cell busy
fraction, idle fraction, switches, mean sample staleness, and the ratio of waterlevel's
throughput to the best peer's.

    python benchmarks/elastic.py [--steps 6] [--tool-delay 1.0] [--tool-jitter 0.5]
        [--groups-per-step 3] [--group-size 8] [--max-tokens 64] [--slots N] [--repeats 1]
        [--changing-load] [--waterlevel NAME=VALUE ...]

``--changing-load`` (issue 37's mode; run it with ``--repeats 3``: the ratio of the median
wall times, in one process): bursts of short tasks between stretches of long ones
(``changing_phases``), the waterlevel's target 1.2x the best peer.

Every policy's steps train the same number of groups (``--max-batch-growth 1``: with the
policy's default of 2, waterlevel's grown steps at low load train more groups per step, so
the same number of steps would not be the same work; its groups trained per second are
printed either way). Every call waits its own tool delay (``--tool-jitter``, mean
``--tool-delay``, the same per session and turn under every policy): with one fixed delay the agents that start
together stay in lockstep, all calling and then all waiting. Wall time runs from the
start to the last step; the groups still running then are dropped. Each cell's busy and
idle time is printed with its idle reasons (the driver's, see ``gyre_env.scheduler.driver``).
The default size (3 groups of 8 episodes per step, 64 tokens a call) keeps, under the
staleness bound, enough agents in flight that a rollout cell has calls to serve while
most agents wait on their tools; smaller, every policy's rollout cells idle in the gaps
(``agents_in_tools``) whatever the split.
"""

from __future__ import annotations

import argparse


def _policies(args):
    from gyre_env.scheduler.peers import (
        AsyncStalenessPolicy,
        ColocatedSyncPolicy,
        StaticSplitPolicy,
    )
    from gyre_env.scheduler.policy import WaterlevelPolicy

    return {
        "colocated": ColocatedSyncPolicy,
        "static 1+1": lambda: StaticSplitPolicy(rollout_cells=1),
        "async 1+1": lambda: AsyncStalenessPolicy(rollout_cells=1),
        "waterlevel": lambda: WaterlevelPolicy(
            **{"max_batch_growth": args.max_batch_growth, **dict(args.waterlevel_settings)}
        ),
    }


def changing_phases(args) -> list:
    """``--changing-load``: a burst of short tasks (one turn, tools a quarter as long) for
    one step's groups, then twice the step's groups of long ones (twice the turns, tools
    one and a half times as long), repeating: the rollout demand per trained group moves
    about sixfold between them, so no fixed split of the two cells fits both."""
    from gyre_env.scheduler.chat_workload import ToolLoopPhase

    g = args.groups_per_step
    return [
        ToolLoopPhase(groups=g, turns=1, tool_scale=0.25),
        ToolLoopPhase(groups=2 * g, turns=2 * args.turns, tool_scale=1.5),
    ]


def run_one(name, make_policy, args, model_dir, tokenizer) -> dict:
    from gyre_env.scheduler.chat_workload import RecordBook, ToolLoopConfig, ToolLoopWorkload
    from gyre_env.scheduler.driver import ElasticConfig, ElasticDriver
    from gyre_env.scheduler.local_cells import LocalCells, LocalCellsConfig

    policy = make_policy()
    book = RecordBook()
    roles = policy.initial_roles(2) if hasattr(policy, "initial_roles") else None
    cells_cfg = LocalCellsConfig(cells=2, max_batch_size=16, switch_prior_s=args.switch_prior)
    with LocalCells(model_dir, tokenizer, cells_cfg, sink=book).open(roles) as pool:
        workload = ToolLoopWorkload(
            pool.proxy.openai_base_url,
            book,
            ToolLoopConfig(
                group_size=args.group_size, turns=args.turns, tool_delay_s=args.tool_delay,
                tool_jitter=args.tool_jitter, max_tokens=args.max_tokens,
                phases=changing_phases(args) if args.changing_load else [],
            ),
        )  # fmt: skip
        config = ElasticConfig(
            steps=args.steps, groups_per_step=args.groups_per_step, agent_slots=args.slots,
            staleness_bound=args.staleness, steps_per_iteration=1,
        )  # fmt: skip
        driver = ElasticDriver(
            pool.cells, policy, workload, call=pool.proxy.call, router=pool.proxy.core.router,
            config=config, clock=book.clock, costs=pool.costs,
        )  # fmt: skip
        result = driver.run()
    if args.trace_out:
        _write_trace(args, name, policy, cells_cfg, config, workload, result)
    wall = result.wall_s  # start to the last step (the groups still running are dropped)
    lag_tokens = sum(result.staleness.values())
    mean_lag = sum(k * v for k, v in result.staleness.items()) / lag_tokens if lag_tokens else 0.0
    return {
        "policy": name,
        "wall_s": wall,
        "steps": len(result.steps),
        "busy": [result.busy_fraction(i) for i in range(2)],
        "idle": result.idle_fraction(),
        "switches": len(result.switches),
        "switch_ms": [round(r.total_s * 1e3, 1) for r in result.switches[:4]],
        "staleness": mean_lag,
        "groups": result.groups_run,
        "trained": sum(int(s["groups"]) for s in result.steps),
        "cells": [result.cell_fractions(i) for i in range(2)],
    }


def _write_trace(args, name, policy, cells_cfg, config, workload, result) -> None:
    """The run as the simulator's input (``gyre_env.sim.trace``)."""
    from pathlib import Path

    from gyre_env.sim.trace import write_elastic_trace

    write_elastic_trace(
        Path(args.trace_out) / name.replace(" ", "").replace("+", "-"), policy=policy,
        label=name, cells=cells_cfg.cells, max_batch_size=cells_cfg.max_batch_size,
        switch_prior_s=cells_cfg.switch_prior_s, config=config, group_size=args.group_size,
        result=result, groups=workload.trace,
    )  # fmt: skip


def _cell_line(f: dict) -> str:
    """One cell's share of its time: busy by role, switching, idle and its reasons."""
    reasons = [
        f"{k.split('idle:')[-1]} {v:.2f}" for k, v in f.items() if "idle:" in k and v >= 0.005
    ]
    return (
        f"rollout {f.get('rollout_busy', 0):.2f}  training {f.get('training_busy', 0):.2f}  "
        f"switching {f.get('switching', 0):.2f}  idle {f.get('idle', 0):.2f} "
        f"({', '.join(reasons) or '-'})"
    )


def _ratio_line(by: dict[str, dict], prefix: str) -> None:
    """Waterlevel's throughput over the best peer's: steps (the inverse ratio of wall
    times for the same steps) and groups trained per second (its grown steps train more
    groups in those steps)."""
    if "waterlevel" in by and len(by) > 1:
        best = min((n for n in by if n != "waterlevel"), key=lambda n: by[n]["wall_s"])
        ratio = by[best]["wall_s"] / by["waterlevel"]["wall_s"]
        rate = {n: by[n]["trained"] / by[n]["wall_s"] for n in by}
        most = max((n for n in by if n != "waterlevel"), key=rate.get)
        print(
            f"{prefix}waterlevel vs best peer ({best}): {ratio:.2f}x throughput in steps; "
            f"groups trained per second {rate['waterlevel'] / rate[most]:.2f}x ({most})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups-per-step", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tool-delay", type=float, default=1.0, help="seconds per tool call")
    parser.add_argument(
        "--tool-jitter", type=float, default=0.5,
        help="each tool call waits tool-delay x U(1 - j, 1 + j), fixed per session and turn",
    )  # fmt: skip
    parser.add_argument(
        "--slots", type=int, default=None,
        help="groups running at once (default: all the staleness bound admits, plus the "
        "groups a grown waterlevel step takes beyond its batch: (staleness + 2) x "
        "groups-per-step)",
    )  # fmt: skip
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--switch-prior", type=float, default=0.1)
    parser.add_argument(
        "--max-batch-growth", type=float, default=1.0,
        help="waterlevel's: a step takes up to this many batches of ready groups at low load "
        "(default 1: every policy's steps train the same groups_per_step groups, so that the "
        "same number of steps is the same work; the policy's own default is 2)",
    )  # fmt: skip
    parser.add_argument(
        "--changing-load", action="store_true",
        help="a load whose demand changes: bursts of one-turn tasks with short tools between "
        "stretches of long ones (twice the turns, tools 1.5x as long); see changing_phases",
    )  # fmt: skip
    parser.add_argument(
        "--waterlevel", action="append", default=[], metavar="NAME=VALUE",
        help="a WaterlevelPolicy setting for its run (repeatable; the value read as TOML, "
        "checked as a [policies.waterlevel] table is), e.g. admit_ahead_batches=1",
    )  # fmt: skip
    parser.add_argument("--only", nargs="*", help="policy names to run")
    parser.add_argument(
        "--repeats", type=int, default=1,
        help="run the policies this many times, interleaved (so that a drift in the "
        "machine's load hits each alike); ratios of the median wall times",
    )  # fmt: skip
    parser.add_argument(
        "--trace-out", default=None,
        help="write each policy's run as simulator input to DIR/<policy>/elastic-trace.json "
        "(predict them with benchmarks/simulator_validation.py DIR/*)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    from waterlevel_nonstationary import waterlevel_settings  # this script's folder

    args.waterlevel_settings = waterlevel_settings(args.waterlevel) or ()
    if args.slots is None:
        args.slots = (args.staleness + 2) * args.groups_per_step

    from gyre_env.engines.tiny import load_tokenizer, tiny_model_path

    model_dir = tiny_model_path()
    tokenizer = load_tokenizer(model_dir)
    print(
        f"2 cells (tiny Qwen2, CPU); {args.steps} steps x {args.groups_per_step} groups of "
        f"{args.group_size} episodes x {args.turns} turns; injected tool delay "
        f"{args.tool_delay:g}s per call (x U(1 +- {args.tool_jitter:g})); {args.slots} groups "
        "at once; wall: start to the last step"
    )
    if args.changing_load:
        print(
            "changing load, repeating: "
            + "; ".join(
                f"{p.groups} groups of {p.turns} turns, tools x{p.tool_scale:g}"
                for p in changing_phases(args)
            )
        )
    if args.waterlevel_settings:
        print("waterlevel: " + ", ".join(f"{k} = {v}" for k, v in args.waterlevel_settings))
    runs: list[dict[str, dict]] = []
    for repeat in range(args.repeats):
        if args.repeats > 1:
            print(f"-- repeat {repeat + 1} of {args.repeats}", flush=True)
        by = {}
        for name, make in _policies(args).items():
            if args.only and name not in args.only:
                continue
            r = by[name] = run_one(name, make, args, model_dir, tokenizer)
            print(
                f"{r['policy']:>11}: wall {r['wall_s']:6.1f}s  steps {r['steps']}  busy "
                f"{r['busy'][0]:.2f}/{r['busy'][1]:.2f}  idle {r['idle']:.3f}  switches "
                f"{r['switches']} {r['switch_ms']}  staleness {r['staleness']:.2f}  "
                f"groups {r['groups']} (trained {r['trained']}: "
                f"{r['trained'] / r['wall_s']:.2f}/s)",
                flush=True,
            )
            for i, f in enumerate(r["cells"]):
                print(f"{'':>13}cell {i}: {_cell_line(f)}", flush=True)
        runs.append(by)
        _ratio_line(by, "")
    if args.repeats > 1:
        import statistics

        median = {
            name: {
                key: statistics.median(run[name][key] for run in runs)
                for key in ("wall_s", "idle", "trained")
            }
            for name in runs[0]
        }
        for name, m in median.items():
            print(
                f"{name:>11}: median wall {m['wall_s']:6.1f}s  idle {m['idle']:.3f}  "
                f"trained {m['trained']:g} groups"
            )
        _ratio_line(median, f"median of {args.repeats} runs: ")
    if args.trace_out:
        print(
            f"traces in {args.trace_out}; simulate them: "
            f"python benchmarks/simulator_validation.py {args.trace_out}/*"
        )


if __name__ == "__main__":
    main()
