"""The model proxy: OpenAI (Chat Completions, Responses) and Anthropic APIs over token-level
engines, with TITO records.

Start one in-process and give each episode its own base URL::

    from gyre_env.proxy import JsonlSink, ProxyConfig, ProxyServer

    proxy = ProxyServer(ProxyConfig(), engines=[engine], tokenizer=tok, sink=JsonlSink(path))
    proxy.start()
    proxy.openai_base_url("episode-7")     # http://127.0.0.1:PORT/s/episode-7/v1
    proxy.anthropic_base_url("episode-7")  # http://127.0.0.1:PORT/s/episode-7
    proxy.stop()

For rollouts, ``ModelService`` (``gyre_env.proxy.serving``) hosts the model: the proxy, its
engine (or an upstream API), the record tap and the sandbox route, and hands each episode's
agent a ``ModelEndpoint`` (``gyre_env.proxy.endpoint``).

Names are imported on first use, so ``import gyre_env.proxy`` stays light.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ProxyServer": "gyre_env.proxy.server",
    "ProxyConfig": "gyre_env.proxy.server",
    "CallRecord": "gyre_env.trajectory.records",
    "RecordSink": "gyre_env.trajectory.records",
    "JsonlSink": "gyre_env.trajectory.records",
    "read_jsonl": "gyre_env.trajectory.records",
    "ScriptedEngine": "gyre_env.proxy.scripted",
    "ModelService": "gyre_env.proxy.serving",
    "ModelServiceConfig": "gyre_env.proxy.serving",
    "ModelEndpoint": "gyre_env.proxy.endpoint",
    "UpstreamConfig": "gyre_env.proxy.passthrough",
    "CallContext": "gyre_env.proxy.sessions",
    "default_classifier": "gyre_env.proxy.sessions",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gyre_env.proxy' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
