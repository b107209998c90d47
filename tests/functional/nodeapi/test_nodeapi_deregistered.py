"""Acceptance: once an operator deregisters a node, its key gets nothing from the node API, on every route.

node-c is registered, holds a placed attempt whose Run state really waits, and works (heartbeat, view,
credentials). An operator deregisters it with force (``gpufleet.store.admin.AdminStore.deregister``, what
``DELETE /v1/admin/nodes/{id}?force=true`` writes). Then its heartbeat and ``self`` are refused at once; once its
registration is no longer trusted from the node API's short cache (``registration_ttl_s``, here by moving that
check's clock past it) every attempt route on its own attempt is refused with the same 403, nothing is written,
no credentials are vended, and the Run state keeps waiting (it ends at its heartbeat timeout and the lifecycle
places the job again). The liveness item is off the scheduler's directory. An operator registering the node
again restores it. A route added to the node API's tables is tried here automatically (driven by ``routes()``).
"""

from __future__ import annotations

import json
import uuid

import pytest
from attempt_calls import BODIES, body, op_of

from gpufleet.clock import SystemClock, iso
from gpufleet.metrics import catalog as M
from gpufleet.metrics.emf import parse_line
from gpufleet.nodeapi.app import routes
from gpufleet.nodeapi.liveness import Registration
from gpufleet.store.admin import AuditRecord, DynamoAdminStore
from gpufleet.store.snapshot import query_directory
from gpufleet.tables import DIR_NODES

NODE = "node-c"


class Later:
    """The system clock moved ``by`` seconds ahead (the registration check's clock: its cache has expired)."""

    def __init__(self, by: float) -> None:
        self.by = by

    def now(self) -> float:
        return SystemClock().now() + self.by


def _register(world) -> None:
    world.queues[NODE] = world.c["sqs"].create_queue(QueueName=f"gpufleet-node-{NODE}")["QueueUrl"]
    world.nodes.register(Registration(node_id=NODE, pool="onprem-a", gpu_type="A100", gpus=2,
                                      queue_url=world.queues[NODE], registered_by="test-admin",
                                      registered_at=_iso_now()))


def _iso_now() -> str:
    return iso(SystemClock().now())


def _listed(world) -> set[str]:
    return {it["node_id"] for it in query_directory(world.c["dynamodb"], world.tables.control, DIR_NODES)
            if "node_id" in it}


def test_a_deregistered_nodes_key_gets_nothing(world, monkeypatch, capsys):
    _register(world)
    job = f"job-c-{uuid.uuid4().hex[:8]}"
    arn = world.start(job, world.place(job, NODE, 1))
    assert world.call(NODE, "POST", "/v1/node/heartbeat", {"free_milli": {"0": 1000}})[0] == 200
    assert world.op(NODE, job, 1, "view")[0] == 200  # working, and its registration now cached
    assert world.op(NODE, job, 1, "credentials")[0] == 200
    assert NODE in _listed(world)

    admin = DynamoAdminStore(world.c["dynamodb"], world.tables.control)
    assert admin.node_allocations(NODE) == []  # this world books no allocations; the API's refusal is unit-tested
    admin.deregister(NODE, AuditRecord(at=_iso_now(), id=uuid.uuid4().hex, actor="arn:aws:iam::1:user/op",
                                       action="node.deregister", target=f"registration {NODE}"),
                     expected_version=0, purge_at=int(SystemClock().now()) + 86_400)
    assert NODE not in _listed(world)  # the scheduler's next snapshot no longer reads it

    capsys.readouterr()
    for method, path, sent in (("POST", "/v1/node/heartbeat", {"free_milli": {"0": 1000}}),
                               ("GET", "/v1/node/self", None)):
        status, problem = world.call(NODE, method, path, sent)
        assert status == 403 and problem["type"].endswith("/not-allowed"), (path, problem)
    # operators see it: NodeCallsRefused{Reason=unregistered} (the UnregisteredNodeCalls alarm) and lines naming it
    lines = capsys.readouterr().out.splitlines()
    refused = [r for line in lines for r in parse_line(line) if r[1] == M.NODE_CALLS_REFUSED.name]
    assert [(dict(r[2]), r[3]) for r in refused] == [({M.REASON: "unregistered"}, [1.0])] * 2
    named = [json.loads(line) for line in lines if '"node_call_refused"' in line]
    assert [(r["node"], r["reason"]) for r in named] == [(NODE, "unregistered")] * 2
    assert NODE not in _listed(world) and world.nodes.get(NODE)["deregistered_at"]  # the heartbeat wrote nothing

    monkeypatch.setattr(world.api.service.registered, "clock", Later(world.api.service.registered.ttl_s + 1))
    vended: list[str] = []
    vendor = world.api.service.d.credentials
    real = vendor.vend
    monkeypatch.setattr(vendor, "vend", lambda *, session_name, policy: vended.append(session_name) or real(
        session_name=session_name, policy=policy))
    before = (world.snapshot(job), world.nodes.get(NODE))
    ops = [op for op in map(op_of, routes()) if op is not None]
    assert set(ops) == set(BODIES), "a new attempt route: add a body it would accept to BODIES (attempt_calls.py)"
    problems = set()
    for op in ops:
        status, problem = world.op(NODE, job, 1, op, body(op, job))
        assert status == 403 and problem["type"].endswith("/not-allowed"), (op, problem)
        problems.add(problem["detail"])
    assert problems == {f"node {NODE!r} is not registered"}  # the registration check, before any job is read
    assert (world.snapshot(job), world.nodes.get(NODE)) == before and vended == []
    assert world.execution(arn)["status"] == "RUNNING"  # its Run state ends at its heartbeat timeout

    _register(world)  # an operator registers it again: a newer registration than the tombstone
    assert world.call(NODE, "POST", "/v1/node/heartbeat", {"free_milli": {"0": 1000}})[0] == 200
    assert NODE in _listed(world) and "deregistered_at" not in world.nodes.get(NODE)
    assert world.op(NODE, job, 1, "view")[0] == 200
    world.op(NODE, job, 1, "fail", {"error": "USER_ERROR", "detail": "test over"})


@pytest.fixture(autouse=True)
def _forget_node_c(world):
    yield
    world.api.service.registered._until.pop(NODE, None)
