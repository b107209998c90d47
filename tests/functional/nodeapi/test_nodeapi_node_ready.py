"""A heartbeat that makes a node usable puts ``NodeReady`` on the app's bus (a scheduler pass now, through the
template's rule), once: the first heartbeat, the first after its item expired, the first after draining; never a
heartbeat of a node already usable, nor a draining one. So does one that reports a GPU freer than the previous
report (a job on it ended), and only that one. A bus that refuses the event does not fail the heartbeat.
On moto: the bus's rule delivers to a queue the test reads (as the template's rule delivers to the scheduler)."""

from __future__ import annotations

import json

import boto3
import pytest

from gpufleet.clock import FakeClock
from gpufleet.nodeapi.identity import agent_session_arn
from gpufleet.nodeapi.settings import build_api

#: the conftest's world (``from conftest import`` resolves to whichever conftest xdist imported first)
REGION, ACCOUNT, AGENT_ROLE = "us-east-1", "123456789012", "gpufleet-agent"

BUS = "gpufleet-node-ready-test"
REPORT = {"free_milli": {"0": 1000, "1": 1000}, "cpu_milli_free": 8000, "memory_mib_free": 64000, "ttl_s": 60}


@pytest.fixture(scope="module")
def bus(world):
    events = boto3.client("events", region_name=REGION)
    queue = world.c["sqs"].create_queue(QueueName="node-ready-heard")["QueueUrl"]
    arn = world.c["sqs"].get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.create_event_bus(Name=BUS)
    events.put_rule(Name="wake", EventBusName=BUS,
                    EventPattern=json.dumps({"source": ["gpufleet"], "detail-type": ["NodeReady"]}))
    events.put_targets(Rule="wake", EventBusName=BUS, Targets=[{"Id": "q", "Arn": arn}])
    clock = FakeClock()
    api = build_api(world.settings.model_copy(update={"event_bus": BUS}), dynamodb=world.c["dynamodb"],
                    stepfunctions=world.c["stepfunctions"], sts=world.c["sts"], clock=clock, events=events)
    return api, clock, queue


def heartbeat(world, api, node: str, **report) -> int:
    event = {"httpMethod": "POST", "path": "/v1/node/heartbeat", "body": json.dumps({**REPORT, **report}),
             "requestContext": {"identity": {"userArn": agent_session_arn(ACCOUNT, AGENT_ROLE, node)}}}
    return api.handle(event)["statusCode"]


def heard(world, queue: str) -> list[dict]:
    out = []
    while msgs := world.c["sqs"].receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", []):
        for m in msgs:
            world.c["sqs"].delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
            body = json.loads(m["Body"])
            out.append({"type": body["detail-type"], **body["detail"]})
    return out


def test_a_node_that_becomes_usable_wakes_the_scheduler_once(world, bus):
    api, clock, queue = bus
    node = "node-b"  # node-a's item may exist from other tests of this module's world
    world.c["dynamodb"].delete_item(TableName=world.tables.control,
                                    Key={"pk": {"S": f"NODE#{node}"}, "sk": {"S": "NODE"}})
    assert heartbeat(world, api, node) == 200
    assert heard(world, queue) == [{"type": "NodeReady", "node_id": node, "pool": "onprem-a"}]
    clock.advance(10)
    assert heartbeat(world, api, node) == 200  # already usable: nothing
    assert heard(world, queue) == []
    clock.advance(120)  # its item expired (ttl 60 s): the scheduler stopped counting it
    assert heartbeat(world, api, node) == 200
    assert heard(world, queue) == [{"type": "NodeReady", "node_id": node, "pool": "onprem-a"}]
    assert heartbeat(world, api, node, draining=True) == 200  # draining: not usable, nothing
    clock.advance(5)
    assert heartbeat(world, api, node, draining=True) == 200
    assert heard(world, queue) == []
    assert heartbeat(world, api, node) == 200  # drained no more
    assert heard(world, queue) == [{"type": "NodeReady", "node_id": node, "pool": "onprem-a"}]


def test_a_heartbeat_that_frees_a_gpu_wakes_the_scheduler(world, bus):
    api, clock, queue = bus
    node = "node-b"
    world.c["dynamodb"].delete_item(TableName=world.tables.control,
                                    Key={"pk": {"S": f"NODE#{node}"}, "sk": {"S": "NODE"}})
    assert heartbeat(world, api, node, free_milli={"0": 0, "1": 1000}) == 200
    assert heard(world, queue) == [{"type": "NodeReady", "node_id": node, "pool": "onprem-a"}]  # the first
    clock.advance(1)
    assert heartbeat(world, api, node, free_milli={"0": 0, "1": 0}) == 200  # a second job started: nothing
    assert heard(world, queue) == []
    clock.advance(1)
    assert heartbeat(world, api, node, free_milli={"0": 0, "1": 1000}) == 200  # it ended: GPU 1 is free again
    assert heard(world, queue) == [{"type": "NodeReady", "node_id": node, "pool": "onprem-a"}]
    clock.advance(1)
    assert heartbeat(world, api, node, free_milli={"0": 0, "1": 1000}) == 200  # the same report again: nothing
    assert heard(world, queue) == []


def test_a_bus_that_refuses_the_event_does_not_fail_the_heartbeat(world, capsys):
    events = boto3.client("events", region_name=REGION)
    api = build_api(world.settings.model_copy(update={"event_bus": "no-such-bus"}), dynamodb=world.c["dynamodb"],
                    stepfunctions=world.c["stepfunctions"], sts=world.c["sts"], clock=FakeClock(2e9), events=events)
    assert heartbeat(world, api, "node-a") == 200  # the first at this (later) time: its old item expired
    assert world.nodes.get("node-a")["heartbeat_at"].startswith("2033")
    assert "node_ready_not_sent" in capsys.readouterr().out
