"""Tenant safety profiles on moto: versioned conditional writes, and the CheckPrompt Lambda freezing them onto a job
(the step's own cases run over the in-memory stores: tests/unit/lifecycle/test_lifecycle_check_prompt.py)."""

from __future__ import annotations

import pytest

from gpufleet.clock import FakeClock
from gpufleet.errors import ConfigError, Conflict, ValidationFailed
from gpufleet.store import jobs
from gpufleet.store.dynamo import marshal
from gpufleet.store.safety_profiles import get_profile, put_profile
from gpufleet.tables import TableNames

T = TableNames()
CLOCK = FakeClock()


def _job(aws, tenant: str, kind: str = "video.generate") -> dict:
    workload = {"kind": "video.generate", "prompt": "a cat"} if kind == "video.generate" else {
        "kind": kind, "image": "busybox", "command": ["true"]}
    return jobs.create_job(aws["dynamodb"], T, tenant=tenant, team="t", user="u", spec={"workload": workload},
                           clock=FakeClock())


def test_put_is_versioned_and_conditional(aws):
    ddb, clock = aws["dynamodb"], FakeClock(start=1_800_000_000.0)
    assert get_profile(ddb, T.control, "kids-a") is None
    v1 = put_profile(ddb, T.control, "kids-a", {"exposed_skin": 0.03}, expected_version=0, updated_by="ops@x",
                     clock=clock)
    assert v1.version == 1 and get_profile(ddb, T.control, "kids-a") == v1
    assert v1.updated_at == "2027-01-15T08:00:00.000Z" and v1.updated_by == "ops@x"

    with pytest.raises(Conflict, match="at version 1, not 0"):  # a second creator loses
        put_profile(ddb, T.control, "kids-a", {"exposed_skin": 0.5}, expected_version=0, clock=CLOCK)
    v2 = put_profile(ddb, T.control, "kids-a", {"exposed_skin": 0.05}, max_frames=16, expected_version=1, clock=CLOCK)
    with pytest.raises(Conflict) as lost:  # a writer that read v1 after v2 landed loses
        put_profile(ddb, T.control, "kids-a", {"exposed_skin": 0.9}, expected_version=1, clock=CLOCK)
    assert lost.value.extra["current_version"] == 2
    with pytest.raises(Conflict):  # no version can be skipped to
        put_profile(ddb, T.control, "kids-b", {"exposed_skin": 0.9}, expected_version=3, clock=CLOCK)
    got = get_profile(ddb, T.control, "kids-a")
    assert got == v2 and (got.version, got.frame_thresholds, got.max_frames) == (2, {"exposed_skin": 0.05}, 16)
    assert get_profile(ddb, T.control, "kids-b") is None


def test_invalid_profiles_are_never_written(aws):
    ddb = aws["dynamodb"]
    for thresholds, kw in (({"exposed_skin": 0.0}, {}), ({"exposed_skin": 1.5}, {}), ({"skin": 0.1}, {}),
                           ({}, {"backend": "nope"}), ({}, {"max_frames": 1})):
        with pytest.raises(ValidationFailed):
            put_profile(ddb, T.control, "kids-bad", thresholds, expected_version=0, **kw, clock=CLOCK)
    assert get_profile(ddb, T.control, "kids-bad") is None


def test_a_corrupt_stored_profile_fails_closed(aws):
    ddb = aws["dynamodb"]
    ddb.put_item(TableName=T.control, Item=marshal({"pk": "SAFETY#kids-corrupt", "sk": "SAFETY", "tenant": "kids-corrupt",
                                                    "frame_thresholds": {"exposed_skin": 7}, "version": 1,
                                                    "updated_at": "x"}))
    with pytest.raises(ConfigError):
        get_profile(ddb, T.control, "kids-corrupt")


def test_profile_item_leaves_the_tenant_defaults_item_alone(aws):
    ddb = aws["dynamodb"]
    ddb.put_item(TableName=T.control, Item=marshal({"pk": "TENANT#kids-c", "sk": "TENANT",
                                                    "placement_policy": "binpack"}))
    put_profile(ddb, T.control, "kids-c", {"exposed_skin": 0.1}, expected_version=0, clock=CLOCK)
    tenant = ddb.get_item(TableName=T.control, Key=marshal({"pk": "TENANT#kids-c", "sk": "TENANT"}))["Item"]
    assert tenant["placement_policy"] == {"S": "binpack"} and "frame_thresholds" not in tenant


def test_check_prompt_lambda_handler_freezes_the_profile(aws, monkeypatch):
    from lambdas.tasks import _deps, check_prompt

    monkeypatch.setenv("AWS_REGION", "us-east-1")
    put_profile(aws["dynamodb"], T.control, "kids-f", {"exposed_skin": 0.02}, expected_version=0, clock=CLOCK)
    job = _job(aws, "kids-f")
    _deps.override(prompt_check=lambda text: {"allowed": True, "reason": None}, release=lambda j, e: None)
    try:
        assert check_prompt.handler({"job_id": job["job_id"]})["allowed"] is True
    finally:
        _deps.reset()
    assert jobs.get_job(aws["dynamodb"], T.jobs, job["job_id"])["safety"]["frame_thresholds"] == {"exposed_skin": 0.02}
