"""ClassifyFailure records the nodes of a lost attempt on the job (moto), from the state's placement
or, when Step Functions gave none, from the attempt item the scheduler wrote; the scheduler's snapshot
then avoids them."""

from __future__ import annotations

from gpufleet.clock import FakeClock
from gpufleet.lifecycle import steps
from gpufleet.pools import load_pools
from gpufleet.status import JobStatus as S
from gpufleet.store import jobs
from gpufleet.store.dynamo import marshal
from gpufleet.store.fencing import issue_epoch
from gpufleet.store.snapshot import load_snapshot
from gpufleet.tables import TableNames, attempt_sk, job_pk

T = TableNames()


def _place(aws, job_id: str, placement: dict, *, attempt_item: bool) -> dict:
    """Place as the scheduler's commit does: new epoch, placement on the job, the attempt item."""
    ddb = aws["dynamodb"]
    epoch = int(jobs.get_job(ddb, T.jobs, job_id)["current_epoch"]) + 1
    doc = {**placement, "epoch": epoch, "attempt": epoch}
    issue_epoch(ddb, T.jobs, job_id, epoch - 1, {"placement": doc})
    jobs.transition(ddb, T.jobs, job_id, [S.PENDING], S.SCHEDULED, remove=("placement_token",), clock=FakeClock())
    if attempt_item:
        ddb.put_item(TableName=T.jobs, Item=marshal({"pk": job_pk(job_id), "sk": attempt_sk(epoch), "type": "attempt",
                                                      "job_id": job_id, "epoch": epoch, "placement": doc}))
    return doc


GANG = {"target": "onprem", "pool": "onprem-a", "node": "gn1", "queue_url": "https://q", "gpu_milli": 1000,
        "price_per_gpu_hour": 1.0, "members": [{"node": "gn1"}, {"node": "gn2"}]}


def test_timeout_without_placement_takes_the_nodes_from_the_attempt_item(deps, new_job, aws, released):
    job = new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    doc = _place(aws, job["job_id"], GANG, attempt_item=True)
    d = steps.classify_failure(deps, {"job_id": job["job_id"], "error": {"Error": "States.HeartbeatTimeout"}})
    assert d["action"] == "retry"
    after = jobs.get_job(aws["dynamodb"], T.jobs, job["job_id"])
    assert after["failed_nodes"] == {"gn1", "gn2"} and after["crashed_workers"] == {"gn1"}
    assert after["last_failure"]["worker"] == "gn1" and after["last_failure"]["epoch"] == 0
    assert doc["epoch"] == 1


def test_timeout_with_placement_and_union_over_attempts(deps, new_job, aws, released):
    job = new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    p1 = _place(aws, job["job_id"], {**GANG, "node": "a1", "members": None}, attempt_item=False)
    steps.classify_failure(deps, {"job_id": job["job_id"], "placement": p1, "error": {"Error": "States.Timeout"}})
    steps.await_placement(deps, job["job_id"], "tok2")
    p2 = _place(aws, job["job_id"], {**GANG, "node": "a2", "members": None}, attempt_item=False)
    # a crash the agent reported: the worker is named, nothing was lost
    steps.classify_failure(deps, {"job_id": job["job_id"], "placement": p2,
                                  "error": {"Error": "SYSTEM_ERROR", "Cause": '{"node": "a2", "detail": "oom"}'}})
    after = jobs.get_job(aws["dynamodb"], T.jobs, job["job_id"])
    assert after["failed_nodes"] == {"a1"} and after["crashed_workers"] == {"a1", "a2"}
    assert released == [(job["job_id"], p1["epoch"]), (job["job_id"], p2["epoch"])]
    steps.await_placement(deps, job["job_id"], "tok3")
    (pending,) = [j for j in load_snapshot(aws["dynamodb"], T, load_pools({}), 0.0).jobs
                  if j.job_id == job["job_id"]]
    assert pending.avoid_nodes == {"a1", "a2"}


def test_placement_wait_timeout_records_no_node(deps, new_job, aws, released):
    job = new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    d = steps.classify_failure(deps, {"job_id": job["job_id"], "error": {"Error": "States.Timeout"}})
    assert d["action"] == "retry"
    after = jobs.get_job(aws["dynamodb"], T.jobs, job["job_id"])
    assert "failed_nodes" not in after and "crashed_workers" not in after
