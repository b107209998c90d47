"""RunControl's signal handling: repeated SIGTERMs (an orphan's parent-death signal, re-sent by the kernel) are
one stop request, never an exit without a checkpoint; the agent's cancel and time-limit signals (SIGUSR1, SIGUSR2)
are their own stops."""

from __future__ import annotations

import os
import signal

import pytest

from gpufleet.envelope import STOP_SIGNALS, ExitCode
from gpufleet.runtime.control import RunControl


def test_repeated_sigterms_are_one_preemption_request_and_do_not_exit():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        control = RunControl()
        control.install_signal_handlers()
        for _ in range(5):
            os.kill(os.getpid(), signal.SIGTERM)  # handled on this (main) thread before kill returns to Python
        assert control.stop_reason() is ExitCode.PREEMPTED
        assert control.detail == "signal SIGTERM"
        assert control.stop_event.is_set()
        control.request(ExitCode.FENCED, "later")  # the first reason stays
        assert control.stop_reason() is ExitCode.PREEMPTED
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_a_stop_requested_while_the_main_thread_holds_the_lock_does_not_deadlock():
    saved = signal.getsignal(signal.SIGTERM)
    try:
        control = RunControl()
        control.install_signal_handlers()
        with control._lock:  # the main thread inside request() when the signal arrives
            os.kill(os.getpid(), signal.SIGTERM)
        assert control.stop_reason() is ExitCode.PREEMPTED
    finally:
        signal.signal(signal.SIGTERM, saved)


@pytest.mark.parametrize("first, code", [(signal.SIGUSR1, ExitCode.CANCELLED), (signal.SIGUSR2, ExitCode.TIMED_OUT)])
def test_the_agents_cancel_and_time_limit_signals_are_their_stops_and_the_first_stop_signal_wins(first, code):
    assert STOP_SIGNALS[code] == first
    saved = {s: signal.getsignal(s) for s in (*STOP_SIGNALS.values(), signal.SIGINT)}
    try:
        control = RunControl()
        control.install_signal_handlers()
        os.kill(os.getpid(), first)
        os.kill(os.getpid(), signal.SIGTERM)  # a drain after it changes nothing
        assert control.stop_reason() is code and control.detail == f"signal {first.name}"
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_a_sigterm_stop_becomes_a_cancel_once_the_job_is_seen_cancelled_and_nothing_else_changes_it():
    """Batch's TerminateJob (the API's cancel) sends SIGTERM as a spot reclaim does: the job item's cancel refines
    a signal's PREEMPTED into CANCELLED; a scheduler's preemption, a fence or a time limit stays what it was."""
    saved = {s: signal.getsignal(s) for s in (*STOP_SIGNALS.values(), signal.SIGINT)}
    try:
        control = RunControl()
        control.install_signal_handlers()
        os.kill(os.getpid(), signal.SIGTERM)
        assert control.preempted_by_signal
        control.request(ExitCode.FENCED, "stale epoch")  # only a cancel refines it
        assert control.stop_reason() is ExitCode.PREEMPTED
        control.request(ExitCode.CANCELLED, "cancel requested")
        assert control.stop_reason() is ExitCode.CANCELLED and not control.preempted_by_signal
        assert control.detail == "cancel requested (after signal SIGTERM)"
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    for first in (ExitCode.PREEMPTED, ExitCode.TIMED_OUT, ExitCode.FENCED):  # not a signal's stop: first wins
        control = RunControl()
        control.request(first, "preempted by the scheduler for job-x")
        control.request(ExitCode.CANCELLED, "cancel requested")
        assert control.stop_reason() is first and not control.preempted_by_signal
