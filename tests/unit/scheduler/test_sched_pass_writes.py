"""The pass's independent writes (preemption requests, backoffs, wait reasons) go out in parallel: every one is
tried even when one fails, results keep their order, and the first error is raised (gpufleet/scheduler/passes.py)."""

from __future__ import annotations

import threading
import time

import pytest

from gpufleet.errors import TransientError
from gpufleet.scheduler.passes import WRITE_PARALLELISM, _in_parallel


def test_results_keep_their_order_and_writes_overlap():
    active, most = [0], [0]
    lock = threading.Lock()

    def write(n):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.01)
        with lock:
            active[0] -= 1
        return n * 2

    assert _in_parallel(write, list(range(40))) == [n * 2 for n in range(40)]
    assert 1 < most[0] <= WRITE_PARALLELISM


@pytest.mark.parametrize("workers", [WRITE_PARALLELISM, 1])
def test_a_failed_write_does_not_skip_the_others_and_is_raised(workers):
    done = []

    def write(n):
        if n == 3:
            raise TransientError("throttled")
        done.append(n)

    with pytest.raises(TransientError):
        _in_parallel(write, list(range(10)), workers)
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_one_worker_writes_in_order_on_the_calling_thread():
    seen = []
    assert _in_parallel(lambda n: seen.append((n, threading.current_thread().name)) or n, [1, 2, 3], 1) == [1, 2, 3]
    assert seen == [(n, threading.current_thread().name) for n in (1, 2, 3)]


def test_none_or_one_write_runs_inline():
    assert _in_parallel(lambda n: n, []) == []
    assert _in_parallel(lambda n: threading.current_thread().name, [1]) == [threading.current_thread().name]
