"""A node's agent cannot report on an attempt that is not its own at the current epoch.

The real path from the node's side: an :class:`onprem_agent.agent.Agent` built in process with the node's
own access key, its :class:`onprem_agent.aws.AttemptReports` signing each call with SigV4, the loopback
gateway verifying the signature and mapping the key to that node's agent session, the node API checking
the attempt's assignment and epoch, and a Run state on the moto server really waiting on its task token
(stored server-side by the dispatch). node-b's agent heartbeats, completes and fails node-a's attempt;
node-a's agent does the same on its own older attempt. Each call is refused (``NotAllowed`` /
``StaleEpoch``), the job's items are unchanged and both Run states still wait. node-a's agent then
completes its current attempt and that execution succeeds (so the refusals are the server's checks, not
a broken path). No agent process and no runtime are started.
"""

from __future__ import annotations

import os
import time

import boto3
import pytest

from gpufleet.clock import SystemClock
from gpufleet.errors import NotAllowed, StaleEpoch
from gpufleet.store.dynamo import unmarshal
from gpufleet.tables import attempt_sk, job_pk
from onprem_agent.agent import Agent
from onprem_agent.settings import AgentSettings

#: each report an agent makes about an attempt, as its AttemptReports makes it
REPORTS = {
    "heartbeat": lambda reports, job, epoch: reports.heartbeat(job, epoch),
    "complete": lambda reports, job, epoch: reports.succeed(job, epoch, 5.0),
    "fail": lambda reports, job, epoch: reports.fail(job, epoch, "USER_ERROR", "forged"),
}


def _agent(fleet, node: str) -> Agent:
    settings = AgentSettings.model_validate({**fleet.agent(node).settings, "metrics_enabled": False})
    kw = {"endpoint_url": fleet.endpoint, "region_name": "us-east-1"}
    return Agent(settings, clock=SystemClock(), environ=dict(os.environ), sqs=boto3.client("sqs", **kw),
                 node_api=fleet.node_api(node))


def _partition(fleet, job_id: str) -> list[dict]:
    resp = fleet.ddb.query(TableName=fleet.tables.jobs, KeyConditionExpression="pk = :p",
                           ExpressionAttributeValues={":p": {"S": job_pk(job_id)}}, ConsistentRead=True)
    return [unmarshal(i) for i in resp["Items"]]


def _dispatched(fleet, job_id: str, epoch: int, timeout: float = 20) -> None:
    """Wait until the Run state of ``epoch`` has been dispatched (its task token is on the attempt item)."""
    key = {"pk": {"S": job_pk(job_id)}, "sk": {"S": attempt_sk(epoch)}}
    deadline = time.monotonic() + timeout
    while not (unmarshal(fleet.ddb.get_item(TableName=fleet.tables.jobs, Key=key, ConsistentRead=True)
                         .get("Item")) or {}).get("run_token"):
        if time.monotonic() > deadline:
            raise AssertionError(f"the Run state of {job_id}@{epoch} was never dispatched")
        time.sleep(0.05)


@pytest.fixture
def placed(fleet):
    """job ``j-refused`` with an older attempt (epoch 1) and the current one (epoch 2), both node-a's and
    both Run states waiting; agents for node-a and node-b."""
    a, b = _agent(fleet, "node-a"), _agent(fleet, "node-b")
    fleet.submit("j-refused")
    for _ in range(2):  # each Run state is dispatched before the next epoch is issued; no agent heartbeats them,
        # so their HeartbeatSeconds outlasts the refusal loop on a loaded machine (the default 3 s did not always)
        _dispatched(fleet, "j-refused", fleet.place("j-refused", "node-a", heartbeat_s=60))
    return a, b


def test_another_nodes_or_an_older_attempt_is_refused_with_nothing_changed(fleet, placed):
    a, b = placed
    before = _partition(fleet, "j-refused")
    for name, report in REPORTS.items():
        with pytest.raises(NotAllowed):
            report(b.reports, "j-refused", 2)  # node-b on node-a's current attempt
        with pytest.raises(NotAllowed):
            report(b.reports, "j-refused", 1)  # node-b on node-a's older attempt
        with pytest.raises(StaleEpoch):
            report(a.reports, "j-refused", 1)  # node-a on its own older attempt
        assert _partition(fleet, "j-refused") == before, name
    assert fleet.execution("j-refused", 1)["status"] == "RUNNING"
    assert fleet.execution("j-refused", 2)["status"] == "RUNNING"
    # the owner's report at the current epoch goes through: the workflow gets the server's answer
    a.reports.succeed("j-refused", 2, 5.0)
    assert fleet.wait_execution("j-refused", 2, timeout=30)["status"] == "SUCCEEDED"
    assert fleet.execution("j-refused", 1)["status"] == "RUNNING"
