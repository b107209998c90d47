"""Exit code + the agent's own decision → the SendTaskSuccess/Failure report (docs/contracts.md)."""

from __future__ import annotations

import json
import signal

import pytest

from gpufleet.envelope import ExitCode
from onprem_agent.outcome import Stop, build_report, classify, describe_returncode


@pytest.mark.parametrize(
    "rc, stop, expected",
    [
        (0, Stop.NONE, ExitCode.SUCCEEDED),
        (10, Stop.NONE, ExitCode.USER_ERROR),
        (20, Stop.NONE, ExitCode.SYSTEM_ERROR),
        (30, Stop.NONE, ExitCode.PREEMPTED),
        (50, Stop.NONE, ExitCode.FENCED),
        (1, Stop.NONE, ExitCode.SYSTEM_ERROR),  # a Python traceback
        (-signal.SIGSEGV, Stop.NONE, ExitCode.SYSTEM_ERROR),  # a crash
        (-signal.SIGKILL, Stop.CANCELLED, ExitCode.CANCELLED),
        (30, Stop.CANCELLED, ExitCode.CANCELLED),  # checkpointed on SIGTERM, but the user cancelled
        (30, Stop.DRAINED, ExitCode.PREEMPTED),
        (-signal.SIGKILL, Stop.DRAINED, ExitCode.PREEMPTED),  # did not checkpoint in time: still rescheduled
        (20, Stop.DRAINED, ExitCode.PREEMPTED),
        (0, Stop.DRAINED, ExitCode.SUCCEEDED),  # finished before it noticed the drain
        (-signal.SIGKILL, Stop.FENCED, ExitCode.FENCED),
    ],
)
def test_classify(rc, stop, expected):
    assert classify(rc, stop) is expected


def test_success_report_matches_the_contract():
    r = build_report(0, Stop.NONE, epoch=3, node="n1", gpu_seconds=12.34567, generated={"key": "k", "sha256": "s"})
    assert r.success and r.outcome == "SUCCEEDED"
    assert json.loads(r.output_json()) == {"epoch": 3, "gpu_seconds": 12.346, "generated": {"key": "k", "sha256": "s"}}


def test_failure_report_names_the_exit_code_and_says_why():
    r = build_report(-signal.SIGSEGV, Stop.NONE, epoch=2, node="n1", gpu_seconds=1.0)
    assert not r.success and r.error == "SYSTEM_ERROR" and r.error in ExitCode.__members__
    assert json.loads(r.cause_json()) == {"epoch": 2, "node": "n1", "detail": "killed by SIGSEGV"}
    assert describe_returncode(20) == "exit 20"
    assert describe_returncode(-200) == "killed by signal 200"
