"""Shared test plumbing: the ``docker`` and ``bwrap`` markers, the tiny tokenizer, an
in-process proxy (``start_proxy``) and a decode-step hold for migration tests.

A test marked ``docker`` (or ``bwrap``) needs a Docker daemon (or bubblewrap). Where it is
missing the test is skipped on a developer machine, but FAILS when ``CI`` is set: CI
installs both, and a skipped sandbox test there would hide a broken setup.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with the most ``slow`` tests run first. CI runs ``-n 2 --dist loadfile``: a
    file runs whole on one worker, in the order files are collected, and the slowest files
    sit late in that order (``tests/train``), so one of them started last ran on while
    the other worker sat idle. A stable sort keeps each file's own order."""
    slow: dict = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, (available, what) in _NEEDS.items():
        if item.get_closest_marker(marker) is None or available():
            continue
        if in_ci():
            pytest.fail(f"CI must provide {what} for tests marked {marker!r}", pytrace=False)
        pytest.skip(f"needs {what}")


@pytest.fixture(scope="session")
def host_cli():
    """``host_cli(find, name)``: ``find()``, the host install of an agent CLI (it raises
    FileNotFoundError naming the install command); missing, the test skips, or fails in CI
    (which installs every CLI the tests use)."""

    def check(find, name: str):
        try:
            return find()
        except FileNotFoundError as e:
            if in_ci():
                pytest.fail(f"CI must install the {name}: {e}", pytrace=False)
            pytest.skip(str(e))

    return check


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


@contextlib.contextmanager
def held_in_flight(engine, after_steps: int):
    """Hold an embedded engine's worker after ``after_steps`` decode steps until a control
    action (an export, a release) is queued, so that requests are surely still in flight
    when a migration takes them; yields an event set once the worker holds.

    Without it the migration tests raced the decode: on a loaded CI machine a switch's
    first phase once took 1 s, longer than the requests' whole decode, and nothing was
    left to migrate. Wait for the event, not for a count of chunks (a held worker makes
    no more)."""
    step = engine._decode_step
    holding = threading.Event()
    state = {"steps": 0, "done": False}

    def gated() -> None:
        if engine._batch.rows:
            state["steps"] += 1
        if state["steps"] > after_steps and not state["done"]:
            holding.set()
            deadline = time.monotonic() + 60.0
            while not (engine._urgent or engine._control) and time.monotonic() < deadline:
                time.sleep(0.001)
            state["done"] = True  # once: the engine then decodes freely
        step()

    engine._decode_step = gated
    try:
        yield holding
    finally:
        del engine._decode_step


async def until_held(holding: threading.Event) -> None:
    """Await :func:`held_in_flight`'s event from a coroutine (the loop keeps running)."""
    deadline = time.monotonic() + 60.0
    while not holding.is_set():
        if time.monotonic() > deadline:
            raise AssertionError("the engine never reached the decode step it was to hold at")
        await asyncio.sleep(0.001)


class StartedProxy:
    """A running proxy (attributes pass through to the ``ProxyServer``) and its records."""

    def __init__(self, server, path):
        self.server = server
        self.path = path

    def records(self):
        from gyre_env.proxy.records import read_jsonl

        return read_jsonl(self.path)

    def __getattr__(self, name):
        return getattr(self.server, name)


@pytest.fixture
def start_proxy(tok, tmp_path):
    """``start_proxy(engines, **config)``: an in-process proxy writing records to a file
    under ``tmp_path`` (``verify_render`` on unless given), stopped after the test."""
    from gyre_env.proxy.records import JsonlSink
    from gyre_env.proxy.server import ProxyConfig, ProxyServer

    servers = []

    def start(engines, **config) -> StartedProxy:
        path = tmp_path / f"records-{len(servers)}.jsonl"
        config.setdefault("verify_render", True)
        server = ProxyServer(
            ProxyConfig(**config), engines=list(engines), tokenizer=tok, sink=JsonlSink(path)
        )
        servers.append(server.start())
        return StartedProxy(server, path)

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def hold_in_flight():
    """``(held_in_flight, until_held)``, for tests in any folder."""
    return held_in_flight, until_held
