"""Shared test plumbing: the ``docker`` and ``bwrap`` markers.

A test marked ``docker`` (or ``bwrap``) needs a Docker daemon (or bubblewrap). Where it is
missing the test is skipped on a developer machine, but FAILS when ``CI`` is set: CI
installs both, and a skipped sandbox test there would hide a broken setup.
"""

from __future__ import annotations

import functools
import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@functools.cache
def docker_available() -> bool:
    from gyre_env.sandbox.docker import daemon_available

    return daemon_available()


@functools.cache
def bwrap_available() -> bool:
    from gyre_env.sandbox.bwrap import bwrap_available

    return bwrap_available()


_NEEDS = {
    "docker": (docker_available, "a Docker daemon"),
    "bwrap": (bwrap_available, "bubblewrap (apt-get install bubblewrap)"),
}


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, (available, what) in _NEEDS.items():
        if item.get_closest_marker(marker) is None or available():
            continue
        if in_ci():
            pytest.fail(f"CI must provide {what} for tests marked {marker!r}", pytrace=False)
        pytest.skip(f"needs {what}")


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """The built-in tiny model, built once per session into a temporary cache."""
    from gyre_env.engines.tiny import tiny_model_path

    return tiny_model_path(root=tmp_path_factory.mktemp("gyre-cache"))


@pytest.fixture(scope="session")
def tokenizer(tiny_path):
    """The tokenizer of ``tiny_path``."""
    from gyre_env.engines.tiny import load_tokenizer

    return load_tokenizer(tiny_path)


@pytest.fixture(scope="session")
def tok():
    """The built-in tiny model's tokenizer (built locally on first use)."""
    from gyre_env.engines.tiny import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def enc(tok):
    """Text -> token ids with no special tokens added, as the proxy tokenizes suffixes."""

    def encode(text: str) -> list[int]:
        return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids

    return encode
