"""A two-node gang through RunOnPrem's dispatch and the node API, on moto with a Run state that really waits:
one message per member on each member's queue (same epoch, its own rank and GPUs); each node acts only on
its own member; the start barrier opens when both are ready; the attempt succeeds when both succeed, with
both members' GPU-seconds; one member failing, a member going silent, or the barrier timing out fails the
attempt for every member (their next heartbeat is 410), so the lifecycle retries the gang as a unit."""

from __future__ import annotations

import json
import time

import pytest

from gpufleet.clock import FakeClock
from gpufleet.nodeapi.identity import agent_session_arn
from gpufleet.nodeapi.settings import build_api
from gpufleet.store.dynamo import marshal
from gpufleet.store.jobs import list_events
from gpufleet.tables import attempt_sk, job_pk

A, B = "node-a", "node-b"


def _gang(world, job_id: str, epoch: int = 1) -> dict:
    """``world.place`` with a 2-member gang placement (rank 0 on node-a's GPU 0+1, rank 1 on node-b's)."""
    run = world.place(job_id, A, epoch)
    members = [{"node": n, "queue_url": world.queues[n], "gpu_indices": [0, 1]} for n in (A, B)]
    placement = {**run["envelope"]["placement"], "gpu_indices": [0, 1], "members": members}
    run["envelope"]["placement"] = placement
    ddb = world.c["dynamodb"]
    for key in ({"pk": job_pk(job_id), "sk": "META"}, {"pk": job_pk(job_id), "sk": attempt_sk(epoch)}):
        ddb.update_item(TableName=world.tables.jobs, Key=marshal(key), UpdateExpression="SET placement = :p",
                        ExpressionAttributeValues=marshal({":p": placement}))
    return run


def _view(world, node, job_id, epoch=1):
    return world.op(node, job_id, epoch, "heartbeat")


def _gang_events(world, job_id: str) -> list[tuple[str, dict]]:
    """The job's gang_started / gang_ended events (GET /v1/jobs/{id}/events reads the same items)."""
    return [(e["type"], e["detail"]) for e in list_events(world.c["dynamodb"], world.tables.jobs, job_id)
            if e["type"].startswith("gang_")]


def test_each_member_gets_its_envelope_and_the_attempt_succeeds_when_both_do(world):
    arn = world.start("job_gang1", _gang(world, "job_gang1"))
    [ma], [mb] = world.node_messages(A), world.node_messages(B)
    assert [(m["gang"]["rank"], m["epoch"], m["placement"]["node"]) for m in (ma, mb)] == [(0, 1, A), (1, 1, B)]
    assert ma["gang"]["master_addr"] == mb["gang"]["master_addr"] == A and "task_token" not in ma
    code, v = _view(world, A, "job_gang1")
    assert code == 200 and v["gang"] == {"rank": 0, "world_size": 2, "released": False, "ready": 1}
    assert _gang_events(world, "job_gang1") == []  # the barrier is still closed
    code, v = _view(world, B, "job_gang1")
    assert v["gang"]["released"] is True and v["gang"]["rank"] == 1
    assert _view(world, A, "job_gang1")[1]["gang"]["released"] is True
    members = [{"node": A, "rank": 0, "gpus": [0, 1]}, {"node": B, "rank": 1, "gpus": [0, 1]}]
    assert _gang_events(world, "job_gang1") == [("gang_started", {"epoch": 1, "members": members})]  # once
    # GPU-seconds a member reports are capped by its GPUs × the time since dispatch (real clock here): report
    # amounts that milliseconds of moto calls already cover, so the sum does not depend on the machine's speed
    code, r = world.op(A, "job_gang1", 1, "complete", {"gpu_seconds": 0.002})
    assert (code, r) == (200, {"reported": "MEMBER_SUCCEEDED"})
    assert world.execution(arn)["status"] == "RUNNING"
    assert world.op(A, "job_gang1", 1, "complete", {"gpu_seconds": 0.002})[1] == {"reported": "MEMBER_SUCCEEDED"}
    code, r = world.op(B, "job_gang1", 1, "complete", {"gpu_seconds": 0.001})
    assert code == 200 and r["reported"] == "SUCCEEDED" and r["output"]["gpu_seconds"] == pytest.approx(0.003)
    d = world.wait_done(arn)
    assert d["status"] == "SUCCEEDED" and json.loads(d["output"])["gpu_seconds"] == pytest.approx(0.003)
    assert world.op(B, "job_gang1", 1, "complete", {"gpu_seconds": 0.001})[0] == 410  # a late repeat changes nothing
    (started, ended) = _gang_events(world, "job_gang1")
    assert started[0] == "gang_started" and ended[0] == "gang_ended"
    assert ended[1]["outcome"] == "SUCCEEDED" and ended[1]["epoch"] == 1
    assert ended[1]["gpu_seconds"] == pytest.approx(0.003)


def test_one_member_failing_fails_the_attempt_and_stops_the_other(world):
    arn = world.start("job_gang2", _gang(world, "job_gang2"))
    world.node_messages(A), world.node_messages(B)
    _view(world, A, "job_gang2"), _view(world, B, "job_gang2")
    code, r = world.op(B, "job_gang2", 1, "fail", {"error": "SYSTEM_ERROR", "detail": "agent lost"})
    assert code == 200 and r["cause"]["gang"] is True and r["cause"]["node"] == B
    d = world.wait_done(arn)
    assert d["status"] == "FAILED"
    assert _view(world, A, "job_gang2")[0] == 410  # the other member is told to stop
    assert world.op(A, "job_gang2", 1, "complete", {"gpu_seconds": 1})[0] == 410
    assert world.op("node-c", "job_gang2", 1, "heartbeat")[0] == 403  # not a member: refused
    world.op(A, "job_gang2", 1, "fail", {"error": "SYSTEM_ERROR", "detail": "late"})  # a second failure report
    (started, ended) = _gang_events(world, "job_gang2")  # each once, the second failure adds nothing
    assert started[0] == "gang_started"
    assert ended == ("gang_ended", {"epoch": 1, "outcome": "FAILED", "node": B, "reason": f"{B}: SYSTEM_ERROR: agent lost"})


@pytest.mark.parametrize("case", ["silent", "barrier"])
def test_a_silent_member_or_a_closed_barrier_fails_the_whole_gang(world, case):
    job_id = f"job_gang_{case}"
    clock = FakeClock(time.time())
    api = build_api(world.settings.model_copy(update={"gang_silence_s": 30.0, "gang_barrier_timeout_s": 60.0}),
                    dynamodb=world.c["dynamodb"], stepfunctions=world.c["stepfunctions"], sts=None, clock=clock)
    arn = world.start(job_id, _gang(world, job_id))
    world.node_messages(A), world.node_messages(B)

    def beat(node):
        resp = api.handle({"httpMethod": "POST", "path": f"/v1/node/jobs/{job_id}/attempts/1/heartbeat", "body": "{}",
                           "requestContext": {"identity": {"userArn": agent_session_arn("123456789012", "gpufleet-agent", node)}}})
        return resp["statusCode"], json.loads(resp["body"])

    assert beat(A)[0] == 200
    if case == "silent":
        assert beat(B)[1]["gang"]["released"] is True
        clock.advance(20)
        assert beat(A)[0] == 200
        clock.advance(20)  # B last beat 40 s ago
        code, body = beat(A)
    else:
        clock.advance(120)  # B never arrived (the fake clock started before the dispatch: well past 60 s after it)
        code, body = beat(A)
    assert code == 410
    d = world.wait_done(arn)
    assert d["status"] == "FAILED" and d.get("error", "SYSTEM_ERROR") == "SYSTEM_ERROR"
    assert json.loads(d.get("cause", "{}")).get("node", B) == B  # blamed: the silent / missing member
    assert beat(B)[0] == 410
    kinds = [k for k, _ in _gang_events(world, job_id)]
    assert kinds == (["gang_started", "gang_ended"] if case == "silent" else ["gang_ended"])  # never started: no start
    assert _gang_events(world, job_id)[-1][1]["outcome"] == "FAILED"

