"""Acceptance: an attacker holding one node's key gets nothing of another node's attempt, on every node API route.

Driven by the node API's own route table (:func:`gpufleet.nodeapi.app.routes`, the tables the handler dispatches
on): node-a holds a placed attempt whose Run state really waits; node-b (another registered node, with its own
current attempt of another job at the same epoch and an older attempt of node-a's job) calls every attempt route on
it with a body that would be valid for the owner, every other method on its path, and the same routes on jobs never
placed on it (none written, no attempt, an attempt without a placement, a cloud attempt, a gang of other nodes).
Every call is refused with the node API's refusal (403, or 409 for node-b's own older attempt, 404 for a method
with no route; never 2xx, never 5xx), no credentials are vended, and every job item, attempt item, event, node item
and Run state is unchanged. The routes that name no job, attempt or node are listed with why and tried for what they
could leak. A route added to the table without a case here fails :func:`test_every_route_is_tried_or_listed`.

(:mod:`test_nodeapi_refusals` holds the per-op basics: node-b on node-a's attempt, node-a's own older epoch.)
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

import pytest
from attempt_calls import BODIES, SHA, body, op_of

from gpufleet.nodeapi import supervisor
from gpufleet.nodeapi.app import ATTEMPT_PATH, EXCHANGE_PATH, routes
from gpufleet.store.dynamo import marshal
from gpufleet.tables import JOB_META, job_pk

ROUTES = routes()
#: the routes that name no job, attempt or node, and why; each is tried below for what it could leak or change
LISTED = {
    ("GET", "/v1/node/self"): "the caller's own registration, named by its identity only: node-b reads its own "
                              "(test_the_routes_that_name_no_attempt_act_on_the_caller_only)",
    ("POST", "/v1/node/heartbeat"): "the caller's own liveness item, named by its identity only: node-b's report "
                                    "changes node-b's item alone and cannot name another node (same test)",
    ("POST", EXCHANGE_PATH): "no IAM caller: the body's one-time token is the credential; node-b with a guessed "
                             "token on node-a's and a cloud attempt is refused (test_the_token_exchange_...)",
}
OTHER_METHODS = ("GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


def _path(job_id: str, epoch: int | str, op: str) -> str:
    return ATTEMPT_PATH.format(job=job_id, epoch=epoch, op=op)


def _job_id(tag: str) -> str:
    return f"job-{tag}-{uuid.uuid4().hex[:8]}"


@dataclass
class Scene:
    a_job: str  # node-a's current attempt at epoch 2 (node-b held epoch 1)
    b_job: str  # node-b's own current attempt, also epoch 2
    never: dict[str, str]  # what -> a job never placed on node-b
    arns: list[str]
    vended: list[str] = field(default_factory=list)

    @property
    def jobs(self) -> list[str]:
        return [self.a_job, self.b_job, *self.never.values()]


@pytest.fixture(scope="module")
def scene(world):
    a_job, b_job = _job_id("a"), _job_id("b")
    arns = [world.start(a_job, world.place(a_job, "node-b", 1)),  # node-b's older attempt of the job
            world.start(a_job, world.new_epoch(a_job, "node-a", 2)),  # node-a's, current
            world.start(b_job, world.place(b_job, "node-b", 2))]  # node-b's own, current, the same epoch
    never = {k: _job_id(k) for k in ("ghost", "queued", "unplaced", "cloud", "gang")}
    ddb = world.c["dynamodb"]
    ddb.put_item(TableName=world.tables.jobs, Item=marshal({  # a job item at epoch 2, no attempt item
        "pk": job_pk(never["queued"]), "sk": JOB_META, "job_id": never["queued"], "tenant": "t1",
        "status": "PENDING", "current_epoch": 2}))
    world.put_cloud_attempt(never["unplaced"], 2, {})
    world.put_cloud_attempt(never["cloud"], 2, {"epoch": 2, "attempt": 2, "target": "cloud", "pool": "cloud-ondemand",
                                                "job_queue": "gpufleet-gpu-ondemand", "gpu_milli": 1000})
    _token, digest = supervisor.mint()
    world.runs.record_cloud_dispatch(never["cloud"], 2, digest, 1.0, inputs=())
    member = {"queue_url": world.queues["node-a"], "gpu_indices": [0], "gpu_link": ""}
    world.put_cloud_attempt(never["gang"], 2, {
        "epoch": 2, "attempt": 2, "target": "onprem", "pool": "onprem-a", "node": "node-a",
        "queue_url": world.queues["node-a"], "gpu_indices": [0], "gpu_milli": 1000,
        "members": [{**member, "node": "node-a"}, {**member, "node": "node-c"}]})
    assert world.call("node-a", "POST", "/v1/node/heartbeat", {"free_milli": {"0": 1000}})[0] == 200
    s = Scene(a_job, b_job, never, arns)
    vendors = [v for v in (world.api.service.d.credentials, world.api.service.d.supervisor_credentials) if v]
    reals = [v.vend for v in vendors]
    for v, real in zip(vendors, reals, strict=True):
        v.vend = lambda *, session_name, policy, _real=real: s.vended.append(session_name) or _real(
            session_name=session_name, policy=policy)
    yield s
    for v, real in zip(vendors, reals, strict=True):
        v.vend = real


def _state(world, scene: Scene) -> dict:
    """Everything a refused call must leave alone: every item of the scene's jobs (job, attempts, events), node-a's
    registration and liveness item, node-b's registration, every Run state, the credentials vended."""
    return {"jobs": {j: world.snapshot(j) for j in scene.jobs},
            "node-a": (world.nodes.registration("node-a"), world.nodes.get("node-a")),
            "node-b": world.nodes.registration("node-b"),
            "runs": [world.execution(a)["status"] for a in scene.arns], "vended": list(scene.vended)}


def test_every_route_is_tried_or_listed():
    """A route added to the node API's tables must get a case here (BODIES) or be listed with a reason (LISTED)."""
    tried = {("POST", _path("{job}", "{epoch}", op)) for op in BODIES}
    assert len(ROUTES) == len(set(ROUTES)) and len(ROUTES) >= len(BODIES) + len(LISTED)
    assert set(ROUTES) - tried - set(LISTED) == set(), "a new node API route: add its body to BODIES or list it"
    assert (tried | set(LISTED)) - set(ROUTES) == set(), "BODIES or LISTED name a route the node API no longer has"
    assert all(len(why) > 20 for why in LISTED.values())


@pytest.mark.parametrize("route", [r for r in ROUTES if r not in LISTED], ids=lambda r: f"{r[0]} {op_of(r) or r[1]}")
def test_another_node_is_refused_on_every_attempt_route(world, scene, route):
    op = op_of(route)
    assert op is not None and op in BODIES, f"{route} is not an attempt route nor listed: try it here or list it"
    before = _state(world, scene)
    a, b = scene.a_job, scene.b_job
    cases = [("node-b", a, 2, 403), ("node-b", a, "02", 403),  # node-a's current attempt (and its epoch spelt 02)
             ("node-b", a, 1, 409),  # node-b's own older attempt of that job: stale, nothing more
             ("node-a", a, 1, 403),  # node-a on node-b's older attempt of its own job
             ("node-a", b, 2, 403),  # node-a on node-b's current attempt, the epoch node-a holds itself
             ("node-b", a, 3, 403), ("node-b", a, 0, 403)]  # epochs never placed
    cases += [("node-b", job, 2, 403) for job in scene.never.values()]
    problems = {}
    for node, job, epoch, want in cases:
        status, problem = world.call(node, route[0], _path(job, epoch, op), body(op, job))
        assert status == want, (node, job, epoch, problem)
        assert problem["type"].endswith("/not-allowed" if want == 403 else "/stale-epoch")
        if want == 409:
            assert problem["current_epoch"] == 2
        problems[(node, job, epoch)] = {k: v for k, v in problem.items() if k != "instance"}
    # one refusal for all: another node's attempt reads like a job that was never written
    assert problems[("node-b", a, 2)] == problems[("node-b", scene.never["ghost"], 2)]
    for method in OTHER_METHODS:
        status, problem = world.call("node-b", method, _path(a, 2, op), body(op, a))
        assert status == 404 and problem["type"].endswith("/not-found"), (method, problem)
    assert _state(world, scene) == before


def test_the_routes_that_name_no_attempt_act_on_the_caller_only(world, scene):
    before = _state(world, scene)
    status, reg = world.call("node-b", "GET", "/v1/node/self")
    assert status == 200 and reg["node_id"] == "node-b" and reg["queue_url"] == world.queues["node-b"]
    status, item = world.call("node-b", "POST", "/v1/node/heartbeat", {"free_milli": {"0": 0}, "running_jobs": 1})
    assert status == 200 and item["node_id"] == "node-b" and world.nodes.get("node-b")["running_jobs"] == 1
    for forged in ({"node_id": "node-a"}, {"node": "node-a"}, {"queue_url": world.queues["node-a"]}):
        status, problem = world.call("node-b", "POST", "/v1/node/heartbeat", forged)
        assert status == 400 and problem["type"].endswith("/validation"), forged
    assert _state(world, scene) == before


def test_the_token_exchange_gives_another_node_nothing(world, scene):
    before = _state(world, scene)
    guess = "x" * 32
    for job in (scene.a_job, scene.b_job, scene.never["cloud"], scene.never["ghost"]):
        for arn in (None, "arn:aws:sts::123456789012:assumed-role/gpufleet-agent/node-b"):
            status, problem = world.call(None, "POST", EXCHANGE_PATH, {"job_id": job, "epoch": 2, "token": guess},
                                         arn=arn)
            assert status == 403 and problem["type"].endswith("/not-allowed"), (job, problem)
    assert _state(world, scene) == before  # the cloud attempt's token is still unclaimed, nothing vended



def test_the_owner_is_not_refused(world, scene):
    """The control: the refusals above are the check's, not a broken scene (the owner's view and credentials work)."""
    status, seen = world.op("node-a", scene.a_job, 2, "view")
    assert status == 200 and seen["current_epoch"] == 2
    assert world.op("node-b", scene.b_job, 2, "credentials")[0] == 200
    assert scene.vended == [f"node-b@{scene.b_job}"]

DEEP: dict = {}
_d = DEEP
for _ in range(40):
    _d["a"] = {}
    _d = _d["a"]


@pytest.mark.parametrize(("op", "body"), [
    ("progress", {"step": 10**40, "total": 1}), ("checkpoint", {"key": "jobs/{job}/c", "sha256": SHA, "step": 10**40}),
    ("generated", {"key": "jobs/{job}/o/", "sha256": SHA, "files": 10**40}),
    ("staging", {"staging": {"bytes": float("nan")}}), ("staging", {"staging": {"bytes": 1e130}}),
    ("staging", {"staging": DEEP}), ("phases", {"phases": {"steps": 10**40}}), ("phases", {"phases": {"started": 1e130}}),
    ("event", {"kind": "resumed", "detail": {"x": 1e-200}}), ("event", {"kind": "resumed", "detail": DEEP}),
    ("complete", {"gpu_seconds": float("inf")}),  # was accepted (and capped): refused now like any unstorable body
    ("node-heartbeat", {"running_jobs": 10**40}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_body_the_store_cannot_hold_is_a_400_never_a_5xx(world, scene, op, body):
    """Found here: numbers DynamoDB cannot hold (NaN, over 38 digits, out of its range) in a node's own call raised
    out of the handler (a 5xx), and documents nested past DynamoDB's 32 levels would be a 502 from the real table."""
    job = _job_id("own")
    world.place(job, "node-b", 1)  # node-b's own attempt
    before = (_state(world, scene), world.snapshot(job), world.nodes.get("node-b"))
    body = json.loads(json.dumps(body).replace("{job}", job))
    path = "/v1/node/heartbeat" if op == "node-heartbeat" else _path(job, 1, op)
    status, problem = world.call("node-b", "POST", path, body)
    assert status == 400 and problem["type"].endswith("/validation"), problem
    assert (_state(world, scene), world.snapshot(job), world.nodes.get("node-b")) == before
