"""The lifecycle state machine on in-process moto for benchmarks/control_plane_cost.py (no test uses it).

The suite runs on the harness (the whole synthesized template deployed into moto CloudFormation,
:func:`from_harness`) whenever ``gpufleet.local.harness`` is importable; otherwise on this module's
:func:`deploy`, which registers only the lifecycle state machine synthesized from
``infra.workflow`` and creates the resources it needs directly.

What it does, in the order ARCHITECTURE.md "Local emulation" describes:
- one ``mock_aws`` with Step Functions execution and the simple (no Docker) Batch backend;
- the state machine definition is the one ``infra.workflow.build_definition`` synthesizes with
  CDK (test-sized timeouts, as CDK context would give), with the task Lambdas' ARNs, registered
  in the executing backend;
- the task Lambdas run in-process from their handlers (``LambdaFunction._invoke_lambda``);
- ``batch:submitJob.sync`` works through parameter/response normalisation, and Batch jobs are run
  by a local runner thread (``BatchSimpleBackend._mark_job_as_finished``);
- the webhook queue feeds the webhook sender through an SQS event source mapping.

Seams for the final suite: :class:`Fleet` plays the scheduler pass (placement contract of
docs/contracts.md) and the workers (runtime contract: envelope, heartbeats, fenced writes,
SendTaskSuccess/Failure); swap in the real scheduler, agent and runtime behind the same methods.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import traceback
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import boto3

ACCOUNT = "123456789012"
REGION = "us-east-1"
FN_PREFIX = "gpufleet-task-"
TIMEOUTS = {
    "heartbeat_seconds": 2,
    "placement_timeout_seconds": 120,
    "run_timeout_seconds": 60,
    "finalize_timeout_seconds": 60,
    "finalize_retry_interval_seconds": 1,
    "finalize_max_attempts": 2,
}


def fn_arn(key: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FN_PREFIX}{key.replace('_', '-')}"


def synth_definition(timeouts: dict[str, int], cpu_queue_arn: str, finalize_def_arn: str) -> str:
    """Synthesize the real definition with CDK and resolve it to a plain ASL string."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from aws_cdk import App, Environment, Stack
    from aws_cdk import aws_lambda as lambda_

    from infra.workflow import REQUIRED_FUNCTIONS, FinalizeTarget, WorkflowTimeouts, lifecycle_state_machine

    app = App()
    stack = Stack(app, "LifecycleE2E", env=Environment(account=ACCOUNT, region=REGION))
    fns = {k: lambda_.Function.from_function_arn(stack, f"fn-{k}", fn_arn(k)) for k in REQUIRED_FUNCTIONS}
    lifecycle_state_machine(stack, "Workflow", fns, FinalizeTarget(cpu_queue_arn, finalize_def_arn),
                            WorkflowTimeouts(**timeouts))
    tpl = app.synth().get_stack_by_name("LifecycleE2E").template
    (sm,) = [r for r in tpl["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    body = sm["Properties"]["DefinitionString"]
    if isinstance(body, dict):
        parts = body["Fn::Join"][1]
        refs = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT}
        body = "".join(p if isinstance(p, str) else refs[p["Ref"]] for p in parts)
    return body


# ----------------------------------------------------------------------------- moto patches


def _pascal(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {(k[:1].upper() + k[1:]): _pascal(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_pascal(v) for v in obj]
    return obj


def _camel(obj: Any, keep: frozenset[str] = frozenset({"Environment"})) -> Any:
    if isinstance(obj, dict):
        return {(k[:1].lower() + k[1:]): (v if k in keep else _camel(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_camel(v) for v in obj]
    return obj


def install_patches(runner: Callable[[Any], tuple[int, str]]) -> Callable[[], None]:
    """Patch moto for in-process Lambdas, batch .sync and a local Batch runner. Returns an undo function."""
    from moto.awslambda.models import LambdaFunction
    from moto.batch_simple.models import BatchSimpleBackend
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_batch import (
        StateTaskServiceBatch,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
        StateTaskServiceCallback,
    )

    saved = (
        StateTaskServiceCallback._eval_execution,
        LambdaFunction._invoke_lambda,
        BatchSimpleBackend._mark_job_as_finished,
        StateTaskServiceBatch._normalise_parameters,
        StateTaskServiceBatch._normalise_response,
    )

    def invoke(self, event=None):
        import importlib

        module, func = self.handler.rsplit(".", 1)
        payload = json.loads(event) if isinstance(event, (str, bytes)) else (event or {})
        try:
            result = getattr(importlib.import_module(module), func)(payload, None)
            return json.dumps(result), False, ""
        except Exception as err:  # noqa: BLE001 - reported to Step Functions as the Lambda error
            body = {"errorType": type(err).__name__, "errorMessage": str(err)}
            return json.dumps(body), True, traceback.format_exc()

    def normalise_parameters(self, parameters, boto_service_name=None, service_action_name=None):
        camel = _camel(parameters)
        parameters.clear()
        parameters.update(camel)

    def normalise_response(self, response, boto_service_name=None, service_action_name=None):
        if isinstance(response, dict):
            pas = _pascal(response)
            response.clear()
            response.update(pas)

    def mark_finished(self, include_start_attempt, job):
        import datetime

        self.backend._jobs[job.job_id] = job
        job.job_started_at = datetime.datetime.now()
        job.log_stream_name = job._stream_name
        job.status = "RUNNING"
        if include_start_attempt:
            job._start_attempt()

        def run():
            try:
                code, reason = runner(job)
            except Exception as err:  # noqa: BLE001 - a crashed runner is a failed Batch job
                code, reason = 20, f"runner crashed: {err}"
            if job.job_stopped:  # terminated meanwhile
                return
            job.exit_code = code
            if reason:
                job.job_stopped_reason = reason
            job._mark_stopped(success=(code == 0))

        threading.Thread(target=run, daemon=True).start()

    # moto reuses a Task's callback endpoint across Retry attempts; the first attempt interrupts it, so every
    # retried .sync/.waitForTaskToken attempt "times out" at once. Give each attempt its own token/endpoint.
    used_tokens: set[str] = set()
    original_eval_execution = saved[0]

    def eval_execution(self, env, *args, **kwargs):
        task = env.states.context_object.context_object_data.get("Task") or {}
        token = task.get("Token")
        if token is not None:
            if token in used_tokens:
                token = env.states.context_object.update_task_token()
                env.callback_pool_manager.add(token)
            used_tokens.add(token)
        return original_eval_execution(self, env, *args, **kwargs)

    StateTaskServiceCallback._eval_execution = eval_execution
    LambdaFunction._invoke_lambda = invoke
    BatchSimpleBackend._mark_job_as_finished = mark_finished
    StateTaskServiceBatch._normalise_parameters = normalise_parameters
    StateTaskServiceBatch._normalise_response = normalise_response

    def undo() -> None:
        (StateTaskServiceCallback._eval_execution, LambdaFunction._invoke_lambda,
         BatchSimpleBackend._mark_job_as_finished,
         StateTaskServiceBatch._normalise_parameters, StateTaskServiceBatch._normalise_response) = saved

    return undo


# ----------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    """What the e2e tests need of a deployed lifecycle, whichever way it was deployed."""

    clients: dict[str, Any]
    state_machine_arn: str
    webhook_queue_url: str
    node_queues: dict[str, str]
    batch: dict[str, str]
    buckets: dict[str, str]
    tables: Any = None
    extras: dict[str, Any] = field(default_factory=dict)

    def c(self, name: str):
        return self.clients[name]


CLIENTS = ("dynamodb", "sqs", "s3", "stepfunctions", "lambda", "iam", "batch", "ec2", "events")


def from_harness(local, node_ids: list[str]) -> Stack:
    """Adapt a deployed :class:`gpufleet.local.harness.LocalStack` (the real template) to :class:`Stack`."""
    from gpufleet.tables import TableNames

    out = local.outputs
    nodes = {n: local.register_node(n)["queue_url"] for n in node_ids}
    return Stack(
        clients={n: local.client(n) for n in CLIENTS},
        state_machine_arn=out.state_machine_arn,
        webhook_queue_url=out.webhook_queue_url,
        node_queues=nodes,
        batch={"gpu_spot_queue_arn": out.job_queues["spot"], "cpu_queue_arn": out.job_queues["cpu"]},
        buckets={"outputs": out.outputs_bucket, "checkpoints": out.checkpoints_bucket, "logs": out.logs_bucket},
        tables=TableNames(out.jobs_table, out.control_table, out.ledger_table),
        extras={"harness": local, "webhook_dlq": out.webhook_dlq_url},
    )


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("placeholder.py", "# handlers run in-process from the repository\n")
    return buf.getvalue()


def deploy(node_ids: list[str], timeouts: dict[str, int] | None = None) -> Stack:
    """Create every resource the lifecycle needs and register the synthesized state machine."""
    from gpufleet.store.schema import create_tables
    from gpufleet.tables import TableNames
    from infra.config import TASK_FUNCTIONS, WEBHOOK_FUNCTION

    cl = {n: boto3.client(n, region_name=REGION) for n in CLIENTS}
    tables = TableNames()
    create_tables(cl["dynamodb"], tables)
    buckets = {"outputs": "gpufleet-outputs", "checkpoints": "gpufleet-checkpoints", "logs": "gpufleet-logs"}
    for b in buckets.values():
        cl["s3"].create_bucket(Bucket=b)
    dlq = cl["sqs"].create_queue(QueueName="gpufleet-webhooks-dlq")["QueueUrl"]
    dlq_arn = cl["sqs"].get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    webhook_q = cl["sqs"].create_queue(
        QueueName="gpufleet-webhooks",
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "8"})},
    )["QueueUrl"]
    node_queues = {n: cl["sqs"].create_queue(QueueName=f"gpufleet-node-{n}")["QueueUrl"] for n in node_ids}
    bus = cl["events"].create_event_bus(Name="gpufleet-events")["EventBusArn"]

    role = cl["iam"].create_role(
        RoleName="gpufleet-e2e", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []})
    )["Role"]["Arn"]
    env = {
        "GPUFLEET_JOBS_TABLE": tables.jobs, "GPUFLEET_CONTROL_TABLE": tables.control,
        "GPUFLEET_LEDGER_TABLE": tables.ledger,
        "GPUFLEET_OUTPUTS_BUCKET": buckets["outputs"], "GPUFLEET_CHECKPOINTS_BUCKET": buckets["checkpoints"],
        "GPUFLEET_LOGS_BUCKET": buckets["logs"], "GPUFLEET_WEBHOOK_QUEUE_URL": webhook_q,
        "GPUFLEET_EVENT_BUS": "gpufleet-events",
        "GPUFLEET_HEARTBEAT_SECONDS": str((timeouts or TIMEOUTS)["heartbeat_seconds"]),
        "GPUFLEET_RETRY_POLICY": json.dumps({"base_s": 1, "cap_s": 2, "failure_budget": 5,
                                             "quarantine_after_workers": 3}),
    }
    os.environ.update(env)  # handlers run in-process and read their settings from the environment
    for d in TASK_FUNCTIONS:
        cl["lambda"].create_function(
            FunctionName=fn_arn(d.key).rsplit(":", 1)[-1], Runtime="python3.11", Role=role, Handler=d.handler,
            Code={"ZipFile": _zip()}, Environment={"Variables": env}, Timeout=d.timeout_s,
        )
    cl["lambda"].create_function(
        FunctionName="gpufleet-webhook", Runtime="python3.11", Role=role, Handler=WEBHOOK_FUNCTION.handler,
        Code={"ZipFile": _zip()}, Environment={"Variables": env}, Timeout=30,
    )
    q_arn = cl["sqs"].get_queue_attributes(QueueUrl=webhook_q, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    cl["lambda"].create_event_source_mapping(EventSourceArn=q_arn, FunctionName="gpufleet-webhook", BatchSize=1)

    batch = _batch(cl, role)
    definition = synth_definition(timeouts or TIMEOUTS, batch["cpu_queue_arn"], batch["finalize_def_arn"])
    sm = cl["stepfunctions"].create_state_machine(name="gpufleet-lifecycle", definition=definition, roleArn=role)
    return Stack(cl, sm["stateMachineArn"], webhook_q, node_queues, batch, buckets, tables,
                 {"webhook_dlq": dlq, "bus": bus, "definition": definition, "env": env})


def _batch(cl: dict[str, Any], role: str) -> dict[str, str]:
    b = cl["batch"]
    out: dict[str, str] = {}
    for name in ("gpu-spot", "gpu-ondemand", "cpu"):
        ce = b.create_compute_environment(computeEnvironmentName=f"gpufleet-{name}", type="UNMANAGED",
                                          state="ENABLED", serviceRole=role)["computeEnvironmentArn"]
        q = b.create_job_queue(jobQueueName=f"gpufleet-{name}", state="ENABLED", priority=1,
                               computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce}])
        out[f"{name}_queue_arn".replace("-", "_")] = q["jobQueueArn"]
    for name in ("gpu", "finalize"):
        d = b.register_job_definition(
            jobDefinitionName=f"gpufleet-{name}", type="container",
            containerProperties={"image": "gpufleet/runtime:local", "vcpus": 1, "memory": 512,
                                 "command": ["python", "-m", "gpufleet.runtime"]},
        )
        out[f"{name}_def_arn"] = d["jobDefinitionArn"]
    return out


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
