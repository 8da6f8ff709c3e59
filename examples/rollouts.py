"""Roll out the LangGraph agent on Gyre/NL2Repo-v0 with the built-in tiny model.

Many episodes run at once through the runner; each one's model calls go through Gyre's
proxy (token-exact TITO records in ``--out/records.jsonl``) and its results stream to
``--out/results.jsonl``. While it runs, a scheduler's view of the waterlevel (episodes
waiting on the model vs running tools) is printed every few seconds.

    python examples/rollouts.py --episodes 4 --parallel 4 --max-steps 4

The tiny model is random, so scores are ~0: what this shows is the plumbing.
"""

from __future__ import annotations

import argparse
import threading

from gyre_env.agents import LangGraphAgent, LangGraphAgentConfig

from gyre_env.bench.summary import format_summary, format_table, summarize
from gyre_env.proxy.serving import ModelService, ModelServiceConfig
from gyre_env.runner import EpisodeSpec, JsonlResultSink, Runner, RunnerConfig
from gyre_env.tasks import load_suite


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", default="rollouts-out")
    args = p.parse_args()

    tasks = [t for t in load_suite("builtin") if t.tier == "micro"]
    specs = [
        EpisodeSpec(
            episode_id=f"ep{i}",
            env_id="Gyre/NL2Repo-v0",
            reset_options={"task_id": tasks[i % len(tasks)].id},
            seed=i,
        )
        for i in range(args.episodes)
    ]
    agent = LangGraphAgent(
        LangGraphAgentConfig(max_steps=args.max_steps, max_new_tokens=args.max_new_tokens)
    )
    with ModelService(ModelServiceConfig(records_path=f"{args.out}/records.jsonl")) as service:
        runner = Runner(
            agent,
            RunnerConfig(parallel=args.parallel),
            endpoint_factory=service.endpoint,
            release_endpoint=service.release,
            sink=JsonlResultSink(f"{args.out}/results.jsonl"),
        )
        done = threading.Event()

        def watch() -> None:  # what a scheduler would read
            while not done.wait(3.0):
                level = runner.waterlevel.snapshot()
                print(
                    f"waterlevel: model {level['model']}  tool {level['tool']}  "
                    f"scoring {level['scoring']}  setup {level['setup']}  "
                    f"queued {level['queued']}",
                    flush=True,
                )

        threading.Thread(target=watch, daemon=True).start()
        results = runner.run(specs)
        done.set()
    print(format_table(results))
    print(format_summary(summarize(results)))


if __name__ == "__main__":
    main()
