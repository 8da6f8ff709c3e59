"""A FIFO thread pool with futures, on top of threading."""

import collections
import threading
import time

_PENDING, _RUNNING, _FINISHED, _CANCELLED = "pending", "running", "finished", "cancelled"


class CancelledError(Exception):
    pass


class Job:
    def __init__(self, fn, args, kwargs):
        self._fn, self._args, self._kwargs = fn, args, kwargs
        self._state = _PENDING
        self._result = None
        self._exc = None
        self._cond = threading.Condition()
        self._callbacks = []

    def _start(self):
        with self._cond:
            if self._state != _PENDING:
                return False
            self._state = _RUNNING
            return True

    def _run(self):
        try:
            result, exc = self._fn(*self._args, **self._kwargs), None
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            result, exc = None, e
        self._finish(_FINISHED, result, exc)

    def _finish(self, state, result=None, exc=None):
        with self._cond:
            self._state, self._result, self._exc = state, result, exc
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for cb in callbacks:
            self._call(cb)

    def _call(self, cb):
        try:
            cb(self)
        except Exception:
            pass

    def _wait(self, timeout):
        with self._cond:
            if not self._cond.wait_for(lambda: self._state in (_FINISHED, _CANCELLED), timeout):
                raise TimeoutError("job did not finish in time")
            if self._state == _CANCELLED:
                raise CancelledError("job was cancelled")

    def result(self, timeout=None):
        self._wait(timeout)
        if self._exc is not None:
            raise self._exc
        return self._result

    def exception(self, timeout=None):
        self._wait(timeout)
        return self._exc

    def done(self):
        return self._state in (_FINISHED, _CANCELLED)

    def running(self):
        return self._state == _RUNNING

    def cancelled(self):
        return self._state == _CANCELLED

    def cancel(self):
        with self._cond:
            if self._state == _CANCELLED:
                return True
            if self._state != _PENDING:
                return False
        self._finish(_CANCELLED)
        return True

    def add_done_callback(self, fn):
        with self._cond:
            if not self.done():
                self._callbacks.append(fn)
                return
        self._call(fn)


class WorkerPool:
    def __init__(self, workers):
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self._queue = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(workers)]
        for t in self._threads:
            t.start()

    def _worker(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                job = self._queue.popleft()
            if job._start():
                job._run()

    def submit(self, fn, *args, **kwargs):
        with self._cond:
            if self._closed:
                raise RuntimeError("pool is shut down")
            job = Job(fn, args, kwargs)
            self._queue.append(job)
            self._cond.notify()
        return job

    def map(self, fn, iterable, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        jobs = [self.submit(fn, x) for x in iterable]
        for job in jobs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            job._wait(left)
        return [job.result() for job in jobs]

    def shutdown(self, wait=True, cancel_pending=False):
        with self._cond:
            self._closed = True
            pending = list(self._queue) if cancel_pending else []
            self._cond.notify_all()
        for job in pending:
            job.cancel()
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown(wait=True)
