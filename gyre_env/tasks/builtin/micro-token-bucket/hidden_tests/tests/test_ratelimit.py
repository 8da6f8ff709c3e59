import threading

import pytest
from ratelimit import TokenBucket


class FakeClock:
    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def make(rate=1.0, capacity=5):
    clock = FakeClock()
    return TokenBucket(rate, capacity, clock=clock, sleep=clock.sleep), clock


def test_starts_full_and_drains():
    bucket, _ = make(capacity=3)
    assert bucket.available() == pytest.approx(3)
    assert [bucket.try_acquire() for _ in range(4)] == [True, True, True, False]


def test_refills_with_time_up_to_capacity():
    bucket, clock = make(rate=2.0, capacity=4)
    assert bucket.try_acquire(4)
    clock.now += 0.5
    assert bucket.available() == pytest.approx(1.0)
    clock.now += 100
    assert bucket.available() == pytest.approx(4.0)


def test_try_acquire_many_is_all_or_nothing():
    bucket, _ = make(capacity=5)
    assert bucket.try_acquire(3)
    assert not bucket.try_acquire(3)
    assert bucket.available() == pytest.approx(2)


def test_acquire_sleeps_exactly_the_refill_time():
    bucket, clock = make(rate=4.0, capacity=2)
    assert bucket.try_acquire(2)
    assert bucket.acquire(2) is True
    assert sum(clock.sleeps) == pytest.approx(0.5)
    assert clock.now == pytest.approx(100.5)


def test_acquire_times_out():
    bucket, clock = make(rate=1.0, capacity=5)
    assert bucket.try_acquire(5)
    assert bucket.acquire(3, timeout=1.0) is False
    assert clock.now == pytest.approx(101.0)
    assert bucket.available() == pytest.approx(1.0)


def test_acquire_timeout_zero_does_not_sleep():
    bucket, clock = make(capacity=1)
    assert bucket.try_acquire()
    assert bucket.acquire(timeout=0) is False
    assert clock.sleeps == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate": 0, "capacity": 1},
        {"rate": 1, "capacity": 0},
        {"rate": True, "capacity": 1},
        {"rate": 1, "capacity": 2.0},
    ],
)
def test_bad_construction(kwargs):
    with pytest.raises(ValueError):
        TokenBucket(**kwargs)


def test_bad_n():
    bucket, _ = make(capacity=3)
    for bad in (0, 4, 1.0):
        with pytest.raises(ValueError):
            bucket.try_acquire(bad)
        with pytest.raises(ValueError):
            bucket.acquire(bad)


def test_threads_never_overspend():
    bucket = TokenBucket(1.0, 200, clock=lambda: 0.0)
    granted = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        mine = sum(bucket.try_acquire() for _ in range(60))
        with lock:
            granted.append(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 200
