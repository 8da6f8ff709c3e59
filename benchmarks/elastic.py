"""Colocated synchronous vs a static 1+1 split vs Gyre's waterlevel policy, on real cells.

The same workload and number of RL steps under each policy object (the ones
``gyre simulate`` drives), run by the elastic driver on two cells of this machine (two
embedded engines behind the proxy, two torch trainers; cell 0 the core). Agents are chat
sessions whose tool calls wait (``--tool-delay`` seconds each, injected: a real tool on
this CPU would compete with the cells for the same cores). Prints wall time, cell busy
fraction, idle fraction, switches, mean sample staleness, and the ratio of waterlevel's
throughput to the best peer's.

    python benchmarks/elastic.py [--steps 6] [--tool-delay 1.0] [--groups-per-step 2]
"""

from __future__ import annotations

import argparse
import time


def _policies(args):
    from gyre_env.scheduler.peers import ColocatedSyncPolicy, StaticSplitPolicy
    from gyre_env.scheduler.policy import WaterlevelPolicy

    return {
        "colocated": ColocatedSyncPolicy,
        "static 1+1": lambda: StaticSplitPolicy(rollout_cells=1),
        "waterlevel": WaterlevelPolicy,
    }


def run_one(name, make_policy, args, model_dir, tokenizer) -> dict:
    from gyre_env.scheduler.elastic import ElasticConfig, ElasticDriver
    from gyre_env.scheduler.local import LocalCells, LocalCellsConfig
    from gyre_env.scheduler.workloads import RecordBook, ToolLoopConfig, ToolLoopWorkload

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
                max_tokens=args.max_tokens,
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
        t0 = time.monotonic()
        result = driver.run()
        wall = time.monotonic() - t0
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
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--tool-delay", type=float, default=1.0, help="seconds per tool call")
    parser.add_argument("--slots", type=int, default=6, help="groups running at once")
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--switch-prior", type=float, default=0.1)
    parser.add_argument("--only", nargs="*", help="policy names to run")
    args = parser.parse_args(argv)

    from gyre_env.engines.tiny import load_tokenizer, tiny_model_path

    model_dir = tiny_model_path()
    tokenizer = load_tokenizer(model_dir)
    print(
        f"2 cells (tiny Qwen2, CPU); {args.steps} steps x {args.groups_per_step} groups of "
        f"{args.group_size} episodes x {args.turns} turns; injected tool delay "
        f"{args.tool_delay:g}s per call; {args.slots} groups at once"
    )
    rows = []
    for name, make in _policies(args).items():
        if args.only and name not in args.only:
            continue
        rows.append(run_one(name, make, args, model_dir, tokenizer))
        r = rows[-1]
        print(
            f"{r['policy']:>11}: wall {r['wall_s']:6.1f}s  steps {r['steps']}  busy "
            f"{r['busy'][0]:.2f}/{r['busy'][1]:.2f}  idle {r['idle']:.2f}  switches "
            f"{r['switches']} {r['switch_ms']}  staleness {r['staleness']:.2f}  groups {r['groups']}",
            flush=True,
        )
    by = {r["policy"]: r for r in rows}
    if "waterlevel" in by and len(by) > 1:
        best = min((r for r in rows if r["policy"] != "waterlevel"), key=lambda r: r["wall_s"])
        ratio = best["wall_s"] / by["waterlevel"]["wall_s"]
        print(f"waterlevel vs best peer ({best['policy']}): {ratio:.2f}x throughput")


if __name__ == "__main__":
    main()
