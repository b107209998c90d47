"""The synthesized template deployed into moto CloudFormation and executed, with Lambdas run from their asset."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpufleet.clock import SystemClock
from gpufleet.errors import ConfigError
from gpufleet.local.lambda_runner import LambdaRunner
from gpufleet.store import jobs
from gpufleet.tables import TableNames

pytestmark = pytest.mark.xdist_group("cdk-synth")


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met")


def test_deployed_stack_has_its_resources(local_stack):
    stack = local_stack
    out = stack.outputs
    ddb = stack.client("dynamodb")
    jobs_table = ddb.describe_table(TableName=out.jobs_table)["Table"]
    assert jobs_table["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert {i["IndexName"] for i in jobs_table["GlobalSecondaryIndexes"]} == {"gsi1", "gsi2", "gsi3", "gsi4"}
    assert set(stack.client("s3").list_buckets()["Buckets"][0]) >= {"Name"}
    queues = {q["jobQueueName"] for q in stack.client("batch").describe_job_queues()["jobQueues"]}
    assert queues == {"gpufleet-gpu-spot", "gpufleet-gpu-ondemand", "gpufleet-gpu-gang", "gpufleet-cpu"}
    sm = stack.client("stepfunctions").describe_state_machine(stateMachineArn=out.state_machine_arn)
    assert "AwaitPlacement" in json.loads(sm["definition"])["States"]
    assert stack.deployment.assets and all(p.is_dir() for p in stack.deployment.assets.values())


def test_execution_runs_task_lambdas_in_process_from_the_asset(local_stack):
    stack = local_stack
    out = stack.outputs
    names = TableNames(out.jobs_table, out.control_table, out.ledger_table)
    spec = {"workload": {"kind": "container", "image": "busybox", "command": ["true"]}, "resources": {"gpus": 1}}
    job = jobs.create_job(stack.client("dynamodb"), names, tenant="acme", team="vision", user="ana", spec=spec,
                          clock=SystemClock())
    sfn = stack.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=out.state_machine_arn, name=job["job_id"],
                              input=json.dumps({"job_id": job["job_id"]}))["executionArn"]
    _wait(lambda: any(i.function_key == "check_prompt" and not i.errored for i in stack.lambda_runner.invocations))

    def entered(name):
        events = sfn.get_execution_history(executionArn=arn)["events"]
        return any(e.get("stateEnteredEventDetails", {}).get("name") == name for e in events)

    _wait(lambda: entered("AwaitPlacement"))  # CheckPrompt's output ({"allowed": true}) drove the Choice
    events = sfn.get_execution_history(executionArn=arn)["events"]
    (check,) = [e for e in events if e["type"] == "TaskSucceeded"][:1]
    assert json.loads(check["taskSucceededEventDetails"]["output"])["Payload"] == {"allowed": True, "reason": None}
    deployed = stack.function_name("check_prompt")
    assert [i.function_name for i in stack.lambda_runner.invocations if i.function_key == "check_prompt"][0] == deployed
    # CheckPrompt is a container-image function: it ran from its image's staged build context
    from moto.awslambda.utils import get_backend

    from infra.config import CHECK_PROMPT_DOCKERFILE

    config = stack.client("lambda").get_function(FunctionName=deployed)["Configuration"]
    assert config["PackageType"] == "Image" and "Handler" not in config
    assert config["ImageConfigResponse"]["ImageConfig"]["Command"] == ["lambdas.tasks.check_prompt.handler"]
    context = stack.lambda_runner.asset_dir(get_backend(stack.account, stack.region).get_function(deployed))
    assert (context / CHECK_PROMPT_DOCKERFILE).is_file() and context.name.startswith("asset.")


def test_register_node_creates_its_queue_and_dlq(local_stack):
    stack = local_stack
    node = stack.register_node("node-7")
    sqs = stack.client("sqs")
    assert node["queue_url"].endswith("/gpufleet-node-node-7")
    attrs = sqs.get_queue_attributes(QueueUrl=node["queue_url"], AttributeNames=["All"])["Attributes"]
    redrive = json.loads(attrs["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"].endswith(":gpufleet-node-node-7-dlq") and int(redrive["maxReceiveCount"]) == 5
    assert stack.register_node("node-7") == node  # idempotent


def test_lambda_runner_rejects_a_handler_missing_from_the_asset(tmp_path: Path):
    (tmp_path / "lambdas" / "tasks").mkdir(parents=True)

    class Fn:
        function_name = "f"
        code = {"S3Key": "abc.zip"}
        handler = "lambdas.tasks.check_prompt.handler"
        environment_vars = {}
        memory_size, timeout, run_time = 128, 3, "python3.11"
        function_arn, logs_group_name = "arn:aws:lambda:us-east-1:123456789012:function:f", "/aws/lambda/f"

    payload, errored, _ = LambdaRunner({"abc": tmp_path})(Fn(), {})
    assert errored and json.loads(payload)["errorType"] == ConfigError.__name__
    assert "not in the deployed asset" in json.loads(payload)["errorMessage"]
