"""JobItemReporter's background progress writes: the compute loop never waits on a round trip, and nothing is lost,
reordered or swallowed (gpufleet/runtime/reporter.py)."""

from __future__ import annotations

import threading

import pytest

from gpufleet.clock import SystemClock
from gpufleet.envelope import ExitCode
from gpufleet.errors import StaleEpoch, TransientError
from gpufleet.runtime.control import RunControl
from gpufleet.runtime.reporter import JobItemReporter


class Job:
    """The job-item adapter's ``set_progress``; ``gate`` holds every write until set."""

    epoch = 2

    def __init__(self, answer=None) -> None:
        self.writes: list[tuple[int, int]] = []
        self.gate = threading.Event()
        self.answer = answer if answer is not None else {}
        self.threads: set[str] = set()

    def set_progress(self, step: int, total: int):
        assert self.gate.wait(5)
        self.threads.add(threading.current_thread().name)
        self.writes.append((step, total))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_progress_returns_while_the_write_is_held_and_flush_waits_for_it():
    job = Job()
    rep = JobItemReporter(job, RunControl(), 0, clock=SystemClock(), background=True)
    rep.progress(1, 3)  # returns although the write cannot finish
    assert job.writes == []
    done = threading.Event()
    flusher = threading.Thread(target=lambda: (rep.flush(), done.set()))
    flusher.start()
    assert not done.wait(0.2)  # flush waits for the held write
    job.gate.set()
    assert done.wait(5)
    assert job.writes == [(1, 3)] and job.threads == {"progress-writer"}
    rep.close()


def test_steps_handed_during_a_write_fold_into_the_latest_and_the_last_step_is_always_written():
    job = Job()
    rep = JobItemReporter(job, RunControl(), 0, clock=SystemClock(), background=True)
    rep.progress(1, 10)
    for step in range(2, 11):
        rep.progress(step, 10)
    job.gate.set()
    rep.flush()
    assert job.writes[-1] == (10, 10)
    assert job.writes == sorted(job.writes) and len(job.writes) <= 3  # in order, folded
    rep.close()


@pytest.mark.parametrize(("answer", "code"), [({"cancel_requested": True}, ExitCode.CANCELLED),
                                              ({"preempt_requested": {"epoch": 2, "by": "job_x"}}, ExitCode.PREEMPTED),
                                              (StaleEpoch("stale", current_epoch=3), ExitCode.FENCED)])
def test_what_a_background_write_sees_stops_the_stage(answer, code):
    job, control = Job(answer), RunControl()
    job.gate.set()
    rep = JobItemReporter(job, control, 0, clock=SystemClock(), background=True)
    rep.progress(1, 4)
    rep.flush()
    assert control.stop_reason() is code
    rep.close()


def test_a_failed_write_is_raised_by_the_next_progress_as_the_write_itself_would_have_been():
    job = Job(TransientError("node API unreachable"))
    job.gate.set()
    rep = JobItemReporter(job, RunControl(), 0, clock=SystemClock(), background=True)
    rep.progress(1, 4)
    with pytest.raises(TransientError):
        rep.flush()
    rep.flush()  # raised once
    job.answer = TransientError("again")
    rep.progress(2, 4)
    for _ in range(500):  # until the writer has recorded the failure (white-box: the write ends off this thread)
        if rep._error is not None:
            break
        threading.Event().wait(0.01)
    with pytest.raises(TransientError):
        rep.progress(3, 4)
    rep.close()  # never raises


def test_without_background_the_write_happens_in_the_call():
    job = Job()
    job.gate.set()
    rep = JobItemReporter(job, RunControl(), 0, clock=SystemClock())
    rep.progress(1, 2)
    assert job.writes == [(1, 2)] and job.threads == {threading.current_thread().name}
