"""The transactional outbox on moto: the jobs stream starts one execution per job, repeats are no-ops."""

from __future__ import annotations

import json

import boto3
import pytest
from api_helpers import REGION

from gpufleet import outbox
from gpufleet.store import jobs as job_store

SPEC = {"workload": {"kind": "video.generate", "prompt": "a fox"}}


@pytest.fixture
def state_machine(aws):
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(
        RoleName="sfn-role",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )["Role"]["Arn"]
    sfn = boto3.client("stepfunctions", region_name=REGION)
    definition = {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}}
    arn = sfn.create_state_machine(name="gpufleet-jobs", definition=json.dumps(definition), roleArn=role)[
        "stateMachineArn"
    ]
    return sfn, arn


def _stream_records(ddb, tables, job_id):
    """The INSERT record the jobs stream (NEW_AND_OLD_IMAGES) delivers for a new job.

    moto 5.2.5's DynamoDB Streams endpoint answers "Not yet implemented" with this
    botocore, so the record is built in the documented stream shape from the stored item.
    """
    item = ddb.get_item(TableName=tables.jobs, Key={"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "META"}})["Item"]
    return [
        {
            "eventID": "1",
            "eventName": "INSERT",
            "eventSource": "aws:dynamodb",
            "dynamodb": {
                "Keys": {"pk": item["pk"], "sk": item["sk"]},
                "NewImage": item,
                "SequenceNumber": "100000000000000000001",
                "StreamViewType": "NEW_AND_OLD_IMAGES",
            },
        }
    ]


def test_stream_insert_starts_one_execution_named_by_job_id_and_repeats_are_noops(ddb, tables, clock, state_machine):
    sfn, arn = state_machine
    job = job_store.create_job(ddb, tables, tenant="t1", team="a", user="u", spec=SPEC, clock=clock)
    records = _stream_records(ddb, tables, job["job_id"])
    assert outbox.jobs_to_start(records) == [(records[0]["dynamodb"]["SequenceNumber"], job["job_id"])]

    from lambdas.tasks import outbox as outbox_lambda

    outbox_lambda._deps.cache_clear()
    import os

    os.environ["GPUFLEET_STATE_MACHINE_ARN"] = arn
    try:
        first = outbox_lambda.handler({"Records": records})
        second = outbox_lambda.handler({"Records": records})  # a redelivered batch
    finally:
        del os.environ["GPUFLEET_STATE_MACHINE_ARN"]
        outbox_lambda._deps.cache_clear()
    assert first == second == {"batchItemFailures": []}
    executions = sfn.list_executions(stateMachineArn=arn)["executions"]
    assert [e["name"] for e in executions] == [job["job_id"]]
    desc = sfn.describe_execution(executionArn=executions[0]["executionArn"])
    assert json.loads(desc["input"]) == {"job_id": job["job_id"]}
    stored = job_store.get_job(ddb, tables.jobs, job["job_id"])
    assert stored["execution_arn"] == executions[0]["executionArn"]


def test_repeated_start_is_a_noop(ddb, tables, clock, state_machine):
    sfn, arn = state_machine
    jid = "job_01aaaaaaaaaaaaaaaaaaaaaaaa"
    a = outbox.start_workflow(sfn, arn, jid)
    # While it runs, Step Functions answers a same-name, same-input start with the same execution.
    b = outbox.start_workflow(sfn, arn, jid)
    assert a.outcome == "started" and b.execution_arn == a.execution_arn
    # Once it has ended, the same start is refused (ExecutionAlreadyExists): still a no-op.
    sfn.stop_execution(executionArn=a.execution_arn)
    c = outbox.start_workflow(sfn, arn, jid)
    assert c.outcome == "already_started" and c.execution_arn == a.execution_arn
    assert len(sfn.list_executions(stateMachineArn=arn)["executions"]) == 1


def test_only_job_inserts_start_workflows():
    def rec(name, pk, sk, seq):
        return {
            "eventName": name,
            "dynamodb": {
                "SequenceNumber": seq,
                "NewImage": {"pk": {"S": pk}, "sk": {"S": sk}, "job_id": {"S": pk[4:]}},
            },
        }

    records = [
        rec("INSERT", "JOB#job_1", "META", "1"),
        rec("MODIFY", "JOB#job_2", "META", "2"),
        rec("INSERT", "JOB#job_3", "EVENT#2026#000001", "3"),
        {"eventName": "REMOVE", "dynamodb": {"SequenceNumber": "4"}},
    ]
    assert outbox.jobs_to_start(records) == [("1", "job_1")]


def test_a_failed_start_is_reported_for_retry(ddb, tables, clock, state_machine):
    sfn, arn = state_machine
    job = job_store.create_job(ddb, tables, tenant="t1", team="a", user="u", spec=SPEC, clock=clock)
    records = _stream_records(ddb, tables, job["job_id"])
    missing = arn.replace("gpufleet-jobs", "no-such-machine")
    done, resp = outbox.process(records, sfn, missing)
    assert done == [] and resp == {"batchItemFailures": [{"itemIdentifier": records[0]["dynamodb"]["SequenceNumber"]}]}
