"""The job view shows why a PENDING job waits (the scheduler's recorded reason), and only then."""

from __future__ import annotations

from gpufleet.api.models import JobView

BASE = {"job_id": "job_1", "tenant": "t", "team": "a", "user": "u", "spec": {}, "created_at": "c", "updated_at": "u",
        "sched_reason": "none of the job's pools (gpu-x) exists; pools: onprem-a", "sched_backoff_until": 1796032800.0}


def test_pending_job_shows_the_schedulers_reason_and_next_try():
    view = JobView.from_item({**BASE, "status": "PENDING"})
    assert view.scheduling.reason.startswith("none of the job's pools (gpu-x) exists")
    assert view.scheduling.retry_at == "2026-11-30T10:00:00.000Z"
    assert "sched_reason" not in view.model_dump()  # storage attribute names never leak


def test_the_stale_reason_of_a_job_that_moved_on_is_not_shown():
    for status in ("SCHEDULED", "RUNNING", "SUCCEEDED"):
        assert JobView.from_item({**BASE, "status": status}).scheduling is None
    assert JobView.from_item({**BASE, "status": "PENDING", "sched_reason": None}).scheduling is None
