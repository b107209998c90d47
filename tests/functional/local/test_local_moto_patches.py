"""One test per moto patch: moto 5.2.5 still has the gap (else the patch can go), and the patch closes it."""

from __future__ import annotations

import io
import json
import os
import threading
import time
import zipfile

import boto3
import pytest
from moto import mock_aws

from gpufleet.local import moto_patches
from gpufleet.local.batch_runner import BatchRunner, LocalJob

# Not imported from conftest: another test directory's conftest may own that module name in a joint run.
REGION = "us-east-1"


def code_zip(source: str = "def handler(event, context):\n    return event\n") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("probe.py", source)
    return buf.getvalue()


SFN_CONFIG = {"stepfunctions": {"execute_state_machine": True}}


def _wait(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met")


def test_lambda_patch_replaces_docker_invocation(role_arn):
    with mock_aws():
        fn = boto3.client("lambda", region_name=REGION)
        fn.create_function(FunctionName="probe", Runtime="python3.11", Role=role_arn(), Handler="probe.handler",
                           Code={"ZipFile": code_zip()})
        unpatched = fn.invoke(FunctionName="probe", Payload=b'{"a": 1}')
        assert unpatched.get("FunctionError") and b"docker" in unpatched["Payload"].read()

        seen = []

        def invoker(function, event):
            seen.append((function.function_name, event))
            return json.dumps({"echo": event}), False, ""

        with moto_patches.patch_lambda(invoker):
            out = fn.invoke(FunctionName="probe", Payload=b'{"a": 1}')
        assert "FunctionError" not in out and json.loads(out["Payload"].read()) == {"echo": {"a": 1}}
        assert seen == [("probe", {"a": 1})]


def test_batch_integration_patch_normalises_casing():
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_batch import (
        StateTaskServiceBatch,
    )

    class Resource:
        api_name, api_action = "batch", "submitJob"

    def fresh():
        svc = StateTaskServiceBatch()
        svc.resource = Resource()
        return svc

    params = {"JobName": "j", "JobQueue": "q", "JobDefinition": "d",
              "ContainerOverrides": {"Command": ["python"], "Environment": [{"Name": "A", "Value": "1"}]}}
    untouched = json.loads(json.dumps(params))
    fresh()._normalise_parameters(untouched)
    assert untouched == params  # moto's stub does nothing

    with moto_patches.patch_batch_integration():
        svc = fresh()
        svc._normalise_parameters(params)
        response = {"jobId": "1", "jobName": "j", "jobArn": "arn"}
        svc._normalise_response(response)
    assert params == {"jobName": "j", "jobQueue": "q", "jobDefinition": "d",
                      "containerOverrides": {"command": ["python"], "environment": [{"name": "A", "value": "1"}]}}
    assert response == {"JobId": "1", "JobName": "j", "JobArn": "arn"}
    assert "_normalise_parameters" not in StateTaskServiceBatch.__dict__  # restored


def test_batch_cfn_attribute_patch(role_arn):
    from moto.batch.models import batch_backends
    from moto.cloudformation.parsing import clean_json

    with mock_aws():
        arn = boto3.client("batch", region_name=REGION).create_compute_environment(
            computeEnvironmentName="local-ce", type="UNMANAGED", state="ENABLED", serviceRole=role_arn()
        )["computeEnvironmentArn"]
        ce = batch_backends["123456789012"][REGION].get_compute_environment(arn)
        ref = {"Fn::GetAtt": ["CE", "ComputeEnvironmentArn"]}
        with pytest.raises(AttributeError):
            clean_json(ref, {"CE": ce})
        with moto_patches.patch_batch_cfn_attributes():
            assert clean_json(ref, {"CE": ce}) == arn


def test_event_bus_ref_patch():
    from moto.cloudformation.parsing import clean_json
    from moto.events.models import events_backends

    with mock_aws():
        boto3.client("events", region_name=REGION).create_event_bus(Name="bus")
        bus = events_backends["123456789012"][REGION].event_buses["bus"]
        assert clean_json({"Ref": "Bus"}, {"Bus": bus}) is bus  # moto: Ref yields the model, not the name
        with moto_patches.patch_event_bus_ref():
            assert clean_json({"Ref": "Bus"}, {"Bus": bus}) == "bus"


def _retried_callback_machine(role: str, queue_url: str) -> str:
    return json.dumps({
        "StartAt": "Park",
        "States": {"Park": {
            "Type": "Task",
            "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "Parameters": {"QueueUrl": queue_url, "MessageBody": {"token.$": "$$.Task.Token"}},
            "TimeoutSeconds": 20,
            "Retry": [{"ErrorEquals": ["Again"], "IntervalSeconds": 1, "MaxAttempts": 1}],
            "End": True,
        }},
    })


def _run_retried_callback(role_arn) -> tuple[bool, str]:
    """Fail the first attempt; return (second attempt reused the first token, outcome of answering it)."""
    sqs = boto3.client("sqs", region_name=REGION)
    sfn = boto3.client("stepfunctions", region_name=REGION)
    url = sqs.create_queue(QueueName="park")["QueueUrl"]
    sm = sfn.create_state_machine(name="retry", definition=_retried_callback_machine("r", url), roleArn=role_arn())
    ex = sfn.start_execution(stateMachineArn=sm["stateMachineArn"])["executionArn"]

    def token():
        msgs = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", [])
        return json.loads(msgs[0]["Body"])["token"] if msgs else None

    first = _wait(token)
    sfn.send_task_failure(taskToken=first, error="Again", cause="first attempt")
    second = _wait(token)
    try:
        sfn.send_task_success(taskToken=second, output='{"ok": true}')
    except sfn.exceptions.InvalidToken:
        sfn.stop_execution(executionArn=ex)
        return second == first, "InvalidToken"
    return second == first, _wait(lambda: (s := sfn.describe_execution(executionArn=ex)["status"]) != "RUNNING" and s)


def test_callback_retry_token_patch(role_arn):
    with mock_aws(config=SFN_CONFIG):
        reused, _ = _run_retried_callback(role_arn)
    assert reused  # moto: the retried attempt gets the first attempt's (already interrupted) token
    with mock_aws(config=SFN_CONFIG), moto_patches.patch_callback_retry_tokens():
        assert _run_retried_callback(role_arn) == (False, "SUCCEEDED")


def _answer_twice(role_arn) -> str:
    """Fail a parked task's token, then (while the execution still runs, in its Catch's Wait) answer it again;
    return what the second answer got."""
    sqs = boto3.client("sqs", region_name=REGION)
    sfn = boto3.client("stepfunctions", region_name=REGION)
    url = sqs.create_queue(QueueName="park-twice")["QueueUrl"]
    definition = json.dumps({"StartAt": "Park", "States": {
        "Park": {"Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                 "Parameters": {"QueueUrl": url, "MessageBody": {"token.$": "$$.Task.Token"}},
                 "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Linger"}], "End": True},
        "Linger": {"Type": "Wait", "Seconds": 120, "End": True}}})
    sm = sfn.create_state_machine(name="twice", definition=definition, roleArn=role_arn())
    ex = sfn.start_execution(stateMachineArn=sm["stateMachineArn"])["executionArn"]
    msgs = _wait(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages"))
    token = json.loads(msgs[0]["Body"])["token"]
    sfn.send_task_failure(taskToken=token, error="CANCELLED", cause="the cancel came first")
    # the execution consumed the failure (it is in Linger) before the second answer: otherwise, unpatched, the
    # second answer could overwrite the first before the task read it
    _wait(lambda: any(e["type"] == "WaitStateEntered" for e in sfn.get_execution_history(executionArn=ex)["events"]))
    try:
        sfn.send_task_success(taskToken=token, output='{"placed": true}')
        answer = "accepted"
    except sfn.exceptions.TaskTimedOut:
        answer = "TaskTimedOut"
    assert sfn.describe_execution(executionArn=ex)["status"] == "RUNNING"  # still in Linger: the case at hand
    sfn.stop_execution(executionArn=ex)
    return answer


def test_callback_answered_once_patch(role_arn):
    with mock_aws(config=SFN_CONFIG):
        assert _answer_twice(role_arn) == "accepted"  # moto: a closed task's token takes a second answer
    with mock_aws(config=SFN_CONFIG), moto_patches.patch_callback_answered_once():
        assert _answer_twice(role_arn) == "TaskTimedOut"


def _answer_early(role_arn) -> tuple[str, str]:
    """A worker that heartbeats and answers a parked task after its message (the task's service call) but before moto
    sets up the task's heartbeat endpoint (held back here by a gate): what the heartbeat got, and the execution's
    status 2 s after the gate opened (its HeartbeatSeconds is 4)."""
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint

    gate = threading.Event()
    setup = CallbackEndpoint.setup_heartbeat_endpoint  # moto's, or the patch's around it

    def gated(self, heartbeat_seconds):
        gate.wait(10)
        return setup(self, heartbeat_seconds)

    CallbackEndpoint.setup_heartbeat_endpoint = gated
    try:
        sqs = boto3.client("sqs", region_name=REGION)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        url = sqs.create_queue(QueueName="park-early")["QueueUrl"]
        definition = json.dumps({"StartAt": "Park", "States": {
            "Park": {"Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                     "HeartbeatSeconds": 4, "TimeoutSeconds": 60,
                     "Parameters": {"QueueUrl": url, "MessageBody": {"token.$": "$$.Task.Token"}}, "End": True}}})
        sm = sfn.create_state_machine(name="early", definition=definition, roleArn=role_arn())
        ex = sfn.start_execution(stateMachineArn=sm["stateMachineArn"])["executionArn"]
        msgs = _wait(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages"))
        token = json.loads(msgs[0]["Body"])["token"]
        try:
            sfn.send_task_heartbeat(taskToken=token)
            beat = "ok"
        except sfn.exceptions.ClientError as err:
            beat = err.response["Error"]["Code"]
        sfn.send_task_success(taskToken=token, output='{"done": true}')
        gate.set()
        time.sleep(2)
        return beat, sfn.describe_execution(executionArn=ex)["status"]
    finally:
        gate.set()
        CallbackEndpoint.setup_heartbeat_endpoint = setup


def test_callback_early_answers_patch(role_arn):
    with mock_aws(config=SFN_CONFIG):
        beat, status = _answer_early(role_arn)
    assert beat != "ok" and status == "RUNNING"  # moto: the beat is refused, the answer waits out the heartbeat
    with mock_aws(config=SFN_CONFIG), moto_patches.patch_callback_early_answers():
        assert _answer_early(role_arn) == ("ok", "SUCCEEDED")


def _batch_world(role_arn) -> tuple:
    batch = boto3.client("batch", region_name=REGION)
    ce = batch.create_compute_environment(computeEnvironmentName="local-ce", type="UNMANAGED", state="ENABLED",
                                          serviceRole=role_arn())["computeEnvironmentArn"]
    batch.create_job_queue(jobQueueName="q", state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce}])
    batch.register_job_definition(jobDefinitionName="d", type="container",
                                  containerProperties={"image": "x", "vcpus": 1, "memory": 512, "command": ["true"]})
    return batch


def test_batch_ecs_properties_patch_keeps_the_definition_and_the_override(role_arn):
    ecs = {"taskProperties": [{"containers": [{"name": "a", "image": "x", "essential": True,
                                                "resourceRequirements": [{"type": "MEMORY", "value": "64"}]}]}]}
    override = {"taskProperties": [{"containers": [{"name": "a", "command": ["run"],
                                                     "environment": [{"name": "K", "value": "v"}]}]}]}
    with mock_aws(config=moto_patches.MOTO_CONFIG):
        batch = _batch_world(role_arn)
        with pytest.raises(batch.exceptions.ClientException, match="containerProperties or eksProperties"):
            batch.register_job_definition(jobDefinitionName="multi", type="container", ecsProperties=ecs)
        with moto_patches.patch_batch_ecs_properties():
            arn = batch.register_job_definition(jobDefinitionName="multi", type="container",
                                                ecsProperties=ecs)["jobDefinitionArn"]
            [described] = batch.describe_job_definitions(jobDefinitionName="multi")["jobDefinitions"]
            assert described["jobDefinitionArn"] == arn and described["ecsProperties"] == ecs
            job = batch.submit_job(jobName="j", jobQueue="q", jobDefinition=arn, ecsPropertiesOverride=override)
            [seen] = batch.describe_jobs(jobs=[job["jobId"]])["jobs"]
            [container] = seen["ecsProperties"]["taskProperties"][0]["containers"]
            assert container["image"] == "x" and container["command"] == ["run"]
            assert container["environment"] == [{"name": "K", "value": "v"}]


def test_batch_runner_patch_runs_jobs_through_executor(role_arn):
    with mock_aws(config={"batch": {"use_docker": False}}):
        batch = _batch_world(role_arn)
        job = batch.submit_job(jobName="plain", jobQueue="q", jobDefinition="d")["jobId"]
        assert batch.describe_jobs(jobs=[job])["jobs"][0]["status"] == "SUCCEEDED"  # moto: success at submit

        release = threading.Event()
        ran: list[LocalJob] = []

        def executor(local: LocalJob):
            ran.append(local)
            release.wait(10)
            return 30, "spot reclaimed"

        runner = BatchRunner(executor, base_env={"BASE": "1"})
        with moto_patches.patch_batch_runner(runner):
            job = batch.submit_job(jobName="local", jobQueue="q", jobDefinition="d",
                                   containerOverrides={"command": ["python", "-c", "pass"],
                                                       "environment": [{"name": "X", "value": "y"}]})["jobId"]
            assert _wait(lambda: ran)
            assert batch.describe_jobs(jobs=[job])["jobs"][0]["status"] == "RUNNING"
            release.set()
            done = _wait(lambda: (j := batch.describe_jobs(jobs=[job])["jobs"][0])["status"] == "FAILED" and j)
        assert done["container"]["exitCode"] == 30 and done["statusReason"] == "spot reclaimed"
        assert ran[0].command == ["python", "-c", "pass"] and ran[0].job_definition == "d"
        assert ran[0].environment["X"] == "y" and ran[0].environment["BASE"] == "1"
        assert runner.records[0].exit_code == 30


def test_batch_runner_stops_an_attempt_at_its_attempt_duration(role_arn):
    """SubmitJob's timeout.attemptDurationSeconds (RunCloud's, from the spec's max_run_seconds) is Batch's: past it
    the local job is asked to stop and fails with AWS's status reason, which classifies TIMED_OUT."""
    from gpufleet.lifecycle.classify import classify
    from gpufleet.status import FailureClass

    now = [1000.0]
    started, advanced = threading.Event(), threading.Event()
    seen: list[bool] = []

    def executor(local: LocalJob):
        seen.append(local.stop_requested())  # within the limit
        started.set()
        advanced.wait(10)
        seen.append(local.stop_requested())  # past it: stop, as a SIGTERM'd runtime does (PREEMPTED)
        return 30, "Terminated by TerminateJob"

    with mock_aws(config={"batch": {"use_docker": False}}):
        batch = _batch_world(role_arn)
        runner = BatchRunner(executor, monotonic=lambda: now[0])
        with moto_patches.patch_batch_runner(runner):
            job = batch.submit_job(jobName="hung", jobQueue="q", jobDefinition="d",
                                   timeout={"attemptDurationSeconds": 60})["jobId"]
            assert started.wait(10)
            now[0] += 61
            advanced.set()
            done = _wait(lambda: (j := batch.describe_jobs(jobs=[job])["jobs"][0])["status"] == "FAILED" and j)
    assert seen == [False, True] and done["statusReason"] == "Job attempt duration exceeded timeout"
    failure = classify({"Error": "States.TaskFailed", "Cause": json.dumps(done, default=str)},
                       {"epoch": 1, "attempt": 1, "target": "cloud", "pool": "cloud-ondemand"}, cancel_requested=False)
    assert failure.cls is FailureClass.TIMED_OUT


def test_cfn_secret_patch():
    template = json.dumps({
        "Resources": {"Key": {"Type": "AWS::SecretsManager::Secret",
                              "Properties": {"GenerateSecretString": {"PasswordLength": 40}}}},
        "Outputs": {"KeyArn": {"Value": {"Ref": "Key"}}},
    })
    with mock_aws():
        cfn, sm = boto3.client("cloudformation", region_name=REGION), boto3.client("secretsmanager", region_name=REGION)
        cfn.create_stack(StackName="plain", TemplateBody=template)
        assert sm.list_secrets()["SecretList"] == []  # moto skips the resource type
        with moto_patches.patch_cfn_secrets():
            cfn.create_stack(StackName="patched", TemplateBody=template)
        (out,) = cfn.describe_stacks(StackName="patched")["Stacks"][0]["Outputs"]
        assert out["OutputValue"].startswith("arn:aws:secretsmanager:")
        assert len(sm.get_secret_value(SecretId=out["OutputValue"])["SecretString"]) >= 40


def test_cfn_json_template_patch(monkeypatch):
    import yaml
    from moto.cloudformation.models import Stack as CfnStack

    calls = []
    real_load = yaml.load
    monkeypatch.setattr(yaml, "load", lambda *a, **k: calls.append(1) or real_load(*a, **k))
    body = json.dumps({"Resources": {"Q": {"Type": "AWS::SQS::Queue"}}}, indent=1)
    assert CfnStack.parse_template(body) == json.loads(body) and calls  # moto: YAML first, even for JSON
    calls.clear()
    with moto_patches.patch_cfn_json_templates():
        assert CfnStack.parse_template(body) == json.loads(body)
        assert CfnStack.parse_template("Resources:\n  Q:\n    Type: AWS::SQS::Queue\n") == json.loads(body)
    assert len(calls) == 1  # only the YAML template went through the YAML loader


def test_cfn_lambda_image_patch(role_arn):
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/cdk-hnb659fds-container-assets:abc123"

    def template(name: str, role: str) -> str:
        return json.dumps({"Resources": {"Fn": {"Type": "AWS::Lambda::Function", "Properties": {
            "FunctionName": name, "Role": role, "PackageType": "Image", "Code": {"ImageUri": image},
            "ImageConfig": {"Command": ["lambdas.tasks.check_prompt.handler"]}, "Architectures": ["arm64"],
            "MemorySize": 3008}}}})

    with mock_aws():
        role = role_arn()
        cfn, lam = boto3.client("cloudformation", region_name=REGION), boto3.client("lambda", region_name=REGION)
        cfn.create_stack(StackName="plain", TemplateBody=template("plain-fn", role))
        plain = lam.get_function(FunctionName="plain-fn")["Configuration"]
        # moto drops the image properties: a zip function without a handler
        assert plain["PackageType"] == "Zip" and "ImageConfigResponse" not in plain
        assert plain["Architectures"] == ["x86_64"]
        with moto_patches.patch_cfn_lambda_image():
            cfn.create_stack(StackName="patched", TemplateBody=template("patched-fn", role))
        patched = lam.get_function(FunctionName="patched-fn")
        config = patched["Configuration"]
        assert config["PackageType"] == "Image" and config["Architectures"] == ["arm64"]
        assert config["ImageConfigResponse"]["ImageConfig"]["Command"] == ["lambdas.tasks.check_prompt.handler"]
        assert patched["Code"]["ImageUri"] == image and config["MemorySize"] == 3008
        # restored on exit
        cfn.create_stack(StackName="after", TemplateBody=template("after-fn", role))
        assert lam.get_function(FunctionName="after-fn")["Configuration"]["PackageType"] == "Zip"


def _write_order(serialised: bool) -> list[str]:
    """Thread A's UpdateItem pauses while it serialises the item (until B's write returned, at most 2 s);
    B updates the same item meanwhile. Which finished first."""
    from contextlib import nullcontext
    from unittest.mock import patch

    from moto.dynamodb.models.dynamo_type import Item

    with mock_aws(), (moto_patches.patch_dynamodb_serialised() if serialised else nullcontext()):
        ddb = boto3.client("dynamodb", region_name=REGION)
        ddb.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                         BillingMode="PAY_PER_REQUEST")
        ddb.put_item(TableName="t", Item={"pk": {"S": "job"}})
        inside, b_done, order = threading.Event(), threading.Event(), []
        original = Item.to_json

        def pausing(self):
            if threading.current_thread().name == "A" and not inside.is_set():
                inside.set()
                b_done.wait(2)
                order.append("A serialised")
            return original(self)

        def update(attr: str) -> None:
            ddb.update_item(TableName="t", Key={"pk": {"S": "job"}}, UpdateExpression=f"SET {attr} = :v",
                            ExpressionAttributeValues={":v": {"S": attr}})

        with patch.object(Item, "to_json", pausing):
            a = threading.Thread(target=update, args=("heartbeat",), name="A")
            a.start()
            assert inside.wait(10)
            update("progress")
            order.append("B written")
            b_done.set()
            a.join(10)
        return order


def test_dynamodb_requests_run_one_at_a_time_with_the_serialising_patch():
    # moto: B changes the item while A is still serialising it (the "dictionary changed size" race)
    assert _write_order(serialised=False) == ["B written", "A serialised"]
    # patched: B's request waits until A's is done
    assert _write_order(serialised=True) == ["A serialised", "B written"]


def _transactions(patched: bool) -> dict:
    """Three items on one table; a committed transaction, then a cancelled one (its second condition fails)
    that had updated one item and put a new one. How many whole-table copies moto made, and the items."""
    from contextlib import nullcontext
    from unittest.mock import patch

    from moto.dynamodb.models.table import Table

    copies = []
    real_deepcopy = __import__("copy").deepcopy

    def counting(value, memo=None):
        if isinstance(value, Table):
            copies.append(value.name)
        return real_deepcopy(value, memo)

    with mock_aws(), (moto_patches.patch_dynamodb_transaction_backup() if patched else nullcontext()):
        ddb = boto3.client("dynamodb", region_name=REGION)
        ddb.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                                   {"AttributeName": "sk", "KeyType": "RANGE"}],
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                               {"AttributeName": "sk", "AttributeType": "S"}],
                         BillingMode="PAY_PER_REQUEST")
        for sk in ("a", "b", "c"):
            ddb.put_item(TableName="t", Item={"pk": {"S": "job"}, "sk": {"S": sk}, "n": {"N": "0"}})

        def bump(sk, cond="attribute_exists(pk)"):
            return {"Update": {"TableName": "t", "Key": {"pk": {"S": "job"}, "sk": {"S": sk}},
                               "UpdateExpression": "SET n = n + :one", "ConditionExpression": cond,
                               "ExpressionAttributeValues": {":one": {"N": "1"}}}}

        with patch("copy.deepcopy", counting):
            ddb.transact_write_items(TransactItems=[bump("a"), bump("b")])
            with pytest.raises(ddb.exceptions.TransactionCanceledException):
                ddb.transact_write_items(TransactItems=[
                    bump("a"), {"Put": {"TableName": "t", "Item": {"pk": {"S": "job"}, "sk": {"S": "new"}}}},
                    bump("c", "attribute_not_exists(pk)")])
        items = {i["sk"]["S"]: i.get("n", {}).get("N") for i in ddb.scan(TableName="t")["Items"]}
    return {"table_copies": len(copies), "items": items}


def test_a_transaction_backs_up_its_own_items_not_the_tables():
    committed_then_rolled_back = {"a": "1", "b": "1", "c": "0"}
    moto = _transactions(patched=False)
    assert moto["table_copies"] >= 4  # moto copies the whole table once per transaction item
    assert moto["items"] == committed_then_rolled_back
    assert _transactions(patched=True) == {"table_copies": 0, "items": committed_then_rolled_back}


def _stream_consumer_race(role_arn) -> dict:
    """Thread A holds the Lambda runner's lock (a function running) and makes a DynamoDB call once thread B's
    write to a streamed table is under way; that write's stream consumer needs the runner's lock. Returns
    what the consumer saw and when B's write returned ("consumer stuck": the two waited on each other, and
    the consumer gave up after 2 s)."""
    from moto.dynamodb.models.table import Table

    runner_lock, b_writing, seen = threading.RLock(), threading.Event(), []
    with mock_aws(), moto_patches.patch_dynamodb_serialised():
        ddb = boto3.client("dynamodb", region_name=REGION)
        table = ddb.create_table(
            TableName="jobs", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"})["TableDescription"]
        fn = boto3.client("lambda", region_name=REGION)
        fn.create_function(FunctionName="outbox", Runtime="python3.11", Role=role_arn(), Handler="probe.handler",
                           Code={"ZipFile": code_zip()})
        fn.create_event_source_mapping(EventSourceArn=table["LatestStreamArn"], FunctionName="outbox",
                                       StartingPosition="LATEST")

        def invoker(function, event):  # like gpufleet.local.lambda_runner: one invocation at a time
            if not runner_lock.acquire(timeout=2):  # a deadlock, broken here so that the test can go on
                seen.append("consumer stuck")
                return "{}", True, "stuck"
            try:
                seen.append([r["dynamodb"]["NewImage"]["pk"]["S"] for r in event["Records"]])
            finally:
                runner_lock.release()
            return "{}", False, ""

        original_put = Table.put_item

        def slow_put(self, *args, **kwargs):  # B's write holds moto's table until A is waiting
            out = original_put(self, *args, **kwargs)
            if threading.current_thread().name == "B":
                b_writing.set()
                time.sleep(0.3)
            return out

        def a_runs_a_function():
            with runner_lock:
                b_writing.wait(5)
                ddb.get_item(TableName="jobs", Key={"pk": {"S": "job-1"}})

        def b_writes():
            ddb.put_item(TableName="jobs", Item={"pk": {"S": "job-1"}})
            seen.append("B returned")

        with moto_patches.patch_lambda(invoker), pytest.MonkeyPatch.context() as mp:
            mp.setattr(Table, "put_item", slow_put)
            threads = [threading.Thread(target=a_runs_a_function, name="A", daemon=True),
                       threading.Thread(target=b_writes, name="B", daemon=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            assert not any(t.is_alive() for t in threads)
        return seen


def test_a_stream_consumer_runs_after_the_serialised_write_releases_its_lock(role_arn, monkeypatch):
    # with the consumer invoked inside the locked write (the old patch), A and B wait on each other
    monkeypatch.setattr(moto_patches, "_DEFERRED_SENDS", _NeverDeferring())
    assert _stream_consumer_race(role_arn) == ["consumer stuck", "B returned"]
    monkeypatch.undo()
    # deferred: the consumer runs once the lock is free, still before B's write returns (synchronous, as moto's)
    assert _stream_consumer_race(role_arn) == [["job-1"], "B returned"]


class _NeverDeferring(threading.local):
    """A stand-in for the patch's per-thread state that never has a pending list (the pre-fix behaviour)."""

    @property
    def pending(self):
        return None

    @pending.setter
    def pending(self, value):
        pass


def _executions_of_one_definition(role_arn, n: int) -> tuple[int, list[str], dict[str, int]]:
    """``n`` concurrent executions of one definition whose task fails its first attempt and is retried once
    (``MaxAttempts`` 1: a retry counter reset between attempts would show as a third call). Returns how many
    times moto parsed a definition for an execution, the statuses and the calls per execution."""
    from unittest.mock import patch

    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    calls: dict[str, int] = {}
    lock = threading.Lock()

    def invoker(function, event):
        with lock:
            calls[event["name"]] = calls.get(event["name"], 0) + 1
            first = calls[event["name"]] == 1
        if first:
            return json.dumps({"errorType": "Flaky", "errorMessage": "first attempt"}), True, ""
        return json.dumps({"ok": event["name"]}), False, ""

    parses = []
    real_parse = AmazonStateLanguageParser.parse

    def counting(definition):
        parses.append(1)
        return real_parse(definition)

    fn = boto3.client("lambda", region_name=REGION)
    sfn = boto3.client("stepfunctions", region_name=REGION)
    role = role_arn()
    arn = fn.create_function(FunctionName="flaky", Runtime="python3.11", Role=role, Handler="probe.handler",
                             Code={"ZipFile": code_zip()})["FunctionArn"]
    definition = json.dumps({"StartAt": "Call", "States": {"Call": {
        "Type": "Task", "Resource": arn, "End": True,
        "Retry": [{"ErrorEquals": ["Flaky"], "MaxAttempts": 1, "IntervalSeconds": 1, "BackoffRate": 1.0}]}}})
    sm = sfn.create_state_machine(name="flaky", definition=definition, roleArn=role)["stateMachineArn"]
    with moto_patches.patch_lambda(invoker), patch.object(AmazonStateLanguageParser, "parse", staticmethod(counting)):
        arns = [sfn.start_execution(stateMachineArn=sm, name=f"e{i}", input=json.dumps({"name": f"e{i}"}))[
            "executionArn"] for i in range(n)]
        statuses = [_wait(lambda a=a: (s := sfn.describe_execution(executionArn=a)["status"]) != "RUNNING" and s)
                    for a in arns]
    return len(parses), statuses, calls


def test_stepfunctions_program_cache_patch(role_arn):
    with mock_aws(config=SFN_CONFIG):
        parses, statuses, calls = _executions_of_one_definition(role_arn, 4)
    assert parses == 4 and statuses == ["SUCCEEDED"] * 4  # moto: one parse per execution
    with mock_aws(config=SFN_CONFIG), moto_patches.patch_stepfunctions_program_cache():
        parses, statuses, calls = _executions_of_one_definition(role_arn, 4)
    assert parses == 1  # one program for every execution of the definition
    assert statuses == ["SUCCEEDED"] * 4 and calls == {f"e{i}": 2 for i in range(4)}  # each kept its own retries


def _count_query(patched: bool) -> tuple[int, int, int]:
    """(COUNT of a GSI query, items moto deep-copied for it, items a plain query returned)."""
    from contextlib import nullcontext
    from unittest.mock import patch

    from moto.dynamodb.models.dynamo_type import Item

    copied = []
    real_deepcopy = __import__("copy").deepcopy

    def counting(value, memo=None):
        if isinstance(value, list):
            copied.extend(v for v in value if isinstance(v, Item))
        return real_deepcopy(value, memo)

    with mock_aws(), (moto_patches.patch_dynamodb_count_without_copy() if patched else nullcontext()):
        ddb = boto3.client("dynamodb", region_name=REGION)
        attrs = [{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "gpk", "gsk")]
        ddb.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                         AttributeDefinitions=attrs, BillingMode="PAY_PER_REQUEST",
                         GlobalSecondaryIndexes=[{"IndexName": "gsi", "Projection": {"ProjectionType": "ALL"},
                                                  "KeySchema": [{"AttributeName": "gpk", "KeyType": "HASH"},
                                                                {"AttributeName": "gsk", "KeyType": "RANGE"}]}])
        for i in range(12):
            ddb.put_item(TableName="t", Item={"pk": {"S": f"j{i}"}, "gpk": {"S": "team" if i < 9 else "other"},
                                              "gsk": {"S": f"u{i % 3}#{i}"}})
        with patch("copy.deepcopy", counting):
            count = ddb.query(TableName="t", IndexName="gsi", Select="COUNT",
                              KeyConditionExpression="gpk = :p AND begins_with(gsk, :u)",
                              ExpressionAttributeValues={":p": {"S": "team"}, ":u": {"S": "u1#"}})["Count"]
            n_copied = len(copied)
        plain = ddb.query(TableName="t", IndexName="gsi", KeyConditionExpression="gpk = :p",
                          ExpressionAttributeValues={":p": {"S": "team"}})["Items"]
    return count, n_copied, len(plain)


def test_dynamodb_count_without_copy_patch():
    assert _count_query(patched=False) == (3, 3, 9)  # moto: the three matches are deep-copied to be counted
    assert _count_query(patched=True) == (3, 0, 9)


def _item_reads(patched: bool) -> tuple[list, int]:
    """Query, Scan, GetItem and BatchGetItem of items holding every attribute type, as botocore parses the
    responses, and how often moto's generic serializer ran for them."""
    from contextlib import nullcontext
    from unittest.mock import patch

    from moto.core.serialize import ResponseSerializer

    ran = []
    real = ResponseSerializer.serialize

    def counting(self, result):
        ran.append(self.operation_model.name)
        return real(self, result)

    item = {"pk": {"S": "a"}, "sk": {"S": "1"}, "n": {"N": "1.50"}, "b": {"B": b"\x00\xffraw"},
            "ss": {"SS": ["x", "y"]}, "ns": {"NS": ["1", "2"]}, "bs": {"BS": [b"\x01", b"\x02"]},
            "t": {"BOOL": True}, "z": {"NULL": True}, "l": {"L": [{"S": "e"}, {"N": "3"}, {"M": {}}]},
            "m": {"M": {"deep": {"M": {"s": {"S": "ü"}}}, "empty": {"L": []}}}}
    with mock_aws(), (moto_patches.patch_dynamodb_fast_item_json() if patched else nullcontext()):
        ddb = boto3.client("dynamodb", region_name=REGION)
        ddb.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                                                   {"AttributeName": "sk", "KeyType": "RANGE"}],
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                               {"AttributeName": "sk", "AttributeType": "S"}],
                         BillingMode="PAY_PER_REQUEST")
        for sk in ("1", "2", "3"):
            ddb.put_item(TableName="t", Item={**item, "sk": {"S": sk}})
        with patch.object(ResponseSerializer, "serialize", counting):
            out = [
                ddb.query(TableName="t", KeyConditionExpression="pk = :p", Limit=2,
                          ExpressionAttributeValues={":p": {"S": "a"}}, ReturnConsumedCapacity="TOTAL"),
                ddb.scan(TableName="t", ProjectionExpression="pk, sk, m.deep"),
                ddb.get_item(TableName="t", Key={"pk": {"S": "a"}, "sk": {"S": "2"}}),
                ddb.get_item(TableName="t", Key={"pk": {"S": "a"}, "sk": {"S": "9"}}),
                ddb.batch_get_item(RequestItems={"t": {"Keys": [{"pk": {"S": "a"}, "sk": {"S": "3"}}]}}),
            ]
            with pytest.raises(ddb.exceptions.ResourceNotFoundException):
                ddb.get_item(TableName="missing", Key={"pk": {"S": "a"}, "sk": {"S": "1"}})
    for resp in out:
        resp.pop("ResponseMetadata")
    return out, len(ran)


def test_dynamodb_fast_item_json_patch():
    moto_out, moto_serialised = _item_reads(patched=False)
    fast_out, fast_serialised = _item_reads(patched=True)
    assert moto_serialised == 5 and fast_serialised == 0
    assert fast_out == moto_out  # what botocore reads is the same, every attribute type included
    assert moto_out[0]["Items"][0]["b"] == {"B": b"\x00\xffraw"} and "LastEvaluatedKey" in moto_out[0]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_backend_lookup_patch():
    from unittest.mock import patch

    from moto import backends
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    listed = []
    real = backends.list_of_moto_modules

    def counting():
        listed.append(1)
        return real()

    app = DomainDispatcherApplication(lambda backend: None)
    with patch.object(backends, "list_of_moto_modules", counting):
        for _ in range(3):
            assert app.get_backend_for_host("states.us-east-1.amazonaws.com") == "stepfunctions"
        assert len(listed) == 3  # moto: its package directory is listed again for every request
        listed.clear()
        with moto_patches.patch_server_backend_lookup():
            for _ in range(3):
                assert app.get_backend_for_host("states.us-east-1.amazonaws.com") == "stepfunctions"
                assert app.get_backend_for_host("dynamodb") == "dynamodb"
                assert app.get_backend_for_host(None) is None
        assert len(listed) == 2  # once per host


def _failing_execution_log(role_arn, caplog) -> list[str]:
    fn = boto3.client("lambda", region_name=REGION)
    sfn = boto3.client("stepfunctions", region_name=REGION)
    arn = fn.create_function(FunctionName="boom", Runtime="python3.11", Role=role_arn(), Handler="probe.handler",
                             Code={"ZipFile": code_zip()})["FunctionArn"]
    definition = json.dumps({"StartAt": "Call", "States": {"Call": {"Type": "Task", "Resource": arn, "End": True}}})
    sm = sfn.create_state_machine(name="boom", definition=definition, roleArn=role_arn("boom"))["stateMachineArn"]

    def invoker(function, event):
        return json.dumps({"errorType": "Boom", "errorMessage": "no", "stackTrace": []}), True, ""

    caplog.clear()
    with caplog.at_level("ERROR", logger="moto.stepfunctions.parser.asl.component.eval_component"), \
            moto_patches.patch_lambda(invoker):
        ex = sfn.start_execution(stateMachineArn=sm, input="{}")["executionArn"]
        assert _wait(lambda: sfn.describe_execution(executionArn=ex)["status"] != "RUNNING")
        assert sfn.describe_execution(executionArn=ex)["status"] == "FAILED"
    return [r.getMessage() for r in caplog.records if "eval_component" in r.name]


def test_stepfunctions_short_error_logs_patch(role_arn, caplog):
    with mock_aws(config=SFN_CONFIG):
        moto_lines = _failing_execution_log(role_arn, caplog)
    assert moto_lines and all("(ResultPath|" in line for line in moto_lines)  # moto: the component's whole subtree
    with mock_aws(config=SFN_CONFIG), moto_patches.patch_stepfunctions_short_error_logs():
        lines = _failing_execution_log(role_arn, caplog)
    assert len(lines) == len(moto_lines) and not any("(ResultPath|" in line for line in lines)
    assert any("Error=Boom" in line and line.endswith("at StateTaskLambda 'Call'") for line in lines)


def test_foreground_gate_patch():
    from moto.server import ThreadedMotoServer

    from gpufleet.local.foreground import ForegroundGate, tag_client

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        gate = ForegroundGate(max_wait_s=30.0)

        def make():
            return boto3.client("sqs", region_name=REGION, endpoint_url=f"http://127.0.0.1:{port}",
                                aws_access_key_id="testing", aws_secret_access_key="testing")

        plain, tagged = make(), tag_client(make())
        with moto_patches.patch_foreground_gate(gate):
            plain.list_queues()  # no foreground section: at once
            section = gate.foreground()
            section.__enter__()
            waiting = threading.Thread(target=plain.create_queue, kwargs={"QueueName": "background"}, daemon=True)
            waiting.start()
            t0 = time.monotonic()
            tagged.create_queue(QueueName="foreground")  # foreground requests never wait
            assert time.monotonic() - t0 < 5.0
            time.sleep(0.3)
            assert waiting.is_alive()  # the background request waits for its turn
            assert [u.rsplit("/", 1)[1] for u in tagged.list_queues()["QueueUrls"]] == ["foreground"]
            section.__exit__(None, None, None)
            waiting.join(10)
            assert not waiting.is_alive() and gate.waits >= 1
            assert sorted(u.rsplit("/", 1)[1] for u in plain.list_queues()["QueueUrls"]) == ["background", "foreground"]
    finally:
        server.stop()


def _typed_values(patched: bool) -> tuple[list, list, int]:
    """(sizes of items of every type, the order and equalities moto gives them, DynamoType copies made by sizing)."""
    from contextlib import nullcontext
    from unittest.mock import patch

    from moto.dynamodb.models.dynamo_type import DynamoType, Item

    items = [
        {"pk": {"S": "a"}, "n": {"N": "1.50"}, "b": {"B": b"\x00\xffraw"}, "ss": {"SS": ["x", "yy"]},
         "ns": {"NS": ["1", "22"]}, "bs": {"BS": [b"\x01", b"\x02"]}, "t": {"BOOL": True}, "z": {"NULL": True},
         "l": {"L": [{"S": "e"}, {"N": "3"}, {"M": {"k": {"S": "ü"}}}]},
         "m": {"M": {"deep": {"M": {"s": {"S": "ü"}, "l": {"L": [{"BOOL": False}]}}}, "empty": {"L": []}}}},
        {"pk": {"S": "b"}, "m": {"M": {"x": {"N": "10"}}}},
    ]
    scalars = [{"S": "b"}, {"S": "a"}, {"N": "10"}, {"N": "9.5"}, {"B": b"\x02"}, {"B": b"\x01"}, {"BOOL": True}]
    made = []
    real_init = DynamoType.__init__

    def counting(self, value):
        made.append(1)
        real_init(self, value)

    with moto_patches.patch_dynamodb_fast_types() if patched else nullcontext():
        built = [Item(DynamoType({"S": i["pk"]["S"]}), None, i) for i in items]
        with patch.object(DynamoType, "__init__", counting):
            sizes = [i.size() for i in built]
        values = [DynamoType(v) for v in scalars]
        order = [(repr(a), a == b, a != b, a.type == b.type and a < b, a.cast_value) for a in values for b in values]
        order += [sorted(v.cast_value for v in values if v.type == t) for t in ("S", "N", "B")]
    return sizes, order, len(made)


def test_dynamodb_fast_types_patch():
    moto_sizes, moto_order, moto_copies = _typed_values(patched=False)
    sizes, order, copies = _typed_values(patched=True)
    assert moto_copies > 0 and copies == 0  # moto copies every map value (recursively) to size it
    assert sizes == moto_sizes and order == moto_order



def _sized_reads(patched: bool) -> tuple[list, int, int, int]:
    """(what three GSI COUNT queries and a Scan answer, item sizes computed by the first query, by the second
    one, by the one after an UpdateItem and a transaction changed one item each)."""
    from contextlib import nullcontext
    from unittest.mock import patch

    from moto.dynamodb.models.dynamo_type import Item

    sized = []
    real = Item.size

    def counting(self):
        sized.append(1)
        return real(self)

    with mock_aws(), patch.object(Item, "size", counting), \
            (moto_patches.patch_dynamodb_query_item_sizes() if patched else nullcontext()):
        ddb = boto3.client("dynamodb", region_name=REGION)
        attrs = [{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "gpk", "gsk")]
        ddb.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                         AttributeDefinitions=attrs, BillingMode="PAY_PER_REQUEST",
                         GlobalSecondaryIndexes=[{"IndexName": "gsi", "Projection": {"ProjectionType": "ALL"},
                                                  "KeySchema": [{"AttributeName": "gpk", "KeyType": "HASH"},
                                                                {"AttributeName": "gsk", "KeyType": "RANGE"}]}])
        for i in range(8):
            ddb.put_item(TableName="t", Item={"pk": {"S": f"j{i}"}, "gpk": {"S": "team"}, "gsk": {"S": f"u#{i}"},
                                              "body": {"S": "x" * 100}})

        def count():
            sized.clear()
            n = ddb.query(TableName="t", IndexName="gsi", Select="COUNT", KeyConditionExpression="gpk = :p",
                          ExpressionAttributeValues={":p": {"S": "team"}})["Count"]
            return n, len(sized)

        out, computed = [], []
        for _ in range(2):
            n, k = count()
            out.append(n)
            computed.append(k)
        ddb.update_item(TableName="t", Key={"pk": {"S": "j1"}}, UpdateExpression="SET body = :b",
                        ExpressionAttributeValues={":b": {"S": "y" * 5000}})
        ddb.transact_write_items(TransactItems=[{"Update": {
            "TableName": "t", "Key": {"pk": {"S": "j2"}}, "UpdateExpression": "REMOVE gpk"}}])
        n, k = count()
        out.append(n)
        computed.append(k)
        out.append(sorted((i["pk"]["S"], len(i["body"]["S"])) for i in ddb.scan(TableName="t")["Items"]))
    return out, *computed


def test_dynamodb_query_item_sizes_patch():
    moto_out, *moto_sized = _sized_reads(patched=False)
    out, *sized = _sized_reads(patched=True)
    assert moto_sized == [16, 16, 14]  # moto: every matched item is sized (twice) again by every query
    assert sized == [8, 0, 1]  # once, then again only the item the UpdateItem changed (j2 left the index)
    assert out == moto_out and out[:3] == [8, 8, 7]


def _queried(patched: bool) -> tuple[list, int]:
    """(what table and index queries answer — pages, order, projections, filters, counts — over a table of 60
    items in three index partitions and two table partitions; how many items moto's whole-table sort visited)."""
    from contextlib import nullcontext
    from unittest.mock import patch

    from moto.dynamodb.models.table import Table

    sorted_items = []
    real = Table.all_items

    def counting(self):
        items = real(self)
        sorted_items.append(len(items))
        return items

    with mock_aws(), patch.object(Table, "all_items", counting), \
            (moto_patches.patch_dynamodb_query_candidates() if patched else nullcontext()):
        ddb = boto3.client("dynamodb", region_name=REGION)
        attrs = [{"AttributeName": n, "AttributeType": t} for n, t in (("pk", "S"), ("sk", "N"), ("gpk", "S"),
                                                                       ("gsk", "S"), ("hpk", "S"))]
        ddb.create_table(TableName="t", AttributeDefinitions=attrs, BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                         GlobalSecondaryIndexes=[
                             {"IndexName": "gsi", "Projection": {"ProjectionType": "ALL"},
                              "KeySchema": [{"AttributeName": "gpk", "KeyType": "HASH"},
                                            {"AttributeName": "gsk", "KeyType": "RANGE"}]},
                             {"IndexName": "hash_only", "Projection": {"ProjectionType": "KEYS_ONLY"},
                              "KeySchema": [{"AttributeName": "hpk", "KeyType": "HASH"}]}])
        for i in range(60):
            item = {"pk": {"S": f"p{i % 2}"}, "sk": {"N": str(i)}, "n": {"N": str(i % 7)}, "body": {"S": "x" * (i % 5)}}
            if i % 4:  # a quarter of the items are not in the index (sparse)
                item |= {"gpk": {"S": f"g{i % 3}"}, "gsk": {"S": f"s{(i * 37) % 11:02d}"}}
            if i % 5 == 0:
                item["hpk"] = {"S": "h"}
            ddb.put_item(TableName="t", Item=item)
        ddb.delete_item(TableName="t", Key={"pk": {"S": "p1"}, "sk": {"N": "9"}})

        def pages(**kw):
            out, start = [], {}
            while True:
                got = ddb.query(TableName="t", **kw, **start)
                out.append((got["Count"], got.get("Items"), got.get("LastEvaluatedKey")))
                if "LastEvaluatedKey" not in got:
                    return out
                start = {"ExclusiveStartKey": got["LastEvaluatedKey"]}

        g = {":g": {"S": "g1"}}
        answers = [
            pages(KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "p1"}}, Limit=7),
            pages(KeyConditionExpression="pk = :p AND sk BETWEEN :a AND :b", ScanIndexForward=False,
                  ExpressionAttributeValues={":p": {"S": "p0"}, ":a": {"N": "10"}, ":b": {"N": "40"}}),
            pages(KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "nobody"}}),
            pages(IndexName="gsi", KeyConditionExpression="gpk = :g", ExpressionAttributeValues=g, Limit=4),
            pages(IndexName="gsi", KeyConditionExpression="gpk = :g AND begins_with(gsk, :s)", ScanIndexForward=False,
                  ExpressionAttributeValues={**g, ":s": {"S": "s0"}}),
            pages(IndexName="gsi", KeyConditionExpression="gpk = :g", FilterExpression="n > :n",
                  ProjectionExpression="pk, sk, body", ExpressionAttributeValues={**g, ":n": {"N": "3"}}),
            pages(IndexName="gsi", KeyConditionExpression="gpk = :g", Select="COUNT", ExpressionAttributeValues=g),
            pages(IndexName="hash_only", KeyConditionExpression="hpk = :h", ExpressionAttributeValues={":h": {"S": "h"}}),
            ddb.scan(TableName="t", Limit=5)["Items"],
        ]
    return answers, sum(sorted_items)


def test_dynamodb_query_candidates_patch():
    moto_answers, moto_sorted = _queried(patched=False)
    answers, visited = _queried(patched=True)
    assert moto_sorted >= 8 * 59  # moto: every query sorts the whole table (and the scan once more)
    assert answers == moto_answers
    assert visited < moto_sorted / 4  # patched: a query visits its partition's candidates only


def test_dynamodb_fast_projection_patch():
    from moto.dynamodb.models.dynamo_type import Item

    attrs = {
        "pk": {"S": "job#1"}, "n": {"N": "1.50"}, "big": {"N": "1e3"}, "flag": {"BOOL": False}, "none": {"NULL": True},
        "blob": {"B": "aGVsbG8="}, "tags": {"SS": ["b", "a"]}, "nums": {"NS": ["2", "1"]},
        "spec": {"M": {"resources": {"M": {"gpus": {"N": "2"}, "gpu_milli": {"N": "500"}}},
                       "workload": {"M": {"model": {"S": "m1"}, "kind": {"S": "video"}, "prompt": {"S": "x" * 300}}},
                       "pools": {"L": [{"S": "a"}, {"S": "b"}]}, "data": {"M": {}}}},
        "command": {"L": [{"S": "run"}, {"M": {"k": {"S": "v"}}}]}, "text": {"S": "plain"},
    }
    item = Item(hash_key=None, range_key=None, attrs=attrs)
    projections = [
        [["pk"], ["n"], ["big"], ["flag"], ["none"], ["blob"], ["tags"], ["nums"]],
        [["spec", "resources"], ["spec", "workload", "model"], ["spec", "workload", "kind"], ["spec", "pools"],
         ["spec", "data"], ["spec", "deadline"], ["missing"], ["spec", "workload", "image"]],
        [["spec", "workload", "model"], ["spec"]],  # a path and then its whole parent
        [["spec"], ["spec", "workload", "model"]],  # the parent and then a path inside it
        [["command"]],
        [["missing", "deeper"]],
    ]

    def as_json(it):
        return {k: v.to_json() for k, v in it.attrs.items()}

    for projection in projections:
        fast = moto_patches.fast_project(item, projection)
        assert fast is not None and as_json(fast) == as_json(item.project(projection)), projection
        assert all(fast.attrs[k] is not item.attrs[k] for k in fast.attrs)  # new values, not the stored ones
    # moto's own: a list index in a path, a path through something that is not a map
    assert moto_patches.fast_project(item, [["command[1]", "k"]]) is None
    assert moto_patches.fast_project(item, [["text", "pl"]]) is None

    def projected_query(patched: bool) -> list:
        from contextlib import nullcontext

        with mock_aws(), (moto_patches.patch_dynamodb_fast_projection() if patched else nullcontext()), \
                (moto_patches.patch_dynamodb_count_without_copy() if patched else nullcontext()):
            ddb = boto3.client("dynamodb", region_name=REGION)
            ddb.create_table(TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                             AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                             BillingMode="PAY_PER_REQUEST")
            ddb.put_item(TableName="t", Item=attrs)
            kw = {"TableName": "t", "KeyConditionExpression": "pk = :p",
                  "ExpressionAttributeValues": {":p": {"S": "job#1"}}}
            out = [ddb.query(**kw, ProjectionExpression="#s.#r, #s.#w.#m, n, tags",
                             ExpressionAttributeNames={"#s": "spec", "#r": "resources", "#w": "workload",
                                                       "#m": "model"})["Items"]]
            ddb.update_item(TableName="t", Key={"pk": {"S": "job#1"}}, UpdateExpression="SET #s.#r.gpus = :g",
                            ExpressionAttributeNames={"#s": "spec", "#r": "resources"},
                            ExpressionAttributeValues={":g": {"N": "4"}})
            out.append(ddb.query(**kw, ProjectionExpression="spec.resources")["Items"])
            out.append(ddb.get_item(TableName="t", Key={"pk": {"S": "job#1"}})["Item"])
            return out

    moto_out, out = projected_query(False), projected_query(True)
    for got in (moto_out, out):  # ordering of set members is moto's (a Python set's)
        got[0][0]["tags"]["SS"].sort()
        for key, kind in (("tags", "SS"), ("nums", "NS")):
            got[2][key][kind].sort()
    assert out == moto_out and out[1][0]["spec"]["M"]["resources"]["M"]["gpus"] == {"N": "4"}


def _client_builds(patched: bool, role_arn) -> tuple[int, list[str]]:
    """(boto3 clients moto's Step Functions built, the statuses) for four executions of a Lambda task retried once."""
    from contextlib import nullcontext
    from unittest.mock import patch

    built = []
    real = boto3.client

    def counting(*args, **kwargs):
        if "service_name" in kwargs:  # moto's boto_client_for (this test's own calls name the service first)
            built.append(kwargs["service_name"])
        return real(*args, **kwargs)

    with mock_aws(config=SFN_CONFIG), patch.object(boto3, "client", counting), \
            (moto_patches.patch_stepfunctions_client_cache() if patched else nullcontext()):
        _parses, statuses, _calls = _executions_of_one_definition(role_arn, 4)
    return len(built), statuses


def test_stepfunctions_client_cache_patch(role_arn):
    moto_built, moto_statuses = _client_builds(False, role_arn)
    built, statuses = _client_builds(True, role_arn)
    assert moto_built >= 8  # moto: a client for every task attempt
    assert built == 1 and statuses == moto_statuses == ["SUCCEEDED"] * 4


def test_batch_runner_puts_host_volumes_on_one_emulated_instance_disk(role_arn, tmp_path):
    """A definition's host volume (the GPU definitions' host cache) is one folder under the runner's host root,
    shared by its jobs; the environment naming the container path names that folder; the real path is untouched."""
    ran: list[LocalJob] = []

    def executor(local: LocalJob):
        ran.append(local)
        return 0, None

    with mock_aws(config={"batch": {"use_docker": False}}):
        batch = _batch_world(role_arn)
        batch.register_job_definition(jobDefinitionName="gpu", type="container", containerProperties={
            "image": "x", "vcpus": 1, "memory": 512, "command": ["true"],
            "volumes": [{"name": "host-cache", "host": {"sourcePath": "/var/lib/gpufleet-test-absent/cache"}}],
            "mountPoints": [{"sourceVolume": "host-cache", "containerPath": "/var/cache/x", "readOnly": False}],
            "environment": [{"name": "GPUFLEET_CACHE_DIR", "value": "/var/cache/x"},
                            {"name": "MODELS", "value": "/var/cache/x/models"},
                            {"name": "OTHER", "value": "/var/cache/xy"}]})
        runner = BatchRunner(executor, host_root=tmp_path / "instance")
        with moto_patches.patch_batch_runner(runner):
            for name in ("a", "b"):
                job = batch.submit_job(jobName=name, jobQueue="q", jobDefinition="gpu")["jobId"]
                _wait(lambda j=job: batch.describe_jobs(jobs=[j])["jobs"][0]["status"] == "SUCCEEDED")
            plain = batch.submit_job(jobName="plain", jobQueue="q", jobDefinition="d",
                                     containerOverrides={"environment": [{"name": "P", "value": "/var/cache/x"}]})
            _wait(lambda: batch.describe_jobs(jobs=[plain["jobId"]])["jobs"][0]["status"] == "SUCCEEDED")
    local = tmp_path / "instance" / "var" / "lib" / "gpufleet-test-absent" / "cache"
    assert local.is_dir() and not os.path.exists("/var/lib/gpufleet-test-absent")
    first, second, third = ran
    for job in (first, second):
        assert job.environment["GPUFLEET_CACHE_DIR"] == str(local)
        assert job.environment["MODELS"] == str(local / "models")
        assert job.environment["OTHER"] == "/var/cache/xy"  # a path beside the mount is not under it
    assert third.environment["P"] == "/var/cache/x"  # a definition without the volume: nothing moved
