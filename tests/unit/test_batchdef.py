"""The per-image multi-container Batch job definition of cloud container jobs (gpufleet.batchdef, pure)."""

from __future__ import annotations

import copy

import pytest

from gpufleet import batchdef

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/acme/train@sha256:" + "ab" * 32


def _definition() -> dict:
    return batchdef.job_definition(prefix="gpufleet", image=IMAGE, supervisor_image="platform/runtime@sha256:" + "cd" * 32,
                                   execution_role_arn="arn:aws:iam::123456789012:role/exec", log_group="jobs",
                                   region="us-east-1", timeout_s=3600)


def test_one_definition_per_image_digest():
    assert batchdef.definition_name("gpufleet", IMAGE) == batchdef.definition_name("gpufleet", IMAGE)
    other = IMAGE.replace("ab" * 32, "ef" * 32)
    assert batchdef.definition_name("gpufleet", IMAGE) != batchdef.definition_name("gpufleet", other)
    assert batchdef.definition_name("gpufleet", IMAGE).startswith("gpufleet-tenant-abababababababab-")
    with pytest.raises(ValueError, match="by digest"):
        batchdef.definition_name("gpufleet", "acme/train:latest")  # a tag can move


def test_tenant_container_runs_the_image_with_no_role_and_no_credentials():
    d = _definition()
    (task,) = d["ecsProperties"]["taskProperties"]
    assert "taskRoleArn" not in task  # ECS would hand a task role to every container
    by_name = {c["name"]: c for c in task["containers"]}
    tenant, supervisor = by_name["tenant"], by_name["supervisor"]
    assert tenant["image"] == IMAGE and tenant["essential"] is False
    assert tenant["user"] == batchdef.TENANT_USER and tenant["readonlyRootFilesystem"] and not tenant["privileged"]
    assert tenant["environment"] == [] and "secrets" not in tenant
    assert {"containerName": "supervisor", "condition": "HEALTHY"} in tenant["dependsOn"]
    assert {"type": "GPU", "value": "1"} in tenant["resourceRequirements"]
    inputs = [m for m in tenant["mountPoints"] if m["containerPath"] == "/job/inputs"]
    assert inputs and inputs[0]["readOnly"] is True
    assert supervisor["essential"] is True and supervisor["command"][:3] == ["python", "-m", "gpufleet.runtime"]
    assert batchdef.credential_exposure(d) == []


@pytest.mark.parametrize(("change", "found"), [
    (lambda t: t.update(taskRoleArn="arn:aws:iam::1:role/job"), "the task has a role"),
    (lambda t: t["containers"][1]["environment"].append({"name": "AWS_ACCESS_KEY_ID", "value": "x"}), "AWS_ACCESS_KEY_ID"),
    (lambda t: t["containers"][1].update(user="0"), "root"),
    (lambda t: t["containers"][1].update(privileged=True), "privileged"),
    (lambda t: t["containers"][1].update(readonlyRootFilesystem=False), "writable"),
])
def test_credential_exposure_names_each_way_in(change, found):
    d = copy.deepcopy(_definition())
    change(d["ecsProperties"]["taskProperties"][0])
    assert any(found in p for p in batchdef.credential_exposure(d))
