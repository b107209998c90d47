"""A cloud attempt's supervisor: its one-time token exchanged at the node API, and its session's reach.

Through the node API handler on moto (DynamoDB items, STS): RunCloud's record (the token's hash on the attempt,
fenced on the epoch), the exchange ``POST /v1/node/cloud/credentials`` (no IAM caller), then attempt operations
under the vended session. A forged token, another job's id, a reused token and a fenced-off epoch are refused
and change nothing; the session acts on its own attempt only.
"""

from __future__ import annotations

import uuid

import pytest

from gpufleet.nodeapi import supervisor
from gpufleet.store.dynamo import marshal
from gpufleet.tables import attempt_sk, job_pk

EXCHANGE = "/v1/node/cloud/credentials"


def cloud_attempt(world, job_id: str, epoch: int) -> str:
    """A SCHEDULED job at ``epoch`` on a cloud pool, RunCloud's record on its attempt; the supervisor's token."""
    placement = {
        "epoch": epoch,
        "attempt": epoch,
        "target": "cloud",
        "pool": "cloud-ondemand",
        "job_queue": "gpufleet-gpu-ondemand",
        "gpu_milli": 1000,
        "price_per_gpu_hour": 3.0,
    }
    world.put_cloud_attempt(job_id, epoch, placement)
    token, digest = supervisor.mint()
    world.runs.record_cloud_dispatch(job_id, epoch, digest, 1.0, inputs=("s3://nodeapi-out/tenants/t1/in.bin",))
    return token


def exchange(world, job_id: str, epoch: int, token: str):
    return world.call(None, "POST", EXCHANGE, {"job_id": job_id, "epoch": epoch, "token": token})


def session_arn(world, job_id: str, epoch: int) -> str:
    """The ARN API Gateway reports for the supervisor session of ``job_id``'s attempt ``epoch``."""
    account, role = world.supervisor_role.split(":")[4], world.supervisor_role.rsplit("/", 1)[-1]
    return f"arn:aws:sts::{account}:assumed-role/{role}/{supervisor.session_name(job_id, epoch)}"


def _job_id() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def test_the_token_buys_the_attempts_session_once(world):
    job_id = _job_id()
    token = cloud_attempt(world, job_id, 1)
    status, creds = exchange(world, job_id, 1, token)
    assert status == 200, creds
    assert creds["access_key_id"] and creds["session_token"] and (creds["job_id"], creds["epoch"]) == (job_id, 1)
    assert supervisor.CLAIMED_ATTR in world.attempt(job_id, 1)
    before = world.snapshot(job_id)
    status, problem = exchange(world, job_id, 1, token)  # reused
    assert status == 403 and problem["detail"] == supervisor.REFUSED
    assert world.snapshot(job_id) == before


@pytest.mark.parametrize("case", ["forged", "other job", "other epoch", "no record"])
def test_a_token_that_is_not_this_attempts_is_refused_and_nothing_changes(world, case):
    job_id, other = _job_id(), _job_id()
    token = cloud_attempt(world, job_id, 1)
    other_token = cloud_attempt(world, other, 2)
    if case == "no record":  # an on-prem style attempt: no token hash at all
        world.c["dynamodb"].update_item(
            TableName=world.tables.jobs,
            Key=marshal({"pk": job_pk(job_id), "sk": attempt_sk(1)}),
            UpdateExpression=f"REMOVE {supervisor.TOKEN_ATTR}",
        )
    ask = {
        "forged": (job_id, 1, "x" * 43),
        "other job": (job_id, 1, other_token),
        "other epoch": (other, 1, other_token),
        "no record": (job_id, 1, token),
    }[case]
    before = world.snapshot(job_id), world.snapshot(other)
    status, problem = exchange(world, *ask)
    assert status == 403 and problem["detail"] == supervisor.REFUSED
    assert (world.snapshot(job_id), world.snapshot(other)) == before


def test_a_fenced_off_attempts_token_is_stale_and_nothing_changes(world):
    job_id = _job_id()
    old = cloud_attempt(world, job_id, 1)
    cloud_attempt(world, job_id, 2)  # the next attempt: epoch 2 is current
    before = world.snapshot(job_id)
    status, problem = exchange(world, job_id, 1, old)
    assert status == 409 and problem["type"].endswith("/stale-epoch")
    assert world.snapshot(job_id) == before


def test_the_supervisor_session_acts_on_its_own_current_attempt_only(world):
    job_id, other = _job_id(), _job_id()
    cloud_attempt(world, job_id, 1)
    cloud_attempt(world, other, 1)
    me = session_arn(world, job_id, 1)
    status, view = world.op(None, job_id, 1, "progress", {"step": 2, "total": 10}, arn=me)
    assert status == 200 and view["progress"]["step"] == 2
    status, creds = world.op(None, job_id, 1, "credentials", arn=me)  # renewal: its own session again
    assert status == 200 and creds["job_id"] == job_id
    before = world.snapshot(other)
    assert world.op(None, other, 1, "progress", {"step": 9, "total": 10}, arn=me)[0] == 403
    assert world.snapshot(other) == before
    assert world.op(None, job_id, 1, "progress", arn=me.replace("/gpufleet-cloud-supervisor/", "/x/"))[0] == 403
    cloud_attempt(world, job_id, 2)  # fenced off: its epoch is no longer current
    assert world.op(None, job_id, 1, "beat", arn=me)[0] == 409


def test_the_session_policy_reaches_this_attempts_routes_and_objects_only(world):
    api = world.settings.node_api_arn
    policy = supervisor.session_policy(
        "job-1", 3, checkpoints="c", outputs="o", logs="l", api_arn=api, inputs=["s3://o/tenants/t1/in.bin"]
    )
    [invoke] = [s for s in policy["Statement"] if s["Action"] == ["execute-api:Invoke"]]
    assert invoke["Resource"] == [f"{api}/*/POST/v1/node/jobs/job-1/attempts/3/*"]
    resources = [r for s in policy["Statement"] for r in s["Resource"]]
    assert all("job-1" in r or r in ("arn:aws:s3:::c", "arn:aws:s3:::o/tenants/t1/in.bin") for r in resources)
