"""The warm pool: fast acquire, one episode per sandbox, background refill, bounded size."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gyre_env.sandbox import SandboxConfig, SandboxPool, make_sandbox

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pool_of(request):
    """``pool_of(backend, size)`` returns a pool; it and every sandbox it made are closed."""
    pools, made = [], []

    def build(backend: str, size: int) -> SandboxPool:
        fields = {"memory_mb": 512, "pids": 128}
        if backend == "docker":
            fields["image"] = request.getfixturevalue("docker_image")

        def factory():
            sandbox = make_sandbox(SandboxConfig(**fields), backend=backend)
            made.append(sandbox)
            return sandbox

        pool = SandboxPool(factory, size=size)
        pools.append(pool)
        return pool

    yield build
    for pool in pools:
        pool.close()
    for sandbox in made:
        sandbox.close()


def test_warm_acquire_is_fast(pool_of, isolated_backend):
    pool = pool_of(isolated_backend, 2)
    assert pool.wait_ready(60), f"pool never filled ({pool.failures} failures)"
    times = []
    for _ in range(2):
        start = time.monotonic()
        sandbox = pool.acquire()
        times.append(time.monotonic() - start)
        assert sandbox.exec("echo ready").stdout == "ready\n"
    assert pool.cold_starts == 0
    assert max(times) < 0.1, f"warm acquire took {[f'{t * 1000:.1f} ms' for t in times]}"


def test_a_sandbox_is_never_handed_to_two_episodes(pool_of, isolated_backend):
    pool = pool_of(isolated_backend, 2)
    pool.wait_ready(60)
    with ThreadPoolExecutor(6) as threads:
        taken = list(threads.map(lambda _: pool.acquire(), range(6)))
    assert len({s.id for s in taken}) == 6
    assert len({id(s) for s in taken}) == 6
    later = [pool.acquire() for _ in range(2)]
    assert not {s.id for s in later} & {s.id for s in taken}


def test_refill_happens_in_the_background(pool_of, isolated_backend):
    pool = pool_of(isolated_backend, 2)
    assert pool.wait_ready(60)
    first = pool.acquire()
    assert pool.idle() <= 1
    assert pool.wait_ready(60), "the pool did not refill without further calls"
    refilled = [pool.acquire() for _ in range(2)]
    assert pool.cold_starts == 0
    assert first.id not in {s.id for s in refilled}


def test_a_dead_idle_sandbox_is_not_handed_out(pool_of):
    pool = pool_of("local", 2)
    assert pool.wait_ready(30)
    victim = pool._idle.queue[0]  # white-box: kill one while it waits in the pool
    victim.close()
    got = [pool.acquire() for _ in range(2)]
    assert victim not in got
    assert all(s.alive() and s.exec("echo ok").stdout == "ok\n" for s in got)


def test_cold_starts_do_not_grow_the_pool_past_its_size(pool_of):
    pool = pool_of("local", 1)
    assert pool.wait_ready(30)
    taken = [pool.acquire() for _ in range(6)]  # faster than the refill: some are cold
    assert len({s.id for s in taken}) == 6
    time.sleep(2.0)
    assert pool.idle() <= pool.size, (
        f"{pool.idle()} idle sandboxes in a pool of size {pool.size} "
        f"after {pool.cold_starts} cold starts"
    )


def test_close_closes_idle_sandboxes_and_refuses_more(pool_of):
    pool = pool_of("local", 2)
    assert pool.wait_ready(30)
    idle = list(pool._idle.queue)
    pool.close()
    assert not any(s.alive() for s in idle)
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire()
    with pytest.raises(ValueError, match="pool size"):
        SandboxPool(lambda: None, size=-1)
