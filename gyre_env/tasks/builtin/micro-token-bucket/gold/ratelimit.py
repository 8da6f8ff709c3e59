"""A thread-safe token-bucket rate limiter."""

import threading
import time


class TokenBucket:
    def __init__(self, rate, capacity, clock=time.monotonic, sleep=time.sleep):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise ValueError(f"rate must be a number > 0, got {rate!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self._rate = float(rate)
        self._capacity = capacity
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(capacity)
        self._last = clock()

    def _refill(self):
        now = self._clock()
        if now > self._last:
            self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
            self._last = now
        return now

    def _check(self, n):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self._capacity:
            raise ValueError(f"n must be an int in [1, {self._capacity}], got {n!r}")

    def available(self):
        with self._lock:
            self._refill()
            return self._tokens

    def try_acquire(self, n=1):
        self._check(n)
        with self._lock:
            self._refill()
            if self._tokens >= n:
                self._tokens -= n
                return True
            return False

    def acquire(self, n=1, timeout=None):
        self._check(n)
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            with self._lock:
                now = self._refill()
                if self._tokens >= n:
                    self._tokens -= n
                    return True
                wait = (n - self._tokens) / self._rate
            if deadline is not None:
                left = deadline - now
                if left <= 0:
                    return False
                wait = min(wait, left)
            self._sleep(wait)
