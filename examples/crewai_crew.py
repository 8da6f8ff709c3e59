"""A CrewAI crew playing one Gyre episode: its LLM is Gyre's proxy, its tools the env's.

Two crew agents share the episode's sandbox: an ``engineer`` builds what the task asks
with the env's tools (``write_file``, ``bash``, ...), then a ``reviewer`` checks the work
and fixes what it finds. Both call the policy through the episode's proxy session, so
their calls are TITO records of one episode's token tree, one branch role per agent: the
engineer's calls are ``main``, the reviewer's ``sub-agent`` (its LLM sends the proxy's
sub-agent header). When the crew is done the runner grades the workspace (``submit``).

    python examples/crewai_crew.py --task micro-lru-cache --out crew-out

The default model is the built-in tiny one (random: scores ~0, the plumbing is what
runs); ``--model FOLDER`` serves a local Hugging Face model instead. Prints one line per
recorded call (branch, role, parent) and the episode's result; ``--out`` gets
``records.jsonl`` and ``store.db`` (the trajectory store ``gyre train`` reads).

CrewAI (``pip install 'gyre-env[crewai]'``) pins ``openai<3`` through ``instructor``,
which Gyre's own tests use newer; install it in its own environment (CI does so in a
virtualenv on top of Gyre's, ``.ci/setup``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from gyre_env.agents import AgentResult, EndReason
from gyre_env.agents.langgraph_agent import SUBAGENT_HEADER

from gyre_env.proxy.serving import ModelService, ModelServiceConfig
from gyre_env.runner import EpisodeSpec, Runner, RunnerConfig

ROLES = {"engineer": "main", "reviewer": "sub-agent"}
"""Crew agent -> the branch role its calls are recorded with."""
REVIEW_TOOLS = ("read_file", "list_dir", "run_tests", "bash", "str_replace", "write_file")
_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list}


def import_crewai():
    """Import CrewAI with its telemetry and tracing off, so nothing leaves the machine.

    On a first run CrewAI collects traces and asks (20 s, on the terminal) whether to
    upload them; the answer is saved in its user data folder. Where no answer is saved
    yet, this saves "no", as answering N would, and has CrewAI's trace listener (made
    when CrewAI is imported) read it again."""
    for var in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED", "CREWAI_DISABLE_TRACKING"):
        os.environ.setdefault(var, "true")
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
    try:
        import crewai
        from crewai.events.listeners.tracing.trace_listener import TraceCollectionListener
        from crewai.events.listeners.tracing.utils import mark_first_execution_done
    except ImportError as e:
        raise SystemExit(
            "this example needs CrewAI: pip install 'gyre-env[crewai]' (in its own "
            "environment: it pins openai<3)"
        ) from e
    mark_first_execution_done(user_consented=False)  # no-op once an answer is saved
    TraceCollectionListener().first_time_handler.initialize_for_first_time_user()
    return crewai


def env_tools(ctx, names: tuple[str, ...] | None = None) -> list:
    """The episode's env tools (``info["tools"]``, ``submit`` left to the runner) as CrewAI
    tools; each call is one ``ctx.step`` in the episode's sandbox."""
    from crewai.tools import BaseTool
    from pydantic import Field, create_model

    tools = []
    for schema in ctx.tools:
        fn = schema.get("function", schema)
        if fn["name"] == "submit" or (names is not None and fn["name"] not in names):
            continue
        params = fn.get("parameters") or {}
        required = set(params.get("required") or ())
        fields: dict[str, Any] = {}
        for arg, spec in (params.get("properties") or {}).items():
            kind = _JSON_TYPES.get(spec.get("type"), dict)
            desc = spec.get("description", "")
            if arg in required:
                fields[arg] = (kind, Field(..., description=desc))
            else:
                fields[arg] = (kind | None, Field(None, description=desc))
        args_model = create_model(f"{fn['name']}_args", **fields)

        class EnvTool(BaseTool):
            def _run(self, **kwargs: Any) -> str:
                args = {k: v for k, v in kwargs.items() if v is not None}
                obs, *_ = ctx.step({"name": self.name, "arguments": args})
                return obs if isinstance(obs, str) else json.dumps(obs, default=str)

        tools.append(
            EnvTool(name=fn["name"], description=fn.get("description", ""), args_schema=args_model)
        )
    return tools


@dataclass(kw_only=True)
class CrewConfig:
    """The crew's budgets."""

    max_iter: int = 6
    """Model calls each crew agent may make per task (CrewAI's ``max_iter``)."""
    max_new_tokens: int = 256
    temperature: float = 1.0


class CrewAgent:
    """A Gyre agent (``run(ctx) -> AgentResult``) that plays the episode with a crew."""

    name = "crewai"
    api = "openai"

    def __init__(self, config: CrewConfig | None = None):
        import_crewai()
        self.config = config or CrewConfig()

    def llm(self, ctx, crew_agent: str):
        """A CrewAI LLM at the episode's proxy session; non-main agents say so by header."""
        from crewai import LLM

        ep = ctx.model_endpoint(self.api, "the CrewAI crew")
        headers = None
        if ROLES[crew_agent] == "sub-agent":
            headers = {SUBAGENT_HEADER: f"{ctx.episode_id}-{crew_agent}"}
        return LLM(  # provider given: CrewAI's own OpenAI client, whatever the model's name
            model=ep.model,
            provider="openai",
            base_url=ep.base_url,
            api_key=ep.api_key,
            temperature=self.config.temperature,
            max_tokens=self.config.max_new_tokens,
            default_headers=headers,
            max_retries=0,
        )

    def crew(self, ctx):
        from crewai import Agent, Crew, Process, Task

        engineer = Agent(
            role="engineer",
            goal="Build what the task asks, in the workspace, with the tools.",
            backstory="A careful Python engineer who writes code and runs it.",
            llm=self.llm(ctx, "engineer"),
            tools=env_tools(ctx),
            max_iter=self.config.max_iter,
            allow_delegation=False,
            verbose=False,
        )
        reviewer = Agent(
            role="reviewer",
            goal="Check the engineer's work against the task and fix what is wrong.",
            backstory="A reviewer who reads the code and runs the tests before saying done.",
            llm=self.llm(ctx, "reviewer"),
            tools=env_tools(ctx, REVIEW_TOOLS),
            max_iter=self.config.max_iter,
            allow_delegation=False,
            verbose=False,
        )
        build = Task(
            description=f"{ctx.observation}\n\nWrite the files in the current directory.",
            expected_output="A short report of the files written and how they were checked.",
            agent=engineer,
        )
        review = Task(
            description="Review the workspace against the task above; fix what fails.",
            expected_output="A short verdict: what was checked and fixed.",
            agent=reviewer,
            context=[build],
        )
        return Crew(
            agents=[engineer, reviewer],
            tasks=[build, review],
            process=Process.sequential,
            tracing=False,
            verbose=False,
        )

    def run(self, ctx) -> AgentResult:
        ctx.check_live()
        crew = self.crew(ctx)
        with ctx.clock.phase("agent"):
            output = crew.kickoff()
        calls = ctx.endpoint.calls.calls(ctx.endpoint.session) if ctx.endpoint.calls else []
        # CrewAI calls the model inside its own loop: the records' durations are model time.
        ctx.clock.reattribute("agent", "model", sum(c["seconds"] for c in calls))
        return AgentResult(
            reason=EndReason.ENV_ENDED if ctx.done else EndReason.SUBMITTED,
            message=str(output)[-2000:],
            model_calls=len(calls),
            tokens=sum(c["prompt_tokens"] + c["output_tokens"] for c in calls),
            extra={"tasks": [str(t.raw)[-500:] for t in output.tasks_output]},
        )


def run_episode(service: ModelService, task_id: str, episode: str, config: CrewConfig, sink=None):
    """One episode of ``task_id`` played by the crew; returns its ``EpisodeResult``."""
    runner = Runner(
        CrewAgent(config),
        RunnerConfig(parallel=1, max_retries=0),
        endpoint_factory=service.endpoint,
        sink=sink,
    )
    spec = EpisodeSpec(
        episode_id=episode, env_id="Gyre/NL2Repo-v0", reset_options={"task_id": task_id}
    )
    [result] = runner.run([spec])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="micro-lru-cache")
    p.add_argument("--model", default=None, help="local HF model folder (default: the tiny one)")
    p.add_argument("--max-iter", type=int, default=CrewConfig.max_iter)
    p.add_argument("--max-new-tokens", type=int, default=CrewConfig.max_new_tokens)
    p.add_argument("--out", default="crew-out")
    args = p.parse_args(argv)

    from gyre_env.runner import StoreResultSink
    from gyre_env.trajectory.store import TrajectoryStore

    os.makedirs(args.out, exist_ok=True)
    store = TrajectoryStore(os.path.join(args.out, "store.db"))
    config = CrewConfig(max_iter=args.max_iter, max_new_tokens=args.max_new_tokens)
    service = ModelService(
        ModelServiceConfig(model=args.model, records_path=os.path.join(args.out, "records.jsonl")),
        sinks=(store,),
    ).start()
    try:
        result = run_episode(
            service, args.task, "crew-0", config, sink=StoreResultSink(store, run="crewai")
        )
    finally:
        service.stop()  # closes the store too (one of the proxy's sinks)
    with TrajectoryStore(os.path.join(args.out, "store.db"), readonly=True) as store:
        records = list(store.records([result.episode_id]))
    for r in records:
        print(
            f"call {r.call_index:2d}  branch {r.branch:4s} {r.role:9s} parent "
            f"{'-' if r.parent is None else r.parent:>3}  prompt {len(r.prompt_ids):5d}  "
            f"output {len(r.output_ids):4d}"
        )
    print(
        f"{result.task_id}: {result.outcome}, score {result.score}, {len(records)} calls, "
        f"roles {sorted({r.role for r in records})}"
    )
    return 0 if result.outcome != "infra_error" else 1


if __name__ == "__main__":
    sys.exit(main())
