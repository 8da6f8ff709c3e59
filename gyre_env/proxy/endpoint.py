"""What an agent gets of the model side: a ``ModelEndpoint``, its own proxy session.

The proxy (``gyre_env.proxy.serving``) makes one per episode; agents import it from here
(or ``gyre_env.agents``), and the proxy imports no agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

API_KINDS = ("openai", "anthropic")
"""The model APIs an endpoint can speak."""


@dataclass(kw_only=True)
class ModelEndpoint:
    """Where an episode's agent reaches the policy: its own proxy session. It is all an
    agent knows of the model side; the proxy (``gyre_env.proxy.serving``) hosts the model."""

    base_url: str
    """Base URL of the episode's session for ``api``: OpenAI-style with ``/v1`` (e.g.
    ``http://127.0.0.1:8000/s/ep1/v1``, then ``/chat/completions``), Anthropic-style without
    it (``http://127.0.0.1:8000/s/ep1``, then ``/v1/messages``), as each SDK expects."""
    api: str = "openai"
    """The API to speak at ``base_url``: ``openai`` or ``anthropic``."""
    model: str = "tiny"
    """Model name sent in requests."""
    api_key: str = "gyre"
    """Sent as the bearer token / ``x-api-key``; any value unless the proxy sets one."""
    session: str = ""
    """The proxy session id (the records' ``session``)."""
    sandbox_base_url: str | None = None
    """The same session as seen from inside the sandbox (through its proxy route), without
    ``/v1``: what a CLI's ``ANTHROPIC_BASE_URL`` / ``OPENAI_BASE_URL`` is set to."""
    context_length: int = 8192
    """The model's context window in tokens (drives compaction)."""
    calls: Any = None
    """The proxy's ``RecordTap`` (``calls(session)``, ``wait_for(...)``, ``inflight(session)``),
    when the proxy runs in this process: a CLI agent learns its model-turn boundaries from it."""

    def __post_init__(self) -> None:
        if self.api not in API_KINDS:
            raise ValueError(f"ModelEndpoint.api must be one of {API_KINDS}, got {self.api!r}")
