"""What a node sees of its job (gpufleet.nodeapi.service.view): the fields its runtime needs, nothing of other jobs."""

from __future__ import annotations

from gpufleet.nodeapi.service import VIEW_FIELDS, view


def test_a_preemption_names_the_epoch_it_stops_never_the_job_it_makes_room_for():
    item = {"job_id": "job_a", "tenant": "t1", "status": "RUNNING", "current_epoch": 3, "spec": {"workload": {}},
            "preempt_requested": {"epoch": 3, "by": "job_of_another_tenant", "at": "2026-12-05T14:00:00.000Z"},
            "placement": {"node": "n1"}, "run_token": "secret"}
    seen = view(item)
    assert seen["preempt_requested"] == {"epoch": 3, "at": "2026-12-05T14:00:00.000Z"}
    assert set(seen) <= set(VIEW_FIELDS) and "job_of_another_tenant" not in repr(seen)
    assert item["preempt_requested"]["by"] == "job_of_another_tenant"  # the stored item is not changed


def test_the_view_keeps_only_its_fields():
    assert view({"job_id": "j", "status": "QUEUED", "tenant": "t", "spec": {}}) == {"job_id": "j", "status": "QUEUED"}
