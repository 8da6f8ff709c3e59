"""``run_bench``: run an agent over a task suite and report scores and where time went.

One function, :func:`run_bench`, reads top to bottom: pick tasks, build the agent, start
the model service (proxy + embedded tiny model by default) if the agent needs a model,
run the episodes with the runner, then write ``results.jsonl`` (streamed), ``results.json``
(config, summary, every episode) and ``report.html`` (plots) into ``out_dir``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gyre_env.bench.config import BenchConfig
from gyre_env.bench.summary import format_summary, format_table, summarize, write_html
from gyre_env.runner import EpisodeResult, EpisodeSpec, JsonlResultSink, Runner, RunnerConfig

log = logging.getLogger(__name__)


@dataclass
class BenchRun:
    """What ``run_bench`` produced."""

    results: list[EpisodeResult]
    summary: dict
    out_dir: Path


def select_tasks(selection: str, suite: str = "builtin") -> list:
    """Tasks named by ``selection`` (see ``BenchConfig.tasks``), in suite order."""
    from gyre_env.tasks import TIERS, load_suite

    tasks = load_suite(suite)
    by_id = {t.id: t for t in tasks}
    wanted = [w.strip() for w in selection.split(",") if w.strip()]
    if not wanted:
        raise ValueError("no tasks selected: give 'all', tier names or task ids")
    chosen: set[str] = set()
    for word in wanted:
        if word == "all":
            chosen.update(by_id)
        elif word in TIERS:
            chosen.update(t.id for t in tasks if t.tier == word)
        elif word in by_id:
            chosen.add(word)
        else:
            import difflib

            close = difflib.get_close_matches(word, [*by_id, *TIERS, "all"], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"no task or tier {word!r} in suite {suite!r}{hint}")
    picked = [t for t in tasks if t.id in chosen]
    if not picked:
        raise ValueError(f"{selection!r} selects no task of suite {suite!r}")
    return picked


def make_agent(cfg: BenchConfig):
    """The agent named by ``cfg.agent``."""
    from gyre_env import agents

    if cfg.agent == "langgraph":
        lg = agents.LangGraphAgentConfig(max_new_tokens=cfg.max_new_tokens)
        if cfg.max_steps:
            lg.max_steps = cfg.max_steps
        return agents.LangGraphAgent(lg)
    if cfg.agent == "mini-swe-agent":
        msa = agents.MiniSweAgentConfig(max_new_tokens=cfg.max_new_tokens)
        if cfg.max_steps:
            msa.max_steps = cfg.max_steps
        return agents.MiniSweAgent(msa)
    if cfg.agent == "gold" or (cfg.agent == "scripted" and not cfg.script):
        return agents.GoldAgent()
    if cfg.agent == "scripted":
        actions = json.loads(Path(cfg.script).read_text(encoding="utf-8"))
        if not isinstance(actions, list):
            raise ValueError(f"{cfg.script}: expected a JSON list of tool calls")
        return agents.ScriptedAgent(actions)
    if cfg.agent == "claude-code":
        from gyre_env.agents.cli_tap import CLAUDE_MOUNT

        return agents.ClaudeCodeAgent(
            binary=f"{CLAUDE_MOUNT}/bin/claude.exe", max_output_tokens=cfg.max_new_tokens
        )
    if cfg.agent == "codex":
        from gyre_env.agents.codex_cli import CODEX_MOUNT, host_codex_dir

        if cfg.base_url:
            raise ValueError(
                "--agent codex speaks the Responses API, which the proxy serves from its own "
                "engine only (the passthrough forwards chat calls): drop --base-url"
            )
        host_codex_dir()  # not installed: FileNotFoundError with the install command
        return agents.CodexAgent(binary=f"{CODEX_MOUNT}/bin/codex")
    return agents.CliAgent(agents.CliAgentConfig(command=cfg.agent, name="cli"))


def _needs_model(agent) -> bool:
    return agent.name not in ("gold", "scripted")


def _is_cli(agent) -> bool:
    from gyre_env.agents.cli_tap import CliAgent

    return isinstance(agent, CliAgent)


def run_bench(cfg: BenchConfig) -> BenchRun:
    """Run the benchmark; print the table and summary; write results and the report."""
    from gyre_env.proxy.serving import ModelService, ModelServiceConfig

    tasks = select_tasks(cfg.tasks, cfg.suite)
    check_sandboxes(cfg)
    agent = make_agent(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    store = _open_store(cfg.store)
    service = None
    if _needs_model(agent):
        service = ModelService(
            ModelServiceConfig(
                model=None if cfg.base_url else cfg.model,
                records_path=str(out / "records.jsonl"),
                upstream_base_url=cfg.base_url,
                upstream_api=cfg.api,
            ),
            sinks=(store,) if store is not None else (),
        ).start()
    try:
        env_kwargs = episode_env_kwargs(cfg, agent, service, tasks)
        specs = [
            EpisodeSpec(
                episode_id=f"{task.id}.{k}",
                env_id=cfg.env_id,
                env_kwargs=env_kwargs,
                reset_options={"task_id": task.id},
                seed=cfg.seed + k,
                group=task.id,  # a task's repeats form one GRPO group
            )
            for k in range(cfg.repeats)
            for task in tasks
        ]
        results, wall = _run(cfg, agent, service, specs, out, store)
    finally:
        if service is not None:
            service.stop()  # closes the store too (it is one of the proxy's sinks)
        elif store is not None:
            store.close()
    summary = summarize(results, wall)
    payload = {"config": asdict(cfg), "summary": summary, "results": [r.to_dict() for r in results]}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    if service is not None:
        _write_episodes(results, out / "episodes.jsonl", run=cfg.run or out.name)
    write_html(results, summary, out / "report.html", title=f"gyre bench {cfg.env_id} {agent.name}")
    print(format_table(results))
    print(format_summary(summary))
    print(f"results: {out / 'results.json'}  report: {out / 'report.html'}")
    return BenchRun(results=results, summary=summary, out_dir=out)


def check_sandboxes(cfg: BenchConfig) -> None:
    """Before any work, as ``gyre train`` does: the env's sandbox and grading backends are
    there (a Docker daemon that answers), and ``auto`` resolving to ``local`` (no daemon,
    no bubblewrap) is refused (``SandboxError``): the agent's code would run on this host
    unconfined. Named (``env_kwargs={"sandbox_backend": "local"}``, ``GYRE_SANDBOX=local``)
    it is allowed. An env that is not an ``NL2RepoEnv`` checks its own sandboxes."""
    import gymnasium as gym

    import gyre_env  # noqa: F401  (registers the Gyre env ids)
    from gyre_env.envs.nl2repo.env import NL2RepoConfig
    from gyre_env.envs.nl2repo.registration import ENTRY_POINT
    from gyre_env.sandbox import require_isolation

    spec = gym.registry.get(cfg.env_id)
    if spec is None or spec.entry_point != ENTRY_POINT:
        return
    kwargs = {**(spec.kwargs or {}), **cfg.env_kwargs}
    require_isolation(
        {f"env_kwargs.{k}": v for k, v in NL2RepoConfig.from_kwargs(**kwargs).backends().items()},
        command="gyre bench",
        by_name_hint="GYRE_SANDBOX=local gyre bench ...",
    )


def _write_episodes(results: list[EpisodeResult], path: Path, run: str) -> None:
    """One ``EpisodeInfo`` per attempt beside records.jsonl, the same ones the store gets,
    so token trees group the repeats of a task as one GRPO group."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in results:
            for info in r.episode_infos(run):
                fh.write(json.dumps(info.to_dict()) + "\n")


def _open_store(path: str | None):
    if path is None:
        return None
    from gyre_env.trajectory.store import TrajectoryStore

    return TrajectoryStore(path)


def _run(cfg: BenchConfig, agent, service, specs, out: Path, store=None):
    endpoint_factory = None
    if service is not None:
        api = getattr(agent, "api", None)  # the agent's API (None: the service's)
        if api is not None and not service.serves(api):
            raise ValueError(
                f"agent {agent.name} speaks the {api} API; the upstream speaks {cfg.api} (--api)"
            )

        def endpoint_factory(session: str):
            return service.endpoint(session, cfg.model or "tiny", api=api)

    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(specs), desc=f"bench {agent.name}", file=sys.stderr, unit="ep")

    def on_result(result: EpisodeResult) -> None:
        if bar is not None:
            score = "-" if result.score is None else f"{result.score:.2f}"
            bar.set_postfix_str(f"{result.task_id} {result.outcome} {score}")
            bar.update(1)

    runner = Runner(
        agent,
        RunnerConfig(
            parallel=cfg.parallel, time_limit_s=cfg.time_limit_s, max_retries=cfg.max_retries
        ),
        endpoint_factory=endpoint_factory,
        release_endpoint=service.release if service is not None else None,
        sink=_result_sink(out, store, cfg.run or out.name),
        on_result=on_result,
    )
    start = time.monotonic()
    try:
        results = runner.run(specs)
    finally:
        runner.sink.close()
        if bar is not None:
            bar.close()
    return results, time.monotonic() - start


def _result_sink(out: Path, store, run: str):
    from gyre_env.runner import MultiSink, StoreResultSink

    jsonl = JsonlResultSink(out / "results.jsonl")
    return jsonl if store is None else MultiSink(jsonl, StoreResultSink(store, run=run))


def episode_env_kwargs(cfg: BenchConfig, agent, service, tasks) -> dict:
    """``gym.make`` kwargs: the user's, plus, for CLI agents, the proxy route into their
    sandbox and (Claude Code, Codex) tasks whose image mounts the host's CLI."""
    kwargs = dict(cfg.env_kwargs)
    if service is None or not _is_cli(agent):
        return kwargs
    import dataclasses

    sandbox = dict(kwargs.get("sandbox") or {})
    sandbox["proxy_socket"] = service.route_socket
    sandbox["proxy_port"] = service.config.sandbox_port
    kwargs["sandbox"] = sandbox
    image_of = _cli_image(agent.name)
    if image_of is not None:
        images = {t.image: image_of(t.image) for t in tasks}
        kwargs["tasks"] = [dataclasses.replace(t, image=images[t.image]) for t in tasks]
    return kwargs


def _cli_image(agent_name: str):
    """``base image -> image with the host's CLI mounted`` for the named CLI agents."""
    if agent_name == "claude-code":
        from gyre_env.agents.cli_tap import claude_code_image

        return claude_code_image
    if agent_name == "codex":
        from gyre_env.agents.codex_cli import codex_image

        return codex_image
    return None
