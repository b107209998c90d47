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
    # the tenant starts once the supervisor's job directory is ready: the gate container waits for it and exits 0
    assert tenant["dependsOn"] == [{"containerName": "gate", "condition": "SUCCESS"}]
    gate = by_name["gate"]
    assert gate["essential"] is False and batchdef.READY_FILE in " ".join(gate["command"])
    assert gate["mountPoints"] == [{"sourceVolume": "job", "containerPath": "/job", "readOnly": True}]
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


def test_the_definition_is_a_valid_register_job_definition_request():
    """botocore's Batch model accepts it (Batch's ECS task containers have no healthCheck: a HEALTHY dependency
    could never be registered)."""
    import botocore.session
    from botocore.validate import ParamValidator

    model = botocore.session.get_session().get_service_model("batch")
    report = ParamValidator().validate(_definition(), model.operation_model("RegisterJobDefinition").input_shape)
    assert not report.has_errors(), report.generate_report()


def _override(**kw) -> dict:
    env = batchdef.tenant_environment({"EPOCHS": "3"}, job_id="job_1", attempt=2, epoch=2, resumed=True, grace_s=10)
    args = dict(supervisor_command=["python", "-m", "gpufleet.runtime", "--envelope-json", "{}"], token="s3cret",
                tenant_command=["python", "train.py"], tenant_env=env, gpus=4, cpu=8, memory_gb=30)
    return batchdef.ecs_properties_override(**{**args, **kw})


def test_the_override_gives_the_token_to_the_supervisor_only_and_the_gpus_to_the_tenant():
    by_name = {c["name"]: c for c in _override()["taskProperties"][0]["containers"]}
    assert set(by_name) == {"supervisor", "tenant"}  # the gate runs as defined
    sup, tenant = by_name["supervisor"], by_name["tenant"]
    assert sup["environment"] == [{"name": batchdef.SUPERVISOR_TOKEN_ENV, "value": "s3cret"}]
    env = {e["name"]: e["value"] for e in tenant["environment"]}
    assert "s3cret" not in env.values() and not any(n.startswith("AWS_") for n in env)
    assert env["EPOCHS"] == "3" and env["GPUFLEET_JOB_ID"] == "job_1" and env["GPUFLEET_RESUMED"] == "1"
    assert env["GPUFLEET_OUTPUT_DIR"] == "/job/output" and tenant["command"] == ["python", "train.py"]
    assert {"type": "GPU", "value": "4"} in tenant["resourceRequirements"]


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", batchdef.SUPERVISOR_TOKEN_ENV])
def test_the_override_refuses_credentials_in_the_tenant_environment(name):
    with pytest.raises(ValueError, match=name):
        _override(tenant_env={name: "x"})


def test_the_override_is_a_valid_submit_job_request():
    import botocore.session
    from botocore.validate import ParamValidator

    model = botocore.session.get_session().get_service_model("batch")
    request = {"jobName": "j", "jobQueue": "q", "jobDefinition": "d", "ecsPropertiesOverride": _override()}
    report = ParamValidator().validate(request, model.operation_model("SubmitJob").input_shape)
    assert not report.has_errors(), report.generate_report()
