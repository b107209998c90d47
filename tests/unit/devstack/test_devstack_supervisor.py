"""The embedded stack's lifecycle helpers: ordered start, reverse stop, rollback, and the pass timer."""

from __future__ import annotations

import threading

import pytest

from gpufleet.devstack.supervisor import Supervisor
from gpufleet.devstack.timer import Periodic


class Part:
    def __init__(self, name, log, fail_start=False, fail_stop=False):
        self.name, self.log, self.fail_start, self.fail_stop = name, log, fail_start, fail_stop

    def start(self):
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.log.append(("start", self.name))

    def stop(self):
        self.log.append(("stop", self.name))
        if self.fail_stop:
            raise RuntimeError(f"{self.name} stuck")

    def describe(self):
        return {}


def test_starts_in_order_and_stops_in_reverse_reporting_failures():
    log = []
    sup = Supervisor([Part("moto", log), Part("gateway", log, fail_stop=True), Part("agent", log)])
    sup.start()
    failures = sup.stop()
    assert log == [
        ("start", "moto"),
        ("start", "gateway"),
        ("start", "agent"),
        ("stop", "agent"),
        ("stop", "gateway"),
        ("stop", "moto"),
    ]
    assert [(n, str(e)) for n, e in failures] == [("gateway", "gateway stuck")]
    assert sup.stop() == []  # idempotent: nothing left to stop


def test_a_failed_start_rolls_back_what_started():
    log = []
    sup = Supervisor([Part("moto", log), Part("gateway", log), Part("agent", log, fail_start=True)])
    with pytest.raises(RuntimeError, match="agent cannot start"):
        sup.start()
    assert log == [("start", "moto"), ("start", "gateway"), ("stop", "gateway"), ("stop", "moto")]


def test_periodic_runs_survives_errors_and_stops():
    calls = []
    done = threading.Event()

    def fn():
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("pass failed")
        if len(calls) >= 4:
            done.set()

    timer = Periodic("scheduler-pass", fn, interval_s=0.01)
    timer.start()
    assert done.wait(5)
    timer.stop()
    n = len(calls)
    assert timer.errors == 1 and timer.last_error == "ValueError: pass failed"
    assert not timer._thread.is_alive() and len(calls) == n


def test_kick_runs_a_pass_before_the_interval():
    ran = threading.Event()
    count = []

    def fn():
        count.append(1)
        if len(count) == 2:
            ran.set()

    timer = Periodic("t", fn, interval_s=60)
    timer.start()
    timer.kick()
    assert ran.wait(5)
    timer.stop()


def test_scheduler_timer_backs_off_while_passes_find_nothing_to_do():
    from gpufleet.devstack.components import SchedulerTimer, pass_did_work

    idle = {"skipped": False, "pending": 300, "placed": 0, "preempted": 0, "expired": 0, "lost": 0, "backoffs": 0}
    reports = [idle, idle, idle, idle, idle, {**idle, "placed": 1}, idle, {**idle, "skipped": True}, idle,
               {**idle, "lost": 2}, idle, ValueError("pass failed"), idle]
    timer = SchedulerTimer(lambda: None, interval_s=1.0, idle_max_s=8.0)

    def run_pass():
        r = reports.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    timer._run_pass = run_pass
    periods = []
    while reports:
        try:
            timer._tick()
        except ValueError:
            pass
        periods.append(timer.timer.interval_s)
    # doubles up to the bound while idle; back to the period after a pass that changed something, a skipped
    # pass (another pass held the lease) or a failed one
    assert periods == [2, 4, 8, 8, 8, 1, 2, 1, 2, 1, 2, 1, 2]
    assert pass_did_work(None) and pass_did_work({**idle, "expired": 1}) and not pass_did_work(idle)
    assert not pass_did_work({**idle, "backoffs": 30})  # re-examined and backed off again: no progress
    assert SchedulerTimer(lambda: None, interval_s=2.0).idle_max_s == 2.0  # no bound given: no backoff
    assert "up to 8s" in timer.describe()["scheduler pass"]
