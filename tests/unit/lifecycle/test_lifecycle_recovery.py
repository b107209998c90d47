"""Operator recovery over the in-memory stores: finalize exhausted → refinalize → SUCCEEDED billed once; quarantine
→ release."""

from __future__ import annotations

import pytest

from gpufleet.errors import InvalidTransition, StaleEpoch
from gpufleet.jobrecord import JobRecord
from gpufleet.lifecycle import recovery, steps
from gpufleet.status import JobStatus as S


def _finalize_exhausted(world, job_id):
    deps = world.deps
    steps.await_placement(deps, job_id, "tok")
    p = world.place(job_id, target="cloud")
    state = {
        "job_id": job_id,
        "placement": p,
        "result": {"epoch": p["epoch"], "gpu_seconds": 3600.0, "generated": {"key": "g", "sha256": "x"}},
    }
    state["completed"] = {"value": steps.complete_run(deps, state)}
    state["error"] = {"Error": "States.TaskFailed", "Cause": "finalize host died"}
    assert steps.mark_terminal(deps, {"state": state}, "FAILED", "finalize")["status"] == "FAILED"
    billed = steps.bill(deps, job_id)
    assert billed["charged"] is False
    return p


def _plan(world, job_id, fn, by="arn:aws:iam::1:role/op"):
    item = world.deps.jobs.get(job_id)
    return fn(JobRecord.from_item(item), item, by=by, now=world.deps.clock.now())


def test_refinalize_reruns_finalize_publish_bill_only_and_charges_once(world):
    deps, job_id = world.deps, world.new_job()["job_id"]
    p = _finalize_exhausted(world, job_id)
    assert deps.ledger.waivers(job_id)[0]["waived_usd"] == "3.600000"
    recovery.apply(deps.jobs, _plan(world, job_id, recovery.plan_refinalize))
    with pytest.raises(InvalidTransition):  # a second operator's click: the job is FINALIZING now
        recovery.apply(deps.jobs, _plan(world, job_id, recovery.plan_refinalize))
    # the re-finalize run: ResumeFinalize → FinalizeStage → Publish → Bill, at the same epoch
    state = {"job_id": job_id, "run": 1, "resume": "finalize"}
    state["completed"] = {"value": steps.complete_run(deps, state)}
    assert state["completed"]["value"]["epoch"] == p["epoch"]
    assert state["completed"]["value"]["batch_job_name"] == f"{job_id}-e{p['epoch']}-finalize"
    assert "--envelope-json" in state["completed"]["value"]["finalize_command"]
    deps.jobs.fenced_update(job_id, p["epoch"], {"output": {"video_key": "v"}})
    assert steps.publish(deps, state)["status"] == "SUCCEEDED"
    assert steps.bill(deps, job_id)["ledger_entry_written"] is True
    (entry,) = deps.ledger.entries(job_id)
    assert entry["amount_usd"] == "3.600000" and entry["epoch"] == p["epoch"]
    item = deps.jobs.get(job_id)
    assert item["current_epoch"] == p["epoch"] and item["workflow_run"] == 1  # generation ran once: one epoch
    assert len(deps.jobs.attempts(job_id)) <= 1


def test_resume_refuses_a_job_that_moved_on(world):
    deps, job_id = world.deps, world.new_job()["job_id"]
    _finalize_exhausted(world, job_id)
    recovery.apply(deps.jobs, _plan(world, job_id, recovery.plan_refinalize))
    deps.jobs.issue_epoch(job_id, deps.jobs.get(job_id)["current_epoch"])
    with pytest.raises(StaleEpoch):
        steps.complete_run(deps, {"job_id": job_id, "resume": "finalize"})


def test_release_gives_a_fresh_budget_and_the_next_attempt_a_new_epoch(world):
    deps, job_id = world.deps, world.new_job()["job_id"]
    steps.await_placement(deps, job_id, "tok")
    p = world.place(job_id, target="cloud")
    deps.jobs.transition(
        job_id,
        [S.SCHEDULED],
        S.QUARANTINED,
        {"system_failures": 3, "crashed_workers": {"a", "b", "c"}, "final": {"outcome": "QUARANTINED"}},
    )
    recovery.apply(deps.jobs, _plan(world, job_id, recovery.plan_release))
    item = deps.jobs.get(job_id)
    assert item["status"] == "QUEUED" and item["system_failures"] == 0 and "crashed_workers" not in item
    # the new run parks it again and the scheduler's next placement gets a higher epoch
    steps.await_placement(deps, job_id, "tok-2")
    assert world.place(job_id, target="cloud")["epoch"] == p["epoch"] + 1
