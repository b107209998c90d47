"""The AWS Batch job definition of a cloud container job: the tenant's image beside the platform's
supervisor, one definition per image digest (pure; the payload of ``batch:RegisterJobDefinition``).

Why one definition per image: a Batch job's image is fixed by its definition (``SubmitJob``
overrides reach a container's command, environment and resources, never its image), so running
the job's own image means a definition that names it. Definitions are keyed by the image's
digest (:func:`definition_name`), so each image is registered once and every later job reuses it;
a tag is never enough (it can move), which is why cloud container jobs must name
``repository@sha256:<digest>``.

Shape (``ecsProperties``, a multi-container ECS task on the GPU compute environments):

- ``supervisor``: the platform's runtime image, essential, ``python -m gpufleet.runtime`` with the
  envelope as a command override; it stages inputs into the shared ``job`` volume, restores the
  checkpoint directory, heartbeats, ships the tenant's log lines, uploads checkpoints and outputs
  and enforces fencing, as the on-prem supervisor does. It writes :data:`READY_FILE` once the job
  directory is ready.
- ``gate``: the supervisor's image again, not essential, the job volume only (read-only), no
  credentials and no platform logic: it waits for :data:`READY_FILE` and exits 0. Batch's ECS task
  containers have no ``healthCheck`` (botocore's model of ``TaskContainerProperties`` refuses one), so a
  tenant that ``dependsOn`` the supervisor being ``HEALTHY`` cannot be registered; the ``SUCCESS`` of a
  non-essential container is what Batch offers, hence this container. Its ``MEMORY``-only resource
  requirement (no ``VCPU`` of its own) is checked against botocore's model, not yet against AWS.
- ``tenant``: the job's image (by digest), started only when ``gate`` has exited 0; not
  essential (its exit ends the work, the supervisor then uploads and exits); non-root user,
  read-only root file system, no privileges, ``initProcessEnabled`` (signals reach the command),
  tmpfs ``/tmp``; the job directory mounted as on-prem (``/job/inputs`` read-only,
  ``/job/output``, ``/job/checkpoint``); its environment is only what the submission adds (the
  spec's ``env`` and the ``GPUFLEET_*`` contract); the one GPU of the job.
- **No task role.** ECS hands a task role's credentials to every container of the task (the
  agent injects ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` into each), so any task role would
  reach tenant code: the definition has none, and no container gets AWS credentials from ECS.
  Instance metadata is out of reach as well: the GPU compute environments' launch template
  requires IMDSv2 with a PUT response hop limit of 1, so a container behind the bridge cannot
  get a token (infra/compute.py). The supervisor reaches the platform the way an on-prem node
  does, through the server-checked node API with a credential scoped to its attempt, never with
  a role that can read other jobs.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

DIGEST_REF = re.compile(r"^(?P<repo>[a-z0-9][a-z0-9._/:-]*)@sha256:(?P<digest>[0-9a-f]{64})$")
#: the unprivileged user tenant code runs as (nobody:nogroup); never root
TENANT_USER = "65534:65534"
JOB_VOLUME = "job"
READY_FILE = "/job/.supervisor-ready"


def image_digest(image: str) -> str:
    """The sha256 digest of an image reference ``repo@sha256:<64 hex>``; ValueError for a tag-only reference."""
    m = DIGEST_REF.match(image)
    if not m:
        raise ValueError(f"cloud container jobs name their image by digest (repo@sha256:...), got {image!r}")
    return m.group("digest")


def definition_name(prefix: str, image: str) -> str:
    """``<prefix>-tenant-<first 16 hex of the digest>-<4 hex of the repository>``: one per image, stable."""
    digest = image_digest(image)
    repo = DIGEST_REF.match(image).group("repo")
    return f"{prefix}-tenant-{digest[:16]}-{hashlib.sha256(repo.encode()).hexdigest()[:4]}"


def job_definition(
    *, prefix: str, image: str, supervisor_image: str, execution_role_arn: str, log_group: str, region: str,
    timeout_s: int, gpus: int = 1, vcpus: int = 4, memory_mib: int = 15000,
) -> dict[str, Any]:
    """The ``RegisterJobDefinition`` request for ``image`` (see the module docstring)."""
    logging = {"logDriver": "awslogs", "options": {"awslogs-group": log_group, "awslogs-region": region,
                                                    "awslogs-stream-prefix": "tenant"}}
    mounts = [
        {"sourceVolume": JOB_VOLUME, "containerPath": "/job", "readOnly": False},
    ]
    tenant_mounts = [
        {"sourceVolume": "job-inputs", "containerPath": "/job/inputs", "readOnly": True},
        {"sourceVolume": "job-output", "containerPath": "/job/output", "readOnly": False},
        {"sourceVolume": "job-checkpoint", "containerPath": "/job/checkpoint", "readOnly": False},
    ]
    supervisor = {
        "name": "supervisor",
        "image": supervisor_image,
        "essential": True,
        "command": ["python", "-m", "gpufleet.runtime"],
        "environment": [{"name": "GPUFLEET_CONTAINER_SIDECAR", "value": "tenant"}],
        "mountPoints": mounts + [{"sourceVolume": v, "containerPath": f"/job/{v.split('-', 1)[1]}", "readOnly": False}
                                 for v in ("job-inputs", "job-output", "job-checkpoint")],
        "readonlyRootFilesystem": True,
        "privileged": False,
        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "1024"}],
        "logConfiguration": {**logging, "options": {**logging["options"], "awslogs-stream-prefix": "supervisor"}},
    }
    gate = {
        "name": "gate",
        "image": supervisor_image,
        "essential": False,
        "command": ["sh", "-c", f"until [ -f {READY_FILE} ]; do sleep 1; done"],
        "mountPoints": [{"sourceVolume": JOB_VOLUME, "containerPath": "/job", "readOnly": True}],
        "readonlyRootFilesystem": True,
        "privileged": False,
        "user": TENANT_USER,
        "resourceRequirements": [{"type": "MEMORY", "value": "32"}],
        "logConfiguration": {**logging, "options": {**logging["options"], "awslogs-stream-prefix": "gate"}},
    }
    tenant = {
        "name": "tenant",
        "image": image,
        "essential": False,
        "user": TENANT_USER,
        "readonlyRootFilesystem": True,
        "privileged": False,
        "environment": [],
        "mountPoints": tenant_mounts,
        "dependsOn": [{"containerName": "gate", "condition": "SUCCESS"}],
        "linuxParameters": {"initProcessEnabled": True,
                            "tmpfs": [{"containerPath": "/tmp", "size": 256, "mountOptions": ["noexec", "nosuid"]}]},
        "ulimits": [{"name": "nofile", "softLimit": 1024, "hardLimit": 1024},
                    {"name": "core", "softLimit": 0, "hardLimit": 0}],
        "resourceRequirements": [
            {"type": "VCPU", "value": str(max(1, vcpus - 1))},
            {"type": "MEMORY", "value": str(max(512, memory_mib - 1024))},
            *([{"type": "GPU", "value": str(gpus)}] if gpus else []),
        ],
        "logConfiguration": logging,
    }
    return {
        "jobDefinitionName": definition_name(prefix, image),
        "type": "container",
        "platformCapabilities": ["EC2"],
        "timeout": {"attemptDurationSeconds": int(timeout_s)},
        "retryStrategy": {"attempts": 1},
        "propagateTags": True,
        "tags": {"gpufleet:image-digest": image_digest(image)},
        "ecsProperties": {"taskProperties": [{
            # no taskRoleArn: see the module docstring; the execution role only pulls images and writes logs
            "executionRoleArn": execution_role_arn,
            "volumes": [{"name": v} for v in (JOB_VOLUME, "job-inputs", "job-output", "job-checkpoint")],
            "containers": [supervisor, tenant, gate],
        }]},
    }


def credential_exposure(definition: dict[str, Any]) -> list[str]:
    """Ways a definition would hand AWS credentials to its ``tenant`` container (empty = none): a task
    role, ``AWS_*`` variables or secrets on the tenant, a privileged or root tenant, host networking."""
    problems = []
    for task in definition.get("ecsProperties", {}).get("taskProperties", []):
        if task.get("taskRoleArn"):
            problems.append("the task has a role: ECS gives its credentials to every container, the tenant included")
        if task.get("networkConfiguration", {}).get("networkMode") == "host" or task.get("networkMode") == "host":
            problems.append("host networking: the tenant would share the instance's metadata route")
        for c in task.get("containers", []):
            if c.get("name") != "tenant":
                continue
            names = [e.get("name", "") for e in c.get("environment", [])] + [s.get("name", "") for s in c.get("secrets", [])]
            problems += [f"tenant variable {n}" for n in names if n.startswith("AWS_")]
            if c.get("secrets"):
                problems.append("tenant secrets")
            if c.get("privileged"):
                problems.append("privileged tenant")
            if not c.get("user") or c["user"].split(":")[0] in ("0", "root"):
                problems.append("tenant runs as root")
            if not c.get("readonlyRootFilesystem"):
                problems.append("tenant root file system is writable")
    return problems


def resource_requirements(gpus: float, cpu: float, memory_gb: float) -> list[dict[str, str]]:
    """The ``ContainerOverrides.ResourceRequirements`` of one Batch attempt: the GPUs, vCPUs and memory the
    spec books, so a job asking for 4 GPUs gets 4 (the job definitions default to 1). Batch counts whole
    GPUs and vCPUs, so a GPU share (``gpus`` < 1) takes one whole GPU there, and vCPUs round up."""
    return [{"Type": "GPU", "Value": str(max(1, math.ceil(gpus)))},
            {"Type": "VCPU", "Value": str(max(1, math.ceil(cpu)))},
            {"Type": "MEMORY", "Value": str(max(1, int(round(memory_gb * 1024))))}]


#: the node range of the gang (multi-node parallel) job definition: every node, open-ended, so SubmitJob's
#: ``NodeOverrides.NumNodes`` may set the node count (Batch requires an open upper bound for that)
GANG_NODE_RANGE = "0:"


def node_overrides(num_nodes: int, command: list[str], resources: list[dict[str, str]]) -> dict[str, Any]:
    """The ``NodeOverrides`` of a gang's ``SubmitJob`` (multi-node parallel jobs take no ``ContainerOverrides``):
    ``num_nodes`` nodes, node 0 the main node (the definition's), every node running ``command`` (the runtime
    with the attempt's pointer envelope; each node learns its rank from Batch's variables) with the same
    ``resources`` (:func:`resource_requirements`: a gang member's GPUs, vCPUs and memory)."""
    if num_nodes < 2:
        raise ValueError("a gang has at least two nodes")
    return {"NumNodes": int(num_nodes), "NodePropertyOverrides": [
        {"TargetNodes": GANG_NODE_RANGE, "ContainerOverrides": {"Command": list(command), "ResourceRequirements": resources}}]}


#: the smallest ``attemptDurationSeconds`` AWS Batch accepts
BATCH_MIN_ATTEMPT_SECONDS = 60
#: how long a cloud attempt may outlive the spec's ``max_run_seconds`` before Batch stops it: the runtime's own
#: stop at the limit (container grace, the last checkpoint and log uploads, the result) and the container's
#: start before the runtime's timer begins
ATTEMPT_MARGIN_SECONDS = 300


def attempt_duration_seconds(max_run_seconds: int | None, run_timeout_seconds: int) -> int:
    """The ``Timeout.attemptDurationSeconds`` of one Batch attempt (RunCloud's ``SubmitJob``): the spec's
    ``max_run_seconds`` plus :data:`ATTEMPT_MARGIN_SECONDS`, so an attempt whose runtime hangs past its limit is
    stopped by Batch too; never beyond the deployment's run timeout (the job definition's and RunCloud's own
    bound), nor below Batch's minimum of :data:`BATCH_MIN_ATTEMPT_SECONDS`. No ``max_run_seconds``: the run
    timeout."""
    limit = run_timeout_seconds if max_run_seconds is None else min(run_timeout_seconds,
                                                                   max_run_seconds + ATTEMPT_MARGIN_SECONDS)
    return max(BATCH_MIN_ATTEMPT_SECONDS, int(limit))


#: the supervisor container's one-attempt secret (``ecsPropertiesOverride`` of the supervisor only): what it
#: exchanges at the node API for its attempt's credentials; never in the tenant's environment
SUPERVISOR_TOKEN_ENV = "GPUFLEET_SUPERVISOR_TOKEN"
#: AWS credential variables: never in a container's override (the supervisor's identity is its token's session)
CREDENTIAL_VARIABLES = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                  "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                                  "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_PROFILE"})


def tenant_environment(spec_env: dict[str, str], *, job_id: str, attempt: int, epoch: int, resumed: bool,
                       grace_s: float) -> dict[str, str]:
    """The tenant container's whole environment on Batch: the spec's ``env`` and the ``GPUFLEET_*`` contract of the
    on-prem stage (docs/runtime.md), with this definition's paths (``/job/...``; ``/tmp`` is the scratch tmpfs).
    ``resumed``: the attempt starts from a checkpoint (known at submission: the job's checkpoint pointer)."""
    return {**spec_env, "GPUFLEET_JOB_ID": job_id, "GPUFLEET_ATTEMPT": str(attempt), "GPUFLEET_EPOCH": str(epoch),
            "GPUFLEET_CHECKPOINT_DIR": "/job/checkpoint", "GPUFLEET_INPUT_DIR": "/job/inputs",
            "GPUFLEET_OUTPUT_DIR": "/job/output", "GPUFLEET_SCRATCH_DIR": "/tmp",
            "GPUFLEET_RESUMED": "1" if resumed else "0", "GPUFLEET_GRACE_SECONDS": str(grace_s),
            "HOME": "/tmp", "TMPDIR": "/tmp"}


def ecs_properties_override(*, supervisor_command: list[str], token: str, tenant_command: list[str],
                            tenant_env: dict[str, str], gpus: float, cpu: float, memory_gb: float,
                            supervisor_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``SubmitJob`` ``ecsPropertiesOverride`` of one attempt on a per-image definition: the supervisor gets the
    envelope command and the attempt's token (:data:`SUPERVISOR_TOKEN_ENV`), the tenant its command, its
    environment (:func:`tenant_environment`) and the spec's GPUs/vCPUs/memory (:func:`resource_requirements`;
    the supervisor's own share stays the definition's). ValueError when the tenant's environment would carry an
    ``AWS_*`` variable or the token's name. ``supervisor_env``: more variables of the supervisor (the node API's
    URL, the region); never a credential (ValueError)."""
    bad = sorted(n for n in tenant_env if n.startswith("AWS_") or n == SUPERVISOR_TOKEN_ENV)
    if bad:
        raise ValueError(f"the tenant's environment may not name {bad}")
    extra = dict(supervisor_env or {})
    creds = sorted(n for n in extra if n in CREDENTIAL_VARIABLES or n == SUPERVISOR_TOKEN_ENV)
    if creds:
        raise ValueError(f"the supervisor's extra environment may not name {creds}")
    tenant_res = [{"type": r["Type"], "value": r["Value"]} for r in resource_requirements(gpus, cpu, memory_gb)]
    return {"taskProperties": [{"containers": [
        {"name": "supervisor", "command": list(supervisor_command),
         "environment": [{"name": SUPERVISOR_TOKEN_ENV, "value": token},
                         *({"name": k, "value": str(v)} for k, v in sorted(extra.items()))]},
        {"name": "tenant", "command": list(tenant_command),
         "environment": [{"name": k, "value": str(v)} for k, v in sorted(tenant_env.items())],
         "resourceRequirements": tenant_res},
    ]}]}
