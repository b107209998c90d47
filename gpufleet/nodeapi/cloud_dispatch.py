"""A cloud container job's dispatch: the per-image definition, the supervisor's token, ``SubmitJob`` — all off the state.

Why not ``batch:submitJob.sync`` with ``EcsPropertiesOverride.$``: a task's parameters are in the execution
history, and this override carries the supervisor's one-time token and the tenant's ``env`` values (ECS takes a
container's variables when it starts it, and ``TaskContainerOverrides`` has no ``secrets``), which the state
must never hold (tests/infra/test_infra_no_tenant_content_in_state.py). So a cloud container run is dispatched
like an on-prem one: a Lambda invoked with ``.waitForTaskToken`` does the work, the task token is kept on the
attempt item, and the supervisor answers it through the node API (``complete``/``fail``; its session reaches
exactly its attempt's routes: :mod:`gpufleet.nodeapi.supervisor`); ``HeartbeatSeconds`` catches a task that
dies without a word.

Contract: :func:`dispatch_cloud` takes the state's ``{"job_id", "token", "run", "batch"}`` (``run`` =
PrepareRun's output, ``batch`` = the ``UseSpotQueue``/``UseOnDemandQueue`` Pass state's ``{"job_queue"}``: the
queue ARN, a constant of the definition) and
- refuses (``NotAllowed``) a run whose envelope names another job, an attempt that is not a cloud placement on
  the run's queue name, and a workload that is not a container job with an image by digest;
- registers the image's definition once (:class:`gpufleet.store.jobdefs.JobDefinitions`,
  :func:`gpufleet.batchdef.job_definition`);
- stores, fenced on the job's epoch, the task token and the declared inputs
  (:meth:`~gpufleet.store.runs.RunStore.record_dispatch`), then the sha256 of a fresh supervisor token
  (:meth:`~gpufleet.store.runs.RunStore.record_cloud_dispatch`); a stale epoch raises ``StaleEpoch`` and
  nothing is submitted;
- only then submits the Batch job (``submit(**SubmitJob request)``) on the per-image definition with the
  attempt's ``ecsPropertiesOverride`` (:func:`gpufleet.batchdef.ecs_properties_override`: the supervisor gets
  :func:`supervisor_command` — the envelope with the spec but not the tenant's ``env`` values, since the node API
  never hands a spec out — the token and the node API's URL; the tenant its command and environment) and
  the attempt's ``timeout``. Returns ``{"dispatched": true, "epoch", "batch_job_id", "job_definition"}``: no
  token, no env.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet import batchdef
from gpufleet.clock import Clock
from gpufleet.envelope import Envelope
from gpufleet.errors import NotAllowed, NotFound
from gpufleet.nodeapi import supervisor
from gpufleet.placement import Placement
from gpufleet.spec import ContainerJob, JobSpec
from gpufleet.store.jobdefs import JobDefinitions
from gpufleet.store.runs import RunStore


@dataclass(frozen=True)
class CloudDispatchSettings:
    """What the per-image definitions and the supervisor need from the deployment."""

    prefix: str
    supervisor_image: str
    execution_role_arn: str
    log_group: str
    region: str
    node_api_url: str
    run_timeout_seconds: int
    grace_seconds: float = 30.0


def supervisor_command(env: Envelope, spec: JobSpec) -> list[str]:
    """The supervisor's command: the runtime with the attempt's envelope completed with the spec (as an on-prem node
    receives it: the node API never hands a spec out), less the tenant's ``env`` values, which only the tenant's
    container gets."""
    bare = spec.model_copy(update={"workload": spec.workload.model_copy(update={"env": {}})})
    full = env.with_spec(bare)
    return [
        "python",
        "-m",
        "gpufleet.runtime",
        "--envelope-json",
        full.model_dump_json(exclude_none=True, exclude={"task_token"}),
    ]


def dispatch_cloud(
    runs: RunStore,
    jobdefs: JobDefinitions,
    submit: Callable[..., dict[str, Any]],
    clock: Clock,
    settings: CloudDispatchSettings,
    event: dict[str, Any],
) -> dict[str, Any]:
    run = event["run"]
    env = Envelope.model_validate(run["envelope"])
    job_id, epoch, task_token = str(event["job_id"]), env.epoch, str(event["token"])
    if env.job_id != job_id:
        raise NotAllowed(f"envelope names job {env.job_id}, the state {job_id}")
    attempt = runs.attempt(job_id, epoch)
    placement = Placement.parse((attempt or {}).get("placement"))
    if placement is None or placement.target != "cloud" or run.get("job_queue") != placement.job_queue:
        raise NotAllowed(f"attempt {epoch} of {job_id} is not placed on queue {run.get('job_queue')!r}")
    job = runs.job(job_id)
    if job is None or "spec" not in job:
        raise NotFound(f"job {job_id} not found")
    spec = JobSpec.model_validate(job["spec"])
    w = spec.workload
    if not isinstance(w, ContainerJob) or not batchdef.DIGEST_REF.match(w.image):
        raise NotAllowed("a cloud container run needs a container job whose image is pinned by digest")
    s = settings
    request = batchdef.job_definition(
        prefix=s.prefix,
        image=w.image,
        supervisor_image=s.supervisor_image,
        execution_role_arn=s.execution_role_arn,
        log_group=s.log_group,
        region=s.region,
        timeout_s=s.run_timeout_seconds,
    )
    definition = jobdefs.ensure(request)
    inputs = tuple(spec.data.inputs)
    runs.record_dispatch(job_id, epoch, task_token, clock.now(), inputs)
    token, digest = supervisor.mint()
    runs.record_cloud_dispatch(job_id, epoch, digest, clock.now(), inputs)
    r = spec.resources
    override = batchdef.ecs_properties_override(
        supervisor_command=supervisor_command(env, spec),
        token=token,
        supervisor_env={"GPUFLEET_NODE_API_URL": s.node_api_url, "AWS_DEFAULT_REGION": s.region},
        tenant_command=list(w.command),
        tenant_env=batchdef.tenant_environment(
            w.env,
            job_id=job_id,
            attempt=env.attempt,
            epoch=epoch,
            resumed=bool(job.get("checkpoint")),
            grace_s=s.grace_seconds,
        ),
        gpus=r.gpus,
        cpu=r.cpu,
        memory_gb=r.memory_gb,
    )
    submitted = submit(
        jobName=str(run["batch_job_name"]),
        jobQueue=str(event["batch"]["job_queue"]),
        jobDefinition=definition,
        ecsPropertiesOverride=override,
        timeout={"attemptDurationSeconds": int(run["attempt_duration_seconds"])},
    )
    return {"dispatched": True, "epoch": epoch, "batch_job_id": submitted.get("jobId"), "job_definition": definition}
