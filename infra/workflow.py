"""The job lifecycle as a Step Functions (Standard) definition, built with aws_cdk.aws_stepfunctions(-tasks).

Contract:
- :func:`build_definition` returns the start state of the chain; :func:`lifecycle_state_machine`
  wraps it in a ``StateMachine``. The orchestration stack passes the task Lambdas (keys of
  :data:`REQUIRED_FUNCTIONS`), the Batch finalize queue/definition and the timeouts, which come
  from CDK context (``gpufleet:heartbeat_seconds`` and friends) so that tests run in seconds.
- JSONPath only (moto stubs JSONata). Every Lambda task gets the whole state (``$``) as its
  payload and writes its result to one path; nothing reads a path that may be absent.
- State names are part of the contract (docs/contracts.md, docs/lifecycle.md); tests and
  the template assertions look them up by name.
- Both ``States.Timeout`` and ``States.HeartbeatTimeout`` are caught (moto reports a heartbeat
  timeout as the former). Cancellation: every task Lambda raises ``Cancelled`` once the job has
  ``cancel_requested``; parked tokens are failed by ``gpufleet.lifecycle.cancel.propagate``;
  the Catch routes to ``ClassifyFailure``, which records CANCELLED.
- On-prem runs: ``RunOnPrem`` invokes the ``dispatch_onprem`` Lambda with ``.waitForTaskToken``; it
  stores the task token on the attempt item and sends the node's queue the envelope without it
  (:mod:`gpufleet.nodeapi.dispatch`). The node answers through the node API, which checks the
  attempt is the node's at the current epoch and only then uses the token. ``HeartbeatSeconds``
  times out a silent node.
- Cloud runs never take a Batch queue or job definition from the state: ``RouteTarget`` compares the
  placement's ``job_queue`` with the platform's GPU queue names (:class:`CloudTarget`) and a Pass
  state (``UseSpotQueue`` / ``UseOnDemandQueue``) writes that queue's ARN and the GPU job definition,
  both constants of this definition, to ``$.batch``, which ``RunCloud`` submits to; any other queue
  goes to ``MarkFailed``. The two Batch tasks are written as ASL (``CustomState``) so that no IAM
  statement is generated for them: the state machine role names the exact queues and definitions
  (infra/orchestration.py).
- Cloud container jobs (``CloudWorkload``: PrepareRun's ``workload`` is ``container``) run as ``RunCloudContainer``
  instead of ``RunCloud``: the ``dispatch_cloud`` Lambda invoked with ``.waitForTaskToken`` and the payload
  ``{"job_id", "token", "run", "batch"}`` (:mod:`gpufleet.nodeapi.cloud_dispatch`) registers the image's
  per-digest definition, stores the task token and the supervisor token's hash on the attempt and submits the
  multi-container Batch job itself, so neither token nor the tenant's ``env`` is ever a task parameter (the
  execution history holds none). The supervisor answers the token through the node API (task heartbeats,
  ``complete``/``fail``); ``HeartbeatSeconds`` is ``cloud_heartbeat_seconds`` (Batch must first find capacity and
  start the task), and a silent or failed run goes to ``ClassifyFailure`` as RunCloud's does. Video jobs keep
  ``RunCloud`` (``.sync``), gangs ``RunCloudGang``.
- Cloud gangs (a placement with ``members`` on the gang queue, docs/scheduler.md): ``RouteTarget`` sends the
  gang queue to ``UseGangQueue`` (its ARN, constant) and ``CloudGang`` sends a run with ``node_overrides`` (PrepareRun
  gives one to a cloud gang) to ``RunCloudGang``; a gang on another queue goes to ``MarkFailed`` (no other queue
  can run a multi-node parallel job), a single-node run on the gang queue to ``RunCloud``. ``RunCloudGang``
  submits one multi-node parallel job with the gang definition (constant) and the run's ``NodeOverrides``
  through the AWS SDK integration (``aws-sdk:batch:submitJob``: the optimized ``batch:submitJob.sync``
  integration documents no ``NodeOverrides``), then ``WaitForGang``/``PollGang`` (``aws-sdk:batch:describeJobs``
  every ``gang_poll_seconds``) until the job ends: SUCCEEDED puts its description at ``$.result`` (what
  ``.sync`` gives RunCloud) → CompleteRun; FAILED becomes ``$.error`` ``States.TaskFailed`` with the description
  as cause (as ``.sync`` reports it) → ClassifyFailure. Past the run timeout (``GangPolls`` counts the looks)
  ``StopGang`` terminates the job and the run fails ``States.Timeout``. The gang's members are the job's nodes
  (``<job id>#<index>``); cancel terminates the job by name like any cloud run, which stops every node.
- The workload kind decides what follows a successful run (``WorkloadKind`` on CompleteRun's
  ``workload``): video jobs go through ``FinalizeRoute`` to the finalize stage (moderation, watermark, C2PA) and
  then ``Publish``: a clip whose ``finalize_pixels`` (frames × delivered pixels, :mod:`gpufleet.finalize_route`) is
  at most ``finalize_lambda_max_pixels`` runs in ``FinalizeLambda`` (the container-image ``finalize`` function,
  warm between jobs, with the same command and so the same stage code, fencing and result), any other (or a state
  without the figure) in ``FinalizeStage`` (``batch:submitJob.sync`` on the CPU queue). Both have the same
  ``Retry`` (``States.ALL``, the finalize interval, attempts and back-off) and ``Catch`` (``MarkFinalizeFailed``); container jobs go through ``CollectOutputs`` (the files the job published, checked
  against the per-job cap) to the same fenced ``Publish``. An ``OutputTooLarge`` (the job's own
  failure) and a cancellation go to ``ClassifyFailure``; any other CollectOutputs error, after the
  Lambda retries, to ``MarkFinalizeFailed`` (a system failure; the run is never repeated for it).
  Both kinds share every other state, so fencing, retries, quarantine, billing and cancellation
  are the same. CheckPrompt runs for both: for a container job (no prompt) it only checks the job
  is not cancelled and answers ``allowed``.
- Every path ends in ``Bill`` → ``Notify`` → ``JobEnded``: the execution ends FAILED when Notify reports the
  job FAILED (Fail state ``JobFailed``, error ``JobFailed``; finalize-failed jobs included) or QUARANTINED
  (``JobQuarantined``, error ``JobQuarantined``), each cause naming the status, else SUCCEEDED (``Done``), so the
  state machine's ExecutionsFailed metric counts failed jobs (REJECTED, BLOCKED and CANCELLED jobs end
  ``Done``: the workflow did what it should).
- Operator recovery (gpufleet.lifecycle.recovery): ``StartOrResume`` is the first state. A run
  started with ``"resume": "finalize"`` (a re-finalize) goes to ``ResumeFinalize`` (the CompleteRun
  function, which rebuilds ``$.completed`` from the job's persisted generation at its current epoch)
  and on to ``WorkloadKind`` → FinalizeStage/CollectOutputs → Publish → Bill: the run is not repeated.
  Every other run (a new job, a released quarantined one) starts at ``CheckPrompt``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import Aws, Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from gpufleet.finalize_route import LAMBDA_MAX_PIXELS

#: Lambda keys the definition needs (handlers in lambdas/tasks/<key>.py).
REQUIRED_FUNCTIONS = (
    "check_prompt",
    "await_placement",
    "prepare_run",
    "dispatch_onprem",
    "dispatch_cloud",
    "complete_run",
    "collect_outputs",
    "classify_failure",
    "mark_terminal",
    "publish",
    "bill",
    "notify",
    "finalize",
)

#: State names (stable; referenced by docs, tests and template assertions).
STATES = (
    "StartOrResume",
    "ResumeFinalize",
    "CheckPrompt",
    "PromptAllowed",
    "MarkRejected",
    "AwaitPlacement",
    "PrepareRun",
    "RouteTarget",
    "UseSpotQueue",
    "UseOnDemandQueue",
    "RunOnPrem",
    "CloudWorkload",
    "RunCloud",
    "RunCloudContainer",
    "CompleteRun",
    "ClassifyFailure",
    "RetryOrStop",
    "Backoff",
    "WorkloadKind",
    "CollectOutputs",
    "FinalizeRoute",
    "FinalizeLambda",
    "FinalizeStage",
    "MarkFinalizeFailed",
    "MarkFailed",
    "Publish",
    "Bill",
    "Notify",
    "JobEnded",
    "JobFailed",
    "JobQuarantined",
    "Done",
)

#: Job statuses whose execution ends FAILED → the Fail state (its name is also its error); every other end is ``Done``.
FAILED_JOB_STATUSES = {"FAILED": "JobFailed", "QUARANTINED": "JobQuarantined"}

TIMEOUT_ERRORS = ["States.Timeout", "States.HeartbeatTimeout"]
LAMBDA_TRANSIENT = [
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.TooManyRequestsException",
    "TransientError",
]


@dataclass(frozen=True)
class WorkflowTimeouts:
    """Seconds; production defaults, tests pass single digits through CDK context."""

    heartbeat_seconds: int = 120
    #: RunCloudContainer's HeartbeatSeconds: its first beat comes once Batch has started the task and the supervisor
    #: exchanged its token (capacity, instance start, image pulls), so it is longer than an on-prem node's
    cloud_heartbeat_seconds: int = 900
    placement_timeout_seconds: int = 7 * 24 * 3600
    run_timeout_seconds: int = 24 * 3600
    finalize_timeout_seconds: int = 3600
    finalize_retry_interval_seconds: int = 5
    finalize_max_attempts: int = 3
    finalize_retry_backoff_rate: float = 2.0
    #: FinalizeRoute's bound: frames × delivered pixels of a clip FinalizeLambda takes (gpufleet.finalize_route)
    finalize_lambda_max_pixels: int = LAMBDA_MAX_PIXELS


@dataclass(frozen=True)
class FinalizeTarget:
    """The CPU Batch queue and job definition of the finalize stage (names or ARNs)."""

    job_queue: str
    job_definition: str


@dataclass(frozen=True)
class CloudTarget:
    """The platform's GPU queues (name as pools name them, and ARN) and the GPU job definition (ARN)."""

    spot_queue_name: str
    spot_queue_arn: str
    ondemand_queue_name: str
    ondemand_queue_arn: str
    job_definition: str
    #: the gang queue and its multi-node parallel job definition (cloud gangs; empty: none)
    gang_queue_name: str = ""
    gang_queue_arn: str = ""
    gang_job_definition: str = ""
    gang_poll_seconds: int = 30


#: the Batch job states that end a multi-node parallel job
GANG_DONE = ("SUCCEEDED", "FAILED")


def gang_submit_state(*, definition: str, partition: str = Aws.PARTITION) -> dict:
    """RunCloudGang's ASL: one multi-node parallel job, the run's NodeOverrides and attempt duration; the job's id
    and a poll count of 0 at ``$.gang_job``."""
    return {
        "Type": "Task",
        "Resource": f"arn:{partition}:states:::aws-sdk:batch:submitJob",
        "Parameters": {
            "JobName.$": "$.run.value.batch_job_name",
            "JobQueue.$": "$.batch.job_queue",
            "JobDefinition": definition,
            "NodeOverrides.$": "$.run.value.node_overrides",
            "Timeout": {"AttemptDurationSeconds.$": "$.run.value.attempt_duration_seconds"},
        },
        "ResultSelector": {"JobId.$": "$.JobId", "polls": 0},
        "ResultPath": "$.gang_job",
    }


def gang_poll_state(partition: str = Aws.PARTITION) -> dict:
    """PollGang's ASL: the multi-node parallel job's description at ``$.gang_poll.job``."""
    return {
        "Type": "Task",
        "Resource": f"arn:{partition}:states:::aws-sdk:batch:describeJobs",
        "Parameters": {"Jobs.$": "States.Array($.gang_job.JobId)"},
        "ResultSelector": {"job.$": "$.Jobs[0]"},
        "ResultPath": "$.gang_poll",
    }


def _gang_run(scope: Construct, cloud: CloudTarget, *, run_timeout_s: int, complete: sfn.IChainable,
              classify: sfn.IChainable) -> sfn.IChainable:
    """RunCloudGang and its poll loop (module contract); returns the submit state."""
    submit = sfn.CustomState(scope, "RunCloudGang", state_json=gang_submit_state(definition=cloud.gang_job_definition))
    wait = sfn.Wait(scope, "WaitForGang", time=sfn.WaitTime.duration(Duration.seconds(cloud.gang_poll_seconds)))
    count = sfn.Pass(scope, "GangPolls", parameters={
        "JobId.$": "$.gang_job.JobId", "polls.$": "States.MathAdd($.gang_job.polls, 1)"}, result_path="$.gang_job")
    poll = sfn.CustomState(scope, "PollGang", state_json=gang_poll_state())
    stop = sfn.CustomState(scope, "StopGang", state_json={
        "Type": "Task", "Resource": f"arn:{Aws.PARTITION}:states:::aws-sdk:batch:terminateJob",
        "Parameters": {"JobId.$": "$.gang_job.JobId", "Reason": "the run timeout passed"}, "ResultPath": None})
    timed_out = sfn.Pass(scope, "GangTimedOut", parameters={
        "Error": "States.Timeout", "Cause": "the gang's multi-node parallel job outlived the run timeout"},
        result_path="$.error")
    succeeded = sfn.Pass(scope, "GangSucceeded", input_path="$.gang_poll.job", result_path="$.result")
    failed = sfn.Pass(scope, "GangFailed", parameters={
        "Error": "States.TaskFailed", "Cause.$": "States.JsonToString($.gang_poll.job)"}, result_path="$.error")
    for task in (submit, poll, stop):
        task.add_catch(classify, errors=["States.ALL"], result_path="$.error")
    polls_max = max(1, -(-run_timeout_s // cloud.gang_poll_seconds))
    submit.next(wait)
    wait.next(count)
    count.next(sfn.Choice(scope, "GangOverdue")
               .when(sfn.Condition.number_greater_than("$.gang_job.polls", polls_max), stop)
               .otherwise(poll))
    stop.next(timed_out)
    timed_out.next(classify)
    poll.next(sfn.Choice(scope, "GangEnded")
              .when(sfn.Condition.string_equals("$.gang_poll.job.Status", GANG_DONE[0]), succeeded)
              .when(sfn.Condition.string_equals("$.gang_poll.job.Status", GANG_DONE[1]), failed)
              .otherwise(wait))
    succeeded.next(complete)
    failed.next(classify)
    return submit


def _batch_submit(scope: Construct, state: str, *, job_name: str, queue: str, definition: str, command: str,
                  timeout_s: int, result_path: str, resources: str | None = None,
                  attempt_duration: str | None = None) -> sfn.CustomState:
    """A ``batch:submitJob.sync`` task as ASL. ``queue``/``definition``: a JSONPath (``$.``...) or a value;
    ``resources``: a JSONPath to the attempt's ``ResourceRequirements`` overrides (GPUs, vCPUs, memory);
    ``attempt_duration``: a JSONPath to the attempt's ``Timeout.AttemptDurationSeconds`` (Batch stops the
    attempt past it; without it the job definition's timeout applies)."""

    def field(name: str, value: str) -> dict:
        return {f"{name}.$": value} if value.startswith("$.") else {name: value}

    return sfn.CustomState(
        scope,
        state,
        state_json={
            "Type": "Task",
            "Resource": f"arn:{Aws.PARTITION}:states:::batch:submitJob.sync",
            "Parameters": {
                "JobName.$": job_name,
                **field("JobQueue", queue),
                **field("JobDefinition", definition),
                "ContainerOverrides": {"Command.$": command,
                                       **({"ResourceRequirements.$": resources} if resources else {})},
                **({"Timeout": {"AttemptDurationSeconds.$": attempt_duration}} if attempt_duration else {}),
            },
            "TimeoutSeconds": timeout_s,
            "ResultPath": result_path,
        },
    )


def _lambda(
    scope: Construct, state: str, fn: lambda_.IFunction, result_path: str, payload: sfn.TaskInput | None = None, **kw
) -> tasks.LambdaInvoke:
    task = tasks.LambdaInvoke(
        scope,
        state,
        lambda_function=fn,
        payload=payload or sfn.TaskInput.from_json_path_at("$"),
        result_selector={"value.$": "$.Payload"},
        result_path=result_path,
        retry_on_service_exceptions=False,
        **kw,
    )
    task.add_retry(errors=LAMBDA_TRANSIENT, interval=Duration.seconds(1), max_attempts=3, backoff_rate=2)
    return task


def _terminal_payload(status: str, stage: str = "") -> sfn.TaskInput:
    return sfn.TaskInput.from_object({"status": status, "stage": stage, "state": sfn.JsonPath.entire_payload})


def build_definition(
    scope: Construct,
    functions: Mapping[str, lambda_.IFunction],
    finalize: FinalizeTarget,
    timeouts: WorkflowTimeouts | None = None,
    *,
    cloud: CloudTarget,
    node_queue_prefix: str = "gpufleet-node-",
    node_queue_arn: str | None = None,
) -> sfn.IChainable:
    """Build the lifecycle chain (see module contract). Raises KeyError naming a missing function."""
    t = timeouts or WorkflowTimeouts()
    missing = [k for k in REQUIRED_FUNCTIONS if k not in functions]
    if missing:
        raise KeyError(f"workflow needs task functions {missing}")
    fn = functions

    done = sfn.Succeed(scope, "Done")
    ended = sfn.Choice(scope, "JobEnded")
    for status, state in FAILED_JOB_STATUSES.items():
        fail = sfn.Fail(scope, state, error=state,
                        cause=f"the job ended {status} (its final.reason and last_failure are on the job item)")
        ended.when(sfn.Condition.string_equals("$.notify.value.status", status), fail)
    ended.otherwise(done)
    notify = _lambda(scope, "Notify", fn["notify"], "$.notify").next(ended)
    bill = _lambda(scope, "Bill", fn["bill"], "$.bill").next(notify)

    # --- failure path -------------------------------------------------------------------
    classify = _lambda(scope, "ClassifyFailure", fn["classify_failure"], "$.decision")
    await_placement = tasks.LambdaInvoke(
        scope,
        "AwaitPlacement",
        lambda_function=fn["await_placement"],
        integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
        payload=sfn.TaskInput.from_object({"job_id": sfn.JsonPath.string_at("$.job_id"),
                                           "token": sfn.JsonPath.task_token}),
        result_path="$.placement",
        retry_on_service_exceptions=False,
        task_timeout=sfn.Timeout.duration(Duration.seconds(t.placement_timeout_seconds)),
    )
    await_placement.add_retry(errors=LAMBDA_TRANSIENT, interval=Duration.seconds(1), max_attempts=3)
    backoff = sfn.Wait(scope, "Backoff", time=sfn.WaitTime.seconds_path("$.decision.value.wait_seconds"))
    backoff.next(await_placement)
    retry_or_stop = (
        sfn.Choice(scope, "RetryOrStop")
        .when(sfn.Condition.string_equals("$.decision.value.action", "retry"), backoff)
        .otherwise(bill)
    )
    classify.next(retry_or_stop)
    # A task of the workflow itself failing for good (not a worker): FAILED, a system failure, not charged.
    mark_failed = _lambda(
        scope, "MarkFailed", fn["mark_terminal"], "$.terminal", _terminal_payload("FAILED", "workflow")
    ).next(bill)
    classify.add_catch(mark_failed, errors=["States.ALL"], result_path="$.error")

    def catch_to_classify(state: sfn.TaskStateBase) -> None:
        state.add_catch(classify, errors=TIMEOUT_ERRORS, result_path="$.error")
        state.add_catch(classify, errors=["States.ALL"], result_path="$.error")

    # --- prompt check -------------------------------------------------------------------
    check = _lambda(scope, "CheckPrompt", fn["check_prompt"], "$.prompt")
    check.add_catch(classify, errors=["Cancelled"], result_path="$.error")
    check.add_catch(mark_failed, errors=["States.ALL"], result_path="$.error")
    mark_rejected = _lambda(
        scope, "MarkRejected", fn["mark_terminal"], "$.terminal", _terminal_payload("REJECTED")
    ).next(bill)
    prompt_allowed = (
        sfn.Choice(scope, "PromptAllowed")
        .when(sfn.Condition.boolean_equals("$.prompt.value.allowed", False), mark_rejected)
        .otherwise(await_placement)
    )
    check.next(prompt_allowed)
    catch_to_classify(await_placement)

    # --- run ----------------------------------------------------------------------------
    prepare = _lambda(scope, "PrepareRun", fn["prepare_run"], "$.run")
    catch_to_classify(prepare)
    await_placement.next(prepare)

    run_onprem = tasks.LambdaInvoke(
        scope,
        "RunOnPrem",
        lambda_function=fn["dispatch_onprem"],
        integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
        payload=sfn.TaskInput.from_object({"job_id": sfn.JsonPath.string_at("$.job_id"),
                                           "token": sfn.JsonPath.task_token,
                                           "run": sfn.JsonPath.object_at("$.run.value")}),
        heartbeat_timeout=sfn.Timeout.duration(Duration.seconds(t.heartbeat_seconds)),
        task_timeout=sfn.Timeout.duration(Duration.seconds(t.run_timeout_seconds)),
        result_path="$.result",
        retry_on_service_exceptions=False,
    )
    run_onprem.add_retry(errors=LAMBDA_TRANSIENT, interval=Duration.seconds(1), max_attempts=3)
    run_cloud = _batch_submit(
        scope,
        "RunCloud",
        job_name="$.run.value.batch_job_name",
        queue="$.batch.job_queue",
        definition="$.batch.job_definition",
        command="$.run.value.command",
        timeout_s=t.run_timeout_seconds,
        result_path="$.result",
        resources="$.run.value.resource_requirements",
        attempt_duration="$.run.value.attempt_duration_seconds",  # the spec's max_run_seconds, with a margin
    )
    # A cloud container job: the dispatch Lambda registers the image's definition and submits the multi-container
    # job itself, so neither the supervisor's token nor the tenant's env is a task parameter (module contract).
    run_cloud_container = tasks.LambdaInvoke(
        scope,
        "RunCloudContainer",
        lambda_function=fn["dispatch_cloud"],
        integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
        payload=sfn.TaskInput.from_object({"job_id": sfn.JsonPath.string_at("$.job_id"),
                                           "token": sfn.JsonPath.task_token,
                                           "run": sfn.JsonPath.object_at("$.run.value"),
                                           "batch": sfn.JsonPath.object_at("$.batch")}),
        heartbeat_timeout=sfn.Timeout.duration(Duration.seconds(max(t.heartbeat_seconds, t.cloud_heartbeat_seconds))),
        task_timeout=sfn.Timeout.duration(Duration.seconds(t.run_timeout_seconds)),
        result_path="$.result",
        retry_on_service_exceptions=False,
    )
    run_cloud_container.add_retry(errors=LAMBDA_TRANSIENT, interval=Duration.seconds(1), max_attempts=3)
    for run in (run_onprem, run_cloud, run_cloud_container):
        catch_to_classify(run)

    complete = _lambda(scope, "CompleteRun", fn["complete_run"], "$.completed")
    catch_to_classify(complete)
    run_onprem.next(complete)
    run_cloud.next(complete)
    run_cloud_container.next(complete)
    # A single-node cloud run: a container job runs its own image beside the supervisor (RunCloudContainer), a video
    # job the platform's runtime (RunCloud).
    cloud_workload = (
        sfn.Choice(scope, "CloudWorkload")
        .when(sfn.Condition.and_(sfn.Condition.is_present("$.run.value.workload"),
                                 sfn.Condition.string_equals("$.run.value.workload", "container")), run_cloud_container)
        .otherwise(run_cloud)
    )
    # Every platform queue's run goes through CloudGang when the deployment has a gang queue (module contract):
    # a gang (node_overrides) runs only as RunCloudGang, on the gang queue.
    after_queue: sfn.IChainable = cloud_workload
    use_gang = None
    if cloud.gang_queue_name:
        run_gang = _gang_run(scope, cloud, run_timeout_s=t.run_timeout_seconds, complete=complete, classify=classify)
        after_queue = (
            sfn.Choice(scope, "CloudGang")
            .when(sfn.Condition.and_(sfn.Condition.is_present("$.run.value.node_overrides"),
                                     sfn.Condition.string_equals("$.batch.job_queue", cloud.gang_queue_arn)), run_gang)
            .when(sfn.Condition.is_present("$.run.value.node_overrides"), mark_failed)
            .otherwise(cloud_workload)
        )
        use_gang = sfn.Pass(scope, "UseGangQueue", parameters={
            "job_queue": cloud.gang_queue_arn, "job_definition": cloud.job_definition}, result_path="$.batch")
        use_gang.next(after_queue)
    use_queue = {
        name: sfn.Pass(
            scope,
            state,
            parameters={"job_queue": arn, "job_definition": cloud.job_definition},
            result_path="$.batch",
        ).next(after_queue)
        for state, name, arn in (
            ("UseSpotQueue", cloud.spot_queue_name, cloud.spot_queue_arn),
            ("UseOnDemandQueue", cloud.ondemand_queue_name, cloud.ondemand_queue_arn),
        )
    }
    route = sfn.Choice(scope, "RouteTarget").when(sfn.Condition.string_equals("$.run.value.target", "onprem"), run_onprem)
    for name, state in use_queue.items():
        route.when(sfn.Condition.string_equals("$.run.value.job_queue", name), state)
    if use_gang is not None:
        route.when(sfn.Condition.string_equals("$.run.value.job_queue", cloud.gang_queue_name), use_gang)
    route.otherwise(mark_failed)  # a queue that is not the platform's: the workflow refuses it
    prepare.next(route)

    # --- finalize, publish ----------------------------------------------------------------
    finalize = _batch_submit(
        scope,
        "FinalizeStage",
        job_name="$.completed.value.batch_job_name",
        queue=finalize.job_queue,
        definition=finalize.job_definition,
        command="$.completed.value.finalize_command",
        timeout_s=t.finalize_timeout_seconds,
        result_path="$.finalized",
    )
    finalize.add_retry(
        errors=["States.ALL"],
        interval=Duration.seconds(t.finalize_retry_interval_seconds),
        max_attempts=t.finalize_max_attempts,
        backoff_rate=t.finalize_retry_backoff_rate,
    )
    mark_finalize_failed = _lambda(
        scope, "MarkFinalizeFailed", fn["mark_terminal"], "$.terminal", _terminal_payload("FAILED", "finalize")
    ).next(bill)
    finalize.add_catch(mark_finalize_failed, errors=["States.ALL"], result_path="$.error")
    # The same stage, warm, for a short clip: the same command (its pointer envelope), the same retries and catch.
    finalize_warm = tasks.LambdaInvoke(
        scope,
        "FinalizeLambda",
        lambda_function=fn["finalize"],
        payload=sfn.TaskInput.from_object({"job_id": sfn.JsonPath.string_at("$.job_id"),
                                           "command": sfn.JsonPath.list_at("$.completed.value.finalize_command")}),
        result_selector={"exit_code.$": "$.Payload.exit_code", "blocked.$": "$.Payload.blocked"},
        result_path="$.finalized",
        retry_on_service_exceptions=False,
        task_timeout=sfn.Timeout.duration(Duration.seconds(t.finalize_timeout_seconds)),
    )
    finalize_warm.add_retry(
        errors=["States.ALL"],
        interval=Duration.seconds(t.finalize_retry_interval_seconds),
        max_attempts=t.finalize_max_attempts,
        backoff_rate=t.finalize_retry_backoff_rate,
    )
    finalize_warm.add_catch(mark_finalize_failed, errors=["States.ALL"], result_path="$.error")
    finalize_route = (
        sfn.Choice(scope, "FinalizeRoute")
        .when(sfn.Condition.and_(sfn.Condition.is_present("$.completed.value.finalize_pixels"),
                                 sfn.Condition.number_less_than_equals("$.completed.value.finalize_pixels",
                                                                       t.finalize_lambda_max_pixels)),
              finalize_warm)
        .otherwise(finalize)
    )
    publish = _lambda(scope, "Publish", fn["publish"], "$.published")
    # Publishing never re-runs inference: only a cancellation goes back through ClassifyFailure.
    publish.add_catch(classify, errors=["Cancelled"], result_path="$.error")
    publish.add_catch(mark_finalize_failed, errors=["States.ALL"], result_path="$.error")
    collect = _lambda(scope, "CollectOutputs", fn["collect_outputs"], "$.collected")
    collect.add_catch(classify, errors=["Cancelled", "OutputTooLarge"], result_path="$.error")
    collect.add_catch(mark_finalize_failed, errors=["States.ALL"], result_path="$.error")
    collect.next(publish)
    workload_kind = (
        sfn.Choice(scope, "WorkloadKind")
        .when(sfn.Condition.string_equals("$.completed.value.workload", "container"), collect)
        .otherwise(finalize_route)
    )
    complete.next(workload_kind)
    finalize.next(publish)
    finalize_warm.next(publish)
    publish.next(bill)

    # --- operator recovery: a re-finalize run skips straight to the finalize stage --------
    resume = _lambda(scope, "ResumeFinalize", fn["complete_run"], "$.completed")
    resume.add_catch(classify, errors=["Cancelled"], result_path="$.error")
    resume.add_catch(mark_finalize_failed, errors=["States.ALL"], result_path="$.error")
    resume.next(workload_kind)
    return (
        sfn.Choice(scope, "StartOrResume")
        .when(sfn.Condition.is_present("$.resume"), resume)
        .otherwise(check)
    )


def lifecycle_state_machine(
    scope: Construct,
    id: str,
    functions: Mapping[str, lambda_.IFunction],
    finalize: FinalizeTarget,
    timeouts: WorkflowTimeouts | None = None,
    *,
    cloud: CloudTarget,
    node_queue_prefix: str = "gpufleet-node-",
    **props,
) -> sfn.StateMachine:
    """A Standard state machine running :func:`build_definition`. ``props`` go to ``StateMachine``."""
    definition = build_definition(scope, functions, finalize, timeouts, cloud=cloud,
                                  node_queue_prefix=node_queue_prefix)
    return sfn.StateMachine(
        scope,
        id,
        definition_body=sfn.DefinitionBody.from_chainable(definition),
        state_machine_type=sfn.StateMachineType.STANDARD,
        **props,
    )
