"""``BenchConfig``: what a ``gyre bench`` run is (every field is a flag of the CLI, whose
defaults come from here)."""

from __future__ import annotations

from dataclasses import dataclass, field

AGENTS = ("langgraph", "mini-swe-agent", "claude-code", "codex", "scripted", "gold")
"""Named agents; any other ``--agent`` value is a shell command run by the CLI tap."""


@dataclass(kw_only=True)
class BenchConfig:
    """A benchmark run. Every field is a ``gyre bench`` flag."""

    env_id: str = "Gyre/NL2Repo-v0"
    agent: str = "langgraph"
    """``langgraph`` | ``mini-swe-agent`` | ``claude-code`` | ``codex`` | ``scripted`` (gold solutions, or ``script``) |
    ``gold`` | any shell command (run in the sandbox by the CLI tap)."""
    tasks: str = "micro"
    """``all``, tier names (``micro,small``), task ids, or a mix, comma-separated."""
    suite: str = "builtin"
    """Task suite name or folder (``gyre_env.tasks.load_suite``)."""
    repeats: int = 1
    """Episodes per task."""
    parallel: int = 4
    model: str | None = None
    """Embedded engine: a local HF model folder (default: the built-in tiny model). With
    ``base_url``: the upstream model name."""
    base_url: str | None = None
    """An OpenAI- or Anthropic-compatible upstream: the proxy forwards to it (passthrough,
    text-level records); its key comes from ``$GYRE_UPSTREAM_API_KEY``."""
    api: str = "openai"
    """The upstream's API with ``base_url``: ``openai`` or ``anthropic``."""
    script: str | None = None
    """For ``scripted``: a JSON file with a list of tool calls replayed in every episode."""
    out_dir: str = "bench-out"
    store: str | None = None
    """A trajectory store (SQLite) that also receives every call and episode outcome."""
    run: str = ""
    """Run name of the episodes in the store (default: the output folder's name)."""
    time_limit_s: float | None = None
    """Per-episode limit; None: each task's own wall-clock limit."""
    max_retries: int = 2
    max_steps: int | None = None
    """Agent step budget (LangGraph: tool calls; mini-swe-agent: model calls); None: the
    agent's default."""
    max_new_tokens: int = 256
    """Completion tokens per model call (LangGraph, mini-swe-agent; Claude Code: its output
    limit)."""
    seed: int = 0
    progress: bool = True
    """tqdm progress bar on stderr."""
    env_kwargs: dict = field(default_factory=dict)
    """Extra ``gym.make`` keyword arguments."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {self.parallel}")
