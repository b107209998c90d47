"""One control-plane write overlapping compute (gpufleet.runtime.overlap, pure threading)."""

from __future__ import annotations

import threading

import pytest

from gpufleet.errors import StaleEpoch
from gpufleet.runtime.overlap import Overlapped


def test_the_call_runs_at_once_beside_the_caller_and_its_value_is_returned_every_time():
    started, release = threading.Event(), threading.Event()

    def write() -> bool:
        started.set()
        release.wait(5)
        return True

    running = Overlapped(write)
    assert started.wait(5)  # in flight while the caller goes on (the first step computes)
    release.set()
    assert running.result() is True
    assert running.result() is True


def test_its_error_is_raised_by_every_result_and_never_by_wait():
    def fenced() -> bool:
        raise StaleEpoch("epoch 1 is not current", current_epoch=2)

    running = Overlapped(fenced)
    running.wait()  # the crash path: only waits
    for _ in range(2):
        with pytest.raises(StaleEpoch):
            running.result()
