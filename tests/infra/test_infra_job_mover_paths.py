"""The job movers' writes on code paths the calls-vs-policy survey does not drive, against their bound roles.

The survey (``control_plane_survey``) places, runs, fails, blocks and cancels jobs, but drives no re-token of a
PENDING job, no worker's ``generated`` pointer reaching CompleteRun, no re-finalize resume, no lost gang or
recorded crash in ClassifyFailure, no scheduling backoff or preemption request, and no operator release or close
of a quarantined job. Each path here runs the real lifecycle and store code on moto, records its DynamoDB calls
(botocore's ``provide-client-params``) while the function under test runs, turns them into the requests IAM
authorises (:func:`iam_matcher.requests_for`) and evaluates them against the synthesized policy of the function
whose code takes that path: an attribute bound of ``infra.grants`` too tight for one of them fails here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import boto3
import pytest
from fast_moto import fast_mock_aws
from iam_matcher import Template, allowed_by, requests_for

from gpufleet.clock import FakeClock
from gpufleet.jobrecord import JobRecord
from gpufleet.lifecycle import recovery, steps
from gpufleet.lifecycle.settings import Deps, LifecycleSettings
from gpufleet.scheduler.model import Allocation, Member
from gpufleet.status import JobStatus as S
from gpufleet.store import jobs, placements
from gpufleet.store.dynamo import marshal
from gpufleet.store.fencing import issue_epoch
from gpufleet.store.schema import create_tables
from gpufleet.tables import JOB_META, TableNames, attempt_sk, job_pk

pytestmark = pytest.mark.xdist_group("cdk-synth")

REGION, ACCOUNT = "us-east-1", "123456789012"
T = TableNames()
GANG = {"target": "onprem", "pool": "onprem-a", "node": "gn1", "queue_url": "https://q", "gpu_milli": 1000,
        "price_per_gpu_hour": 1.0, "members": [{"node": "gn1"}, {"node": "gn2"}]}


class Recorder:
    """The DynamoDB calls a client makes while :meth:`as_` is active, attributed to one function key."""

    def __init__(self, client) -> None:
        self.calls: dict[str, list[tuple[str, dict]]] = {}
        self.key: str | None = None
        client.meta.events.register("provide-client-params.dynamodb.*", self._record)

    def _record(self, params, model, **_kw) -> None:
        if self.key is not None:
            self.calls.setdefault(self.key, []).append((model.name, copy.deepcopy(params)))

    @contextmanager
    def as_(self, key: str) -> Iterator[None]:
        self.key = key
        try:
            yield
        finally:
            self.key = None


@pytest.fixture(scope="module")
def world():
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        with fast_mock_aws():
            ddb = boto3.client("dynamodb", region_name=REGION)
            create_tables(ddb, T)
            s3 = boto3.client("s3", region_name=REGION)
            settings = LifecycleSettings()
            s3.create_bucket(Bucket=settings.checkpoints_bucket)
            clock = FakeClock()
            deps = Deps.build(ddb, s3=s3, settings=settings, clock=clock, rand=lambda: 0.5,
                              release=lambda job_id, epoch: placements.release(ddb, job_id, epoch, names=T, clock=clock))
            yield ddb, deps, Recorder(ddb)


@pytest.fixture(scope="module")
def recorded(world) -> dict[str, list[tuple[str, dict]]]:
    """Every path below, run once; the calls of each function key."""
    ddb, deps, rec = world

    def new_job() -> str:
        spec = {"workload": {"kind": "video.generate", "prompt": "a cat"}}
        return jobs.create_job(ddb, T, tenant="acme", team="t", user="u", spec=spec, clock=deps.clock)["job_id"]

    def place(job_id: str, placement: dict) -> dict:
        """As the scheduler's commit: a new epoch, the placement, SCHEDULED, the attempt item (not recorded)."""
        epoch = int(jobs.get_job(ddb, T.jobs, job_id)["current_epoch"]) + 1
        doc = {**placement, "epoch": epoch, "attempt": epoch}
        issue_epoch(ddb, T.jobs, job_id, epoch - 1, {"placement": doc})
        jobs.transition(ddb, T.jobs, job_id, [S.PENDING], S.SCHEDULED, clock=deps.clock)
        ddb.put_item(TableName=T.jobs, Item=marshal({"pk": job_pk(job_id), "sk": attempt_sk(epoch), "type": "attempt",
                                                      "job_id": job_id, "epoch": epoch, "placement": doc}))
        return doc

    # AwaitPlacement: a PENDING job's new token (the fenced, guarded update)
    a = new_job()
    steps.await_placement(deps, a, "tok-1")
    with rec.as_("await_placement"):
        steps.await_placement(deps, a, "tok-2")

    # ClassifyFailure: a lost gang (crashed workers, failed nodes, a new epoch) and a recorded crash
    b = new_job()
    steps.await_placement(deps, b, "tok")
    place(b, GANG)
    with rec.as_("classify_failure"):
        steps.classify_failure(deps, {"job_id": b, "error": {"Error": "States.HeartbeatTimeout"}})
    steps.await_placement(deps, b, "tok2")
    doc = place(b, {**GANG, "node": "a2", "members": None})
    ddb.update_item(TableName=T.jobs, Key=marshal({"pk": job_pk(b), "sk": attempt_sk(doc["epoch"])}),
                    UpdateExpression="SET crash = :c", ExpressionAttributeValues=marshal({":c": {"fingerprint": "f1"}}))
    with rec.as_("classify_failure"):
        steps.classify_failure(deps, {"job_id": b, "placement": doc, "error": {
            "Error": "SYSTEM_ERROR", "Cause": '{"node": "a2", "detail": "oom"}'}})

    # CompleteRun with the worker's generated pointer; MarkFinalizeFailed; an operator's re-finalize (the API);
    # CompleteRun's ResumeFinalize
    c = new_job()
    steps.await_placement(deps, c, "tok")
    doc = place(c, {"target": "cloud", "pool": "cloud-a", "job_queue": "q", "gpu_milli": 1000,
                    "price_per_gpu_hour": 1.0})
    with rec.as_("complete_run"):
        steps.complete_run(deps, {"job_id": c, "placement": doc, "result": {
            "epoch": doc["epoch"], "gpu_seconds": 3.0, "generated": {"key": f"jobs/{c}/generated/e0001.npz"}}})
    with rec.as_("mark_terminal"):
        steps.mark_terminal(deps, {"job_id": c, "placement": doc, "error": {"Error": "States.TaskFailed"}}, "FAILED",
                            "finalize")
    item = jobs.get_job(ddb, T.jobs, c)
    with rec.as_("api"):
        recovery.apply(deps.jobs, recovery.plan_refinalize(JobRecord.from_item(item), item, by="op", now=1.0))
    with rec.as_("complete_run"):
        steps.complete_run(deps, {"job_id": c, "resume": "finalize"})

    # the API: an operator releases one quarantined job and closes another
    for plan in (recovery.plan_release, recovery.plan_close):
        d = new_job()
        ddb.update_item(TableName=T.jobs, Key=marshal({"pk": job_pk(d), "sk": JOB_META}),
                        UpdateExpression="SET #s = :q, crashed_workers = :w, crashes = :c, #f = :f",
                        ExpressionAttributeNames={"#s": "status", "#f": "final"},
                        ExpressionAttributeValues=marshal({":q": "QUARANTINED", ":w": {"n1"}, ":c": {"f1|n1"},
                                                           ":f": {"outcome": "QUARANTINED"}}))
        item = jobs.get_job(ddb, T.jobs, d)
        with rec.as_("api"):
            recovery.apply(deps.jobs, plan(JobRecord.from_item(item), item, by="op", now=1.0))

    # the scheduler: a PENDING job's backoff and wait reason; a victim's preemption request; the release of a
    # placement whose workflow no longer waits
    e = new_job()
    steps.await_placement(deps, e, "tok")
    with rec.as_("scheduler"):
        placements.record_backoff(ddb, T, e, 100.0, "no pool fits", "shape-1")
        placements.record_reason(ddb, T, e, "capacity")
    doc = place(e, GANG)
    victim = Allocation(job_id=e, epoch=doc["epoch"], owner_path="acme/t/u", priority=0, pool="onprem-a",
                        gpu_type="a100", members=(Member("gn1", (0,)),), gpu_milli=1000, num_gpu=1)
    with rec.as_("scheduler"):
        placements.request_preemption(ddb, T, victim, "job_other", 5.0)
        placements.release(ddb, e, doc["epoch"], names=T, clock=deps.clock)
    return rec.calls


def _role(tpl: dict, key: str) -> str:
    (fn,) = [r for r in tpl["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
             and r["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION") == key]
    return fn["Properties"]["Role"]["Fn::GetAtt"][0]


#: per function, attributes its unexercised paths must have named (so a path that silently stopped writing is seen)
EXPECTED = {
    "await_placement": {"placement_token", "current_epoch", "cancel_requested"},
    "classify_failure": {"crashed_workers", "failed_nodes", "crashes", "last_failure", "released_at"},
    "complete_run": {"generated", "last_run", "released_at"},
    "mark_terminal": {"final"},
    "api": {"workflow_run", "release_count", "refinalize_count", "recovery", "crashed_workers", "crashes", "final",
            "active_part"},
    "scheduler": {"sched_backoff_until", "sched_reason", "sched_shape", "sched_attempts", "preempt_requested",
                  "last_preempted_at", "released_at"},
}


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_every_write_of_an_unsurveyed_path_is_allowed_by_the_functions_role(tpl, recorded, key):
    statements = Template(tpl, REGION, ACCOUNT).role_statements(_role(tpl, key))
    reqs = [r for op, p in recorded.get(key, []) for r in requests_for("dynamodb", op, p, REGION, ACCOUNT)]
    writes = [r for r in reqs if r.action in ("dynamodb:UpdateItem", "dynamodb:PutItem")
              and r.resource.endswith(f"table/{T.jobs}")]
    named = {a for r in writes for a in r.context.get("dynamodb:Attributes", [])}
    assert EXPECTED[key] <= named, f"{key}'s paths no longer name {EXPECTED[key] - named}"
    denied = sorted({f"{r.action} {r.resource.rsplit('/', 1)[-1]} {r.context.get('dynamodb:Attributes')}"
                     for r in reqs if not allowed_by(statements, r)})
    assert not denied, f"denied by the role of {key}:\n" + "\n".join(denied)

