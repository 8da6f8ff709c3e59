"""Moved: model hosting (the proxy, its engine, the record tap and the sandbox route) is the
proxy side's, in :mod:`gyre_env.proxy.serving`. Agents only receive a ``ModelEndpoint``.
This module re-exports the names so old imports keep working."""

from gyre_env.proxy.serving import (
    InflightCounter,
    ModelService,
    ModelServiceConfig,
    RecordTap,
    UnixRelay,
)

__all__ = ["InflightCounter", "ModelService", "ModelServiceConfig", "RecordTap", "UnixRelay"]
