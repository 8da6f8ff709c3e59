"""Fixtures of the weight-sync tests (helpers live in wsutil.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    from gyre_env.engines.tiny import tiny_model_path

    return tiny_model_path(root=tmp_path_factory.mktemp("gyre-cache"))
