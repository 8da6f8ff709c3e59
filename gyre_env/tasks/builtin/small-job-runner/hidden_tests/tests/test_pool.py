import threading
import time

import jobrun.pool as pool_mod
import pytest


def wait_running(job):
    deadline = time.monotonic() + 5
    while not job.running():
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.005)


def test_submit_and_result():
    with pool_mod.WorkerPool(2) as pool:
        job = pool.submit(lambda a, b=0: a + b, 2, b=3)
        assert job.result(timeout=5) == 5
        assert job.done() and not job.running() and not job.cancelled()


def test_exception_is_reraised_and_returned():
    def boom():
        raise KeyError("x")

    with pool_mod.WorkerPool(1) as pool:
        job = pool.submit(boom)
        with pytest.raises(KeyError):
            job.result(timeout=5)
        assert isinstance(job.exception(timeout=5), KeyError)
        assert pool.submit(int).exception(timeout=5) is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_worker_count(bad):
    with pytest.raises(ValueError):
        pool_mod.WorkerPool(bad)


def test_result_timeout():
    gate = threading.Event()
    with pool_mod.WorkerPool(1) as pool:
        job = pool.submit(gate.wait, 5)
        with pytest.raises(TimeoutError):
            job.result(timeout=0.05)
        assert job.running()
        gate.set()
        assert job.result(timeout=5) is True


def test_runs_workers_jobs_concurrently():
    barrier = threading.Barrier(3, timeout=5)
    with pool_mod.WorkerPool(3) as pool:
        jobs = [pool.submit(barrier.wait) for _ in range(3)]
        assert sorted(j.result(timeout=10) for j in jobs) == [0, 1, 2]


def test_never_more_than_workers_at_once():
    lock = threading.Lock()
    state = {"now": 0, "max": 0}

    def work():
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.01)
        with lock:
            state["now"] -= 1

    with pool_mod.WorkerPool(2) as pool:
        pool.map(lambda _: work(), range(12), timeout=20)
    assert state["max"] == 2


def test_fifo_order_with_one_worker():
    order = []
    with pool_mod.WorkerPool(1) as pool:
        for i in range(20):
            pool.submit(order.append, i)
    assert order == list(range(20))


def test_map_order_and_first_exception():
    with pool_mod.WorkerPool(4) as pool:
        assert pool.map(lambda x: x * x, range(10)) == [x * x for x in range(10)]

        def f(x):
            if x in (3, 7):
                raise ValueError(str(x))
            return x

        with pytest.raises(ValueError, match="^3$"):
            pool.map(f, range(10))


def test_map_timeout():
    gate = threading.Event()
    with pool_mod.WorkerPool(1) as pool:
        with pytest.raises(TimeoutError):
            pool.map(lambda _: gate.wait(5), [1], timeout=0.05)
        gate.set()


def test_cancel_pending_job():
    gate = threading.Event()
    ran = []
    with pool_mod.WorkerPool(1) as pool:
        blocker = pool.submit(gate.wait, 5)
        queued = pool.submit(ran.append, "x")
        wait_running(blocker)
        assert queued.cancel() is True
        assert queued.cancel() is True
        assert blocker.cancel() is False
        gate.set()
        with pytest.raises(pool_mod.CancelledError):
            queued.result(timeout=5)
        with pytest.raises(pool_mod.CancelledError):
            queued.exception(timeout=5)
        assert queued.done() and queued.cancelled()
    assert ran == []


def test_done_callbacks():
    seen = []
    gate = threading.Event()
    with pool_mod.WorkerPool(1) as pool:
        job = pool.submit(gate.wait, 5)
        job.add_done_callback(lambda j: seen.append(("first", j.result())))
        job.add_done_callback(lambda j: 1 / 0)
        job.add_done_callback(lambda j: seen.append(("second", j is job)))
        gate.set()
        job.result(timeout=5)
    job.add_done_callback(lambda j: seen.append("late"))
    assert seen == [("first", True), ("second", True), "late"]


def test_callback_on_cancel():
    gate = threading.Event()
    seen = []
    with pool_mod.WorkerPool(1) as pool:
        wait_running(pool.submit(gate.wait, 5))
        job = pool.submit(int)
        job.add_done_callback(lambda j: seen.append(j.cancelled()))
        job.cancel()
        gate.set()
    assert seen == [True]


def test_shutdown_rejects_and_waits():
    done = []
    pool = pool_mod.WorkerPool(2)
    for i in range(6):
        pool.submit(lambda i=i: (time.sleep(0.01), done.append(i)))
    pool.shutdown(wait=True)
    assert sorted(done) == list(range(6))
    with pytest.raises(RuntimeError):
        pool.submit(int)
    pool.shutdown()


def test_shutdown_cancel_pending():
    gate = threading.Event()
    pool = pool_mod.WorkerPool(1)
    first = pool.submit(gate.wait, 5)
    rest = [pool.submit(int) for _ in range(3)]
    wait_running(first)
    pool.shutdown(wait=False, cancel_pending=True)
    assert all(j.cancelled() for j in rest)
    gate.set()
    assert first.result(timeout=5) is True
