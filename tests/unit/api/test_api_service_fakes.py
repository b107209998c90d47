"""The API's operations on the in-memory store fakes: submission idempotency, the soft quota,
tenant scoping, listing and cancellation, with no AWS (moto) underneath. The same contracts run on
DynamoDB in tests/functional/api; the fakes' parity is held by tests/functional/store's contract
suites."""

from __future__ import annotations

import json

import pytest

from gpufleet.api import service
from gpufleet.api.settings import load
from gpufleet.clock import FakeClock
from gpufleet.errors import IdempotencyMismatch, InvalidTransition, NotFound, QuotaExceeded
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus as S
from gpufleet.store.fakes.idempotency import MemoryIdempotencyStore
from gpufleet.store.fakes.jobs import MemoryJobStore
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.principals import Principal
from gpufleet.tables import JOB_META, attempt_sk, job_pk

ALICE = Principal(arn="arn:aws:iam::1:user/alice", tenant="t1", team="vision", user="alice")
BOB = Principal(arn="arn:aws:iam::1:user/bob", tenant="t1", team="vision", user="bob")
EVE = Principal(arn="arn:aws:iam::2:user/eve", tenant="t2", team="red", user="eve")


def spec(prompt: str = "a red kite over the sea") -> JobSpec:
    return JobSpec.model_validate({"workload": {"kind": "video.generate", "prompt": prompt}})


@pytest.fixture
def deps() -> service.Deps:
    clock = FakeClock(1_780_000_000.0)
    db = MemoryDatabase()
    settings = load(cursor_secret="unit-cursor-secret-0123456789", queued_jobs_per_user=3, queued_jobs_per_team=5)
    return service.Deps(settings=settings, ddb=None, clock=clock, jobs=MemoryJobStore(db, clock),
                        idempotency=MemoryIdempotencyStore(db, clock))


def test_submission_is_idempotent_per_tenant_and_payload(deps):
    first = service.submit(deps, ALICE, spec(), "key-1")
    assert first.status == 202 and not first.replayed and first.headers["Location"] == f"/v1/jobs/{first.job_id}"
    again = service.submit(deps, ALICE, spec(), "key-1")
    assert again.replayed and (again.job_id, again.body) == (first.job_id, first.body)
    with pytest.raises(IdempotencyMismatch):
        service.submit(deps, ALICE, spec("another prompt"), "key-1")
    other_tenant = service.submit(deps, EVE, spec(), "key-1")  # keys are scoped per tenant
    assert other_tenant.job_id != first.job_id
    assert json.loads(first.body)["status"] == "QUEUED"


def test_jobs_are_scoped_to_their_tenant(deps):
    job_id = service.submit(deps, ALICE, spec(), "k").job_id
    assert service.get(deps, BOB, job_id).job_id == job_id  # same tenant
    for call in (service.get, service.events, service.cancel):
        with pytest.raises(NotFound):
            call(deps, EVE, job_id)
    assert service.list_jobs(deps, EVE, status=None, created_after=None, created_before=None, limit=10,
                             cursor=None).jobs == []


def test_the_soft_quota_counts_queued_work_and_frees_with_it(deps):
    ids = [service.submit(deps, ALICE, spec(), f"k{i}").job_id for i in range(3)]
    with pytest.raises(QuotaExceeded) as full:
        service.submit(deps, ALICE, spec(), "k3")
    assert full.value.extra["limit"] == "queued_jobs_per_user" and full.value.extra["current"] == 3
    with pytest.raises(QuotaExceeded):  # a refused submission left no claim behind: the retry is refused too
        service.submit(deps, ALICE, spec(), "k3")
    deps.jobs.transition(ids[0], [S.QUEUED], S.REJECTED)
    assert service.submit(deps, ALICE, spec(), "k4").status == 202  # a finished job frees its slot


def test_listing_pages_and_mine(deps):
    mine = [service.submit(deps, ALICE, spec(), f"a{i}").job_id for i in range(2)]
    theirs = service.submit(deps, BOB, spec(), "b0").job_id
    page = service.list_jobs(deps, ALICE, status=None, created_after=None, created_before=None, limit=2, cursor=None)
    rest = service.list_jobs(deps, ALICE, status=None, created_after=None, created_before=None, limit=2,
                             cursor=page.next_cursor)
    assert [j.job_id for j in page.jobs + rest.jobs] == sorted([*mine, theirs], reverse=True)
    only_mine = service.list_jobs(deps, ALICE, status=None, created_after=None, created_before=None, limit=10,
                                  cursor=None, mine=True)
    assert sorted(j.job_id for j in only_mine.jobs) == sorted(mine)


def test_cancel_is_idempotent_and_refused_once_terminal(deps):
    job_id = service.submit(deps, ALICE, spec(), "k").job_id
    first = service.cancel(deps, ALICE, job_id)
    assert service.cancel(deps, ALICE, job_id) == first
    assert [e.type for e in service.events(deps, ALICE, job_id).events].count("cancel_requested") == 1
    done = service.submit(deps, ALICE, spec(), "k2").job_id
    deps.jobs.transition(done, [S.QUEUED], S.REJECTED)
    with pytest.raises(InvalidTransition):
        service.cancel(deps, ALICE, done)


class RecordingSqs:
    """The one SQS call the API's cancel makes (SqsNodeSignals: a nudge on a node's signal queue)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def send_message(self, QueueUrl: str, MessageBody: str) -> dict:  # noqa: N803 (boto3's keyword names)
        self.sent.append((QueueUrl, json.loads(MessageBody)))
        return {"MessageId": str(len(self.sent))}


def test_only_the_delete_that_cancels_an_onprem_job_nudges_its_node(deps):
    """A tenant repeating DELETE cannot make the platform message a node at the API's request rate: the request that
    set cancel_requested nudges the node once; later ones (idempotent, the same view) send nothing."""
    deps.sqs = RecordingSqs()
    job_id = service.submit(deps, ALICE, spec(), "k").job_id
    placement = {"epoch": 2, "attempt": 1, "target": "onprem", "pool": "onprem-a", "node": "n7",
                 "queue_url": "https://sqs.local/1/gpufleet-node-n7", "gpu_indices": [0]}
    db, table = deps.jobs.db, deps.jobs.table
    db.put(table, {**db.get(table, (job_pk(job_id), JOB_META)), "status": "RUNNING", "placement": placement,
                   "current_epoch": 2})
    first = service.cancel(deps, ALICE, job_id)
    assert deps.sqs.sent == [("https://sqs.local/1/gpufleet-node-n7_signals",
                              {"type": "cancel", "job_id": job_id, "epoch": 2})]
    for _ in range(3):
        deps.clock.advance(0.5)
        assert service.cancel(deps, ALICE, job_id) == first
    assert len(deps.sqs.sent) == 1


def test_a_cloud_gang_shows_its_batch_nodes_as_members(deps):
    """A cloud gang is one Batch multi-node parallel job: each node's runtime records its state on the attempt
    (gang.batch_member_record) and the job view lists the node jobs, 'dispatched' until a node has recorded."""
    from gpufleet.gang import GangRole, batch_member_record

    gang = JobSpec.model_validate({"workload": {"kind": "container", "image": "localhost/t/a:1", "command": ["true"]},
                                   "resources": {"gpus": 2, "nodes": 3}})
    job_id = service.submit(deps, ALICE, gang, "cg").job_id
    placement = {"epoch": 1, "attempt": 1, "target": "cloud", "pool": "cloud-gang", "members": [{}, {}, {}]}
    db, table = deps.jobs.db, deps.jobs.table
    db.put(table, {**db.get(table, (job_pk(job_id), JOB_META)), "placement": placement, "current_epoch": 1})
    role = GangRole(rank=1, world_size=3, nodes=["b1#0", "b1#1", "b1#2"], master_addr="10.0.0.1", master_port=29500)
    db.put(table, {"pk": job_pk(job_id), "sk": attempt_sk(1), "placement": placement,
                   **batch_member_record(role, "running"),
                   **batch_member_record(role.model_copy(update={"rank": 0}), "user_error")})
    assert [m.model_dump() for m in service.get(deps, ALICE, job_id).members] == [
        {"node": "b1#0", "rank": 0, "gpus": [], "state": "user_error"},
        {"node": "b1#1", "rank": 1, "gpus": [], "state": "running"},
        {"node": "-", "rank": 2, "gpus": [], "state": "dispatched"}]


def test_a_gang_shows_each_member_with_its_node_gpus_and_state(deps):
    gang = JobSpec.model_validate({"workload": {"kind": "container", "image": "localhost/t/a:1", "command": ["true"]},
                                   "resources": {"gpus": 2, "nodes": 2}})
    job_id = service.submit(deps, ALICE, gang, "g").job_id
    assert service.get(deps, ALICE, job_id).members is None  # not placed yet
    members = [{"node": "node-a", "queue_url": "q-a", "gpu_indices": [0, 1]},
               {"node": "node-b", "queue_url": "q-b", "gpu_indices": [2, 3]}]
    placement = {"epoch": 1, "attempt": 1, "target": "onprem", "pool": "onprem-a", "node": "node-a",
                 "gpu_indices": [0, 1], "members": members}
    db, table = deps.jobs.db, deps.jobs.table
    db.put(table, {**db.get(table, (job_pk(job_id), JOB_META)), "placement": placement, "current_epoch": 1})
    attempt = {"pk": job_pk(job_id), "sk": attempt_sk(1), "placement": placement, "run_token": "secret",
               "gang": {"node-a": "succeeded", "node-b": "ready"}}
    db.put(table, attempt)
    view = service.get(deps, ALICE, job_id)
    assert [m.model_dump() for m in view.members] == [
        {"node": "node-a", "rank": 0, "gpus": [0, 1], "state": "succeeded"},
        {"node": "node-b", "rank": 1, "gpus": [2, 3], "state": "ready"}]
    assert "secret" not in view.model_dump_json()  # the attempt's task token never leaves
    db.put(table, {**attempt, "gang_failed": {"node": "node-b", "reason": "node-b: SYSTEM_ERROR: lost"},
                   "gang": {"node-a": "ready", "node-b": "ready"}})
    assert [m.state for m in service.get(deps, ALICE, job_id).members] == ["stopped", "failed"]
    from gpufleet.cli.status import describe
    from gpufleet.sdk_models import Job

    rows = dict(describe(Job.model_validate(json.loads(service.get(deps, ALICE, job_id).model_dump_json()))))
    assert rows["member 0"] == "node-a gpus 0,1 stopped" and rows["member 1"] == "node-b gpus 2,3 failed"
