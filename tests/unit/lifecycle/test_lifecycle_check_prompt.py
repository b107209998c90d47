"""CheckPrompt freezing the tenant's safety profile onto a job, over the in-memory stores (the profile store's and
the job store's contracts run on moto too)."""

from __future__ import annotations

import pytest

from gpufleet.errors import Cancelled
from gpufleet.lifecycle import steps
from gpufleet.lifecycle.settings import Deps
from gpufleet.safety.profile import SafetyProfile
from gpufleet.tables import SAFETY_SK, safety_profile_pk


@pytest.fixture
def deps(world) -> Deps:
    return world.deps


def put_profile(deps: Deps, tenant: str, version: int, **fields) -> None:
    """The profile item as the administration API stores it (``SAFETY#<tenant>`` / ``SAFETY``)."""
    profile = SafetyProfile(tenant=tenant, version=version, updated_at="2026-12-02T00:00:00.000Z", **fields)
    deps.safety.db.put(
        "control",
        {"pk": safety_profile_pk(tenant), "sk": SAFETY_SK, "type": "safety_profile", **profile.model_dump(mode="json")},
    )


def new_job(deps: Deps, tenant: str, kind: str = "video.generate") -> str:
    workload = (
        {"kind": "video.generate", "prompt": "a cat"}
        if kind == "video.generate"
        else {"kind": kind, "image": "busybox", "command": ["true"]}
    )
    return deps.jobs.create(tenant=tenant, team="t", user="u", spec={"workload": workload})["job_id"]


def test_check_prompt_freezes_the_tenant_profile_and_later_edits_do_not_change_it(deps):
    put_profile(deps, "kids-d", 1, frame_thresholds={"exposed_skin": 0.03}, max_frames=4)
    job = new_job(deps, "kids-d")
    assert steps.check_prompt(deps, {"job_id": job})["allowed"] is True
    frozen = deps.jobs.get(job)["safety"]
    assert frozen["source"] == "tenant" and frozen["profile_version"] == 1
    assert frozen["frame_thresholds"] == {"exposed_skin": 0.03} and frozen["max_frames"] == 4
    assert frozen["backend"] is None and frozen["resolved_at"]

    put_profile(deps, "kids-d", 2, frame_thresholds={"exposed_skin": 0.9})
    steps.check_prompt(deps, {"job_id": job})  # a retried task keeps what was frozen first
    assert deps.jobs.get(job)["safety"] == frozen
    (checked, *_) = [e for e in deps.jobs.events(job) if e["type"] == "prompt_checked"]
    assert checked["detail"]["safety_profile_version"] == 1

    later = new_job(deps, "kids-d")  # a job checked after the edit gets the new version
    steps.check_prompt(deps, {"job_id": later})
    safety = deps.jobs.get(later)["safety"]
    assert (safety["profile_version"], safety["frame_thresholds"]) == (2, {"exposed_skin": 0.9})


def test_check_prompt_without_a_profile_freezes_the_deployment_default(deps):
    job = new_job(deps, "plain-tenant")
    steps.check_prompt(deps, {"job_id": job})
    safety = deps.jobs.get(job)["safety"]
    assert (safety["source"], safety["profile_version"], safety["frame_thresholds"]) == ("default", 0, {})


def test_container_jobs_get_no_safety_settings(deps):
    job = new_job(deps, "kids-d", kind="container")
    assert steps.check_prompt(deps, {"job_id": job}) == {"allowed": True, "reason": None}
    assert "safety" not in deps.jobs.get(job)


def test_freeze_refuses_a_job_cancelled_meanwhile(deps):
    job = new_job(deps, "kids-e")
    item = deps.jobs.get(job)
    deps.jobs.db.put("jobs", {**item, "cancel_requested": True})  # a cancel requested before CheckPrompt ran
    with pytest.raises(Cancelled):
        steps.check_prompt(deps, {"job_id": job})
    assert "safety" not in deps.jobs.get(job)
