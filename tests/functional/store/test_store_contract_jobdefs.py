"""Contract of :class:`gpufleet.store.jobdefs.JobDefinitions`, on the fake and on moto's Batch (with the
``ecsProperties`` patch, :func:`gpufleet.local.moto_patches.patch_batch_ecs_properties`).

``ensure`` registers a cloud container job's per-image definition once and reuses it; other content under the same
name (a new supervisor image) is a new revision; of several matching revisions (a race) the latest is taken.
"""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from gpufleet.batchdef import job_definition
from gpufleet.local.moto_patches import MOTO_CONFIG, patch_batch_ecs_properties
from gpufleet.store.fakes.jobdefs import MemoryJobDefinitions
from gpufleet.store.jobdefs import FINGERPRINT_TAG, BatchJobDefinitions, fingerprint, tagged

IMAGE = "registry.example.com/team/train@sha256:" + "ab" * 32


def request(supervisor: str = "platform/runtime:1") -> dict:
    return job_definition(
        prefix="gf",
        image=IMAGE,
        supervisor_image=supervisor,
        execution_role_arn="arn:aws:iam::123456789012:role/gf-exec",
        log_group="gf-jobs",
        region="us-east-1",
        timeout_s=3600,
    )


class MotoSide:
    def __init__(self, client) -> None:
        self.client = client
        self.defs = BatchJobDefinitions(client)

    def register(self, req: dict) -> str:
        return self.client.register_job_definition(**req)["jobDefinitionArn"]

    def active(self, name: str) -> list[dict]:
        return self.client.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]


class MemorySide:
    def __init__(self) -> None:
        self.defs = MemoryJobDefinitions()

    def register(self, req: dict) -> str:
        return self.defs.register(req)

    def active(self, name: str) -> list[dict]:
        return self.defs.revisions.get(name, [])


@pytest.fixture(params=["memory", "moto"])
def side(request, monkeypatch):
    if request.param == "memory":
        yield MemorySide()
        return
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    with mock_aws(config=MOTO_CONFIG), patch_batch_ecs_properties():
        yield MotoSide(boto3.client("batch", region_name="us-east-1"))


def test_ensure_registers_once_then_reuses_the_definition(side):
    req = request()
    arn = side.defs.ensure(req)
    assert side.defs.ensure(req) == arn
    [stored] = side.active(req["jobDefinitionName"])
    assert stored["jobDefinitionArn"] == arn
    assert stored["tags"][FINGERPRINT_TAG] == fingerprint(req)
    # what was registered is the multi-container definition itself: supervisor, tenant and gate, no task role
    task = stored["ecsProperties"]["taskProperties"][0]
    assert [c["name"] for c in task["containers"]] == ["supervisor", "tenant", "gate"]
    assert "taskRoleArn" not in task and task["containers"][1]["image"] == IMAGE


def test_other_content_under_the_same_name_is_a_new_revision(side):
    old, new = request("platform/runtime:1"), request("platform/runtime:2")
    assert old["jobDefinitionName"] == new["jobDefinitionName"]
    first = side.defs.ensure(old)
    second = side.defs.ensure(new)
    assert second != first and second.endswith(":2")
    assert side.defs.ensure(old) == first  # each content keeps its own revision
    assert len(side.active(old["jobDefinitionName"])) == 2


def test_a_registration_race_takes_the_latest_matching_revision(side):
    req = request()
    side.register(tagged(req))
    latest = side.register(tagged(req))  # another RunCloud registered the same content meanwhile
    assert side.defs.ensure(req) == latest
    assert len(side.active(req["jobDefinitionName"])) == 2  # nothing more registered
