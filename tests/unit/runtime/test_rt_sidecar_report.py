"""A cloud supervisor's last call (gpufleet.runtime.sidecar.report_outcome): complete or fail, as an agent reports."""

from __future__ import annotations

import logging

import pytest

from gpufleet.envelope import ExitCode
from gpufleet.errors import StaleEpoch, TaskGone
from gpufleet.runtime.sidecar import report_outcome


class Api:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple] = []
        self.error = error

    def attempt(self, job_id, epoch, op, body=None):
        self.calls.append((job_id, epoch, op, body))
        if self.error:
            raise self.error
        return {}


class Job:
    def __init__(self, api: Api) -> None:
        self.api, self.job_id, self.epoch = api, "j1", 4


def test_success_completes_with_whole_gpu_seconds():
    api = Api()
    report_outcome(Job(api), ExitCode.SUCCEEDED, {}, 10.0, 0.5, logging.getLogger("t"))
    assert api.calls == [("j1", 4, "complete", {"gpu_seconds": 10.0})]  # a GPU share takes a whole GPU on Batch
    api = Api()
    report_outcome(Job(api), ExitCode.SUCCEEDED, {}, 10.0, 2, logging.getLogger("t"))
    assert api.calls[0][3] == {"gpu_seconds": 20.0}


def test_anything_else_fails_with_the_exit_code_name_and_detail():
    api = Api()
    report_outcome(Job(api), ExitCode.USER_ERROR, {"detail": "x" * 5000}, 3.0, 1, logging.getLogger("t"))
    ((_, _, op, body),) = api.calls
    assert op == "fail" and body["error"] == "USER_ERROR" and len(body["detail"]) == 4000


@pytest.mark.parametrize("error", [TaskGone("gone"), StaleEpoch("stale", current_epoch=5)])
def test_an_attempt_no_longer_this_supervisors_is_logged_not_raised(error, caplog):
    report_outcome(Job(Api(error)), ExitCode.SUCCEEDED, {}, 1.0, 1, logging.getLogger("t"))
    assert "no longer this supervisor's" in caplog.text
