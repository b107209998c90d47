"""Recovery, retry, job arrays, bulk cancel and cost reports through the API handler, on moto."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from api_helpers import ACCOUNT, ALICE, CAROL, VIDEO

from gpufleet import outbox
from gpufleet.lifecycle.billing import Charge, Outcome
from gpufleet.store import jobs as job_store
from gpufleet.store.dynamo import marshal
from gpufleet.store.ledger import DynamoLedgerStore
from gpufleet.store.principals import put_principal

OPERATOR = f"arn:aws:iam::{ACCOUNT}:role/operator"
S = "SUCCEEDED"


@pytest.fixture
def ops(deps, ddb, tables):
    put_principal(ddb, tables.control, OPERATOR, "ops", "platform", "oncall", admin=True)
    return deps


def _submit(call, key, spec=VIDEO, arn=ALICE):
    r = call("POST", "/v1/jobs", spec, headers={"Idempotency-Key": key}, arn=arn)
    assert r.status == 202, r.text
    return r.json["job_id"]


def _walk(ddb, tables, clock, job_id, path, extra=None, epoch=None):
    """Move a job along ``path`` (statuses) with the store's own conditional transitions."""
    item = job_store.get_job(ddb, tables.jobs, job_id)
    for to in path:
        item = job_store.transition(ddb, tables.jobs, job_id, [item["status"]], to,
                                    extra if to == path[-1] else None, clock=clock, epoch=epoch)
    return item


def _quarantine(ddb, tables, clock, job_id):
    from gpufleet.store.fencing import issue_epoch

    issue_epoch(ddb, tables.jobs, job_id, 0)
    ddb.put_item(TableName=tables.jobs, Item=marshal({
        "pk": f"JOB#{job_id}", "sk": "ATTEMPT#00000001", "type": "attempt", "job_id": job_id, "epoch": 1,
        "state": "LOST", "placement": {"target": "onprem", "pool": "onprem-a", "node": "node-3", "epoch": 1}}))
    job_store.append_event(ddb, tables.jobs, job_id, "attempt_failed",
                           {"epoch": 1, "class": "SYSTEM", "reason": "worker lost", "action": "retry"}, clock=clock)
    return _walk(ddb, tables, clock, job_id, ["PENDING", "SCHEDULED", "QUARANTINED"],
                 {"system_failures": 3, "crashed_workers": {"node-1", "node-2", "node-3"},
                  "failed_nodes": {"node-3"}, "final": {"outcome": "QUARANTINED", "epoch": 1}})


def _stream_modify(old, new):
    return {"eventName": "MODIFY", "dynamodb": {"SequenceNumber": "7", "OldImage": marshal(old),
                                               "NewImage": marshal(new)}}


def test_operator_routes_refuse_tenants(ops, call):
    job = _submit(call, "k1")
    for method, path in (("GET", "/v1/admin/quarantine"), ("GET", f"/v1/admin/jobs/{job}"),
                         ("POST", f"/v1/admin/jobs/{job}/release"), ("POST", f"/v1/admin/jobs/{job}/refinalize"),
                         ("POST", f"/v1/admin/jobs/{job}/cancel")):
        r = call(method, path, arn=ALICE)
        assert r.status == 403 and "operator" in r.json["detail"], (path, r.text)


def test_quarantine_list_inspect_release_starts_one_new_run(ops, call, ddb, tables, clock):
    job = _submit(call, "q1")
    before = _quarantine(ddb, tables, clock, job)
    listed = call("GET", "/v1/admin/quarantine?tenant=t1", arn=OPERATOR)
    assert [j["job_id"] for j in listed.json["jobs"]] == [job]
    seen = call("GET", f"/v1/admin/jobs/{job}", arn=OPERATOR).json
    assert seen["job"]["status"] == "QUARANTINED" and seen["crashed_workers"] == ["node-1", "node-2", "node-3"]
    assert seen["failed_nodes"] == ["node-3"] and [a["node"] for a in seen["attempts"]] == ["node-3"]
    assert seen["failures"][0]["reason"] == "worker lost"

    r = call("POST", f"/v1/admin/jobs/{job}/release", {"reason": "node-1 firmware fixed"}, arn=OPERATOR)
    assert r.status == 200, r.text
    assert r.json["status"] == "QUEUED" and r.json["system_failures"] == 0
    assert r.json["recovery"]["action"] == "release" and r.json["recovery"]["by"] == OPERATOR
    after = job_store.get_job(ddb, tables.jobs, job)
    assert "crashed_workers" not in after and "final" not in after and after["failed_nodes"] == {"node-3"}
    assert after["workflow_run"] == 1 and after["gsi4pk"]  # counts against the soft quota again
    # the outbox starts exactly one execution for the new run
    (want,) = outbox.runs_to_start([_stream_modify(before, after)])
    assert (want.job_id, want.run, want.resume) == (job, 1, None)
    assert outbox.runs_to_start([_stream_modify(after, after)]) == []
    # a second click (or another operator) finds the job QUEUED: 409, nothing written
    again = call("POST", f"/v1/admin/jobs/{job}/release", arn=OPERATOR)
    assert again.status == 409 and again.json["current_status"] == "QUEUED"


def test_cancel_a_quarantined_job_closes_it(ops, call, ddb, tables, clock):
    job = _submit(call, "q2")
    _quarantine(ddb, tables, clock, job)
    r = call("POST", f"/v1/admin/jobs/{job}/cancel", arn=OPERATOR)
    assert r.status == 200 and r.json["status"] == "CANCELLED"
    assert call("POST", f"/v1/admin/jobs/{job}/release", arn=OPERATOR).status == 409


def _finalize_failed(ddb, tables, clock, job_id, reason="finalize failed: States.TaskFailed"):
    from gpufleet.store.fencing import issue_epoch

    issue_epoch(ddb, tables.jobs, job_id, 0)
    placement = {"target": "cloud", "pool": "cloud-ondemand", "epoch": 1, "gpu_milli": 1000,
                 "price_per_gpu_hour": 3.6}
    return _walk(ddb, tables, clock, job_id, ["PENDING", "SCHEDULED", "RUNNING", "FINALIZING", "FAILED"],
                 {"placement": placement, "generated": {"key": f"jobs/{job_id}/generated/e0001/"},
                  "last_run": {"epoch": 1, "gpu_seconds": 10.0},
                  "final": {"outcome": "SYSTEM_FAILURE", "epoch": 1, "reason": reason}})


def test_refinalize_is_fenced_and_runs_once(ops, call, ddb, tables, clock):
    job = _submit(call, "f1")
    before = _finalize_failed(ddb, tables, clock, job)
    r = call("POST", f"/v1/admin/jobs/{job}/refinalize", arn=OPERATOR)
    assert r.status == 200, r.text
    assert r.json["status"] == "FINALIZING" and r.json["current_epoch"] == 1
    assert r.json["recovery"]["epoch"] == 1
    after = job_store.get_job(ddb, tables.jobs, job)
    (want,) = outbox.runs_to_start([_stream_modify(before, after)])
    assert (want.run, want.resume) == (1, "finalize")
    assert call("POST", f"/v1/admin/jobs/{job}/refinalize", arn=OPERATOR).status == 409


def test_refinalize_refuses_other_failures(ops, call, ddb, tables, clock):
    job = _submit(call, "f2")
    _finalize_failed(ddb, tables, clock, job, reason="failure budget of 3 spent: boom")
    r = call("POST", f"/v1/admin/jobs/{job}/refinalize", arn=OPERATOR)
    assert r.status == 409 and "retry" in r.json["detail"]


def test_retry_links_a_new_job_once_and_only_for_the_owner(ops, call, ddb, tables, clock):
    job = _submit(call, "r1")
    assert call("POST", f"/v1/jobs/{job}/retry", headers={"Idempotency-Key": "rr"}).status == 409  # not ended
    _walk(ddb, tables, clock, job, ["CANCELLED"])
    assert call("POST", f"/v1/jobs/{job}/retry", headers={"Idempotency-Key": "rr"}, arn=CAROL).status == 404
    first = call("POST", f"/v1/jobs/{job}/retry", headers={"Idempotency-Key": "rr"})
    assert first.status == 202, first.text
    again = call("POST", f"/v1/jobs/{job}/retry", headers={"Idempotency-Key": "rr"})
    assert again.headers.get("idempotent-replayed") == "true" and again.json["job_id"] == first.json["job_id"]
    new = call("GET", f"/v1/jobs/{first.json['job_id']}").json
    assert new["retry_of"] == job and new["status"] == "QUEUED" and new["spec"] == call("GET", f"/v1/jobs/{job}").json["spec"]
    assert [e["detail"]["job_id"] for e in call("GET", f"/v1/jobs/{job}/events").json["events"]
            if e["type"] == "retried"] == [new["job_id"]]


def test_array_of_20_submits_20_jobs_once_under_concurrent_retries(ops, call, serialized_dynamodb):
    spec = {"workload": {"kind": "video.generate", "prompt": "fox number {index}"}, "labels": {"sweep": "s1"}}
    req = {"spec": spec, "count": 20}
    results = []

    def send():
        results.append(call("POST", "/v1/job-arrays", req, headers={"Idempotency-Key": "arr-1"}))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(2):
        send()
    ok = [r for r in results if r.status == 202]
    assert ok and all(r.status in (202, 409) for r in results), [r.text for r in results]
    assert len({r.json["array_id"] for r in ok}) == 1
    array_id = ok[0].json["array_id"]
    listed = call("GET", f"/v1/jobs?array_id={array_id}&limit=100").json["jobs"]
    assert len(listed) == 20 and len(call("GET", "/v1/jobs?limit=100").json["jobs"]) == 20
    assert sorted(j["array_index"] for j in listed) == list(range(20))
    assert {j["spec"]["workload"]["prompt"] for j in listed} == {f"fox number {i}" for i in range(20)}
    other = call("POST", "/v1/job-arrays", {**req, "count": 3}, headers={"Idempotency-Key": "arr-1"})
    assert other.status == 422  # the key names another payload


def test_bulk_cancel_by_label_cancels_exactly_the_matching_jobs(ops, call):
    hit = [_submit(call, f"b{i}", {**VIDEO, "labels": {"exp": "a", "n": str(i)}}) for i in range(3)]
    miss = [_submit(call, "b3", {**VIDEO, "labels": {"exp": "b"}}), _submit(call, "b4")]
    r = call("POST", "/v1/jobs/cancel", {"labels": {"exp": "a"}})
    assert r.status == 200, r.text
    assert sorted(r.json["cancelled"]) == sorted(hit) and r.json["matched"] == 3
    for j in hit:
        assert call("GET", f"/v1/jobs/{j}").json["cancel_requested"] is True
    for j in miss:
        assert call("GET", f"/v1/jobs/{j}").json["cancel_requested"] is False
    assert call("POST", "/v1/jobs/cancel", {}).status == 400
    assert call("POST", "/v1/jobs/cancel", {"labels": {"exp": "a"}}, arn=CAROL).json["cancelled"] == []


def test_costs_equal_the_ledger_to_the_cent_with_waived_apart(ops, call, ddb, tables):
    ledger = DynamoLedgerStore(ddb, tables)
    a = _submit(call, "c1", {**VIDEO, "labels": {"project": "x"}})
    b = _submit(call, "c2", {**VIDEO, "labels": {"project": "y"}})
    c = _submit(call, "c3")
    job_store.transition(ddb, tables.jobs, a, ["QUEUED"], "PENDING", {"current_epoch": 1}, clock=ops.clock)
    job_store.transition(ddb, tables.jobs, b, ["QUEUED"], "PENDING", {"current_epoch": 2}, clock=ops.clock)
    job_store.transition(ddb, tables.jobs, c, ["QUEUED"], "PENDING", {"current_epoch": 1}, clock=ops.clock)

    def owner(job, labels):
        return {"job_id": job, "tenant": "t1", "owner_path": "t1/vision/alice", "labels": labels}

    at = "2026-06-01T00:00:00.000Z"
    ledger.record(owner(a, {"project": "x"}), 1, Charge(True, 100.0, Decimal("0.100001"), None, Outcome.SUCCEEDED),
                  pool="cloud-ondemand", price=3.6, at=at)
    ledger.record(owner(b, {"project": "y"}), 2, Charge(True, 7.0, Decimal("0.007"), None, Outcome.USER_ERROR),
                  pool="onprem-a", price=3.6, at=at)
    ledger.record_waiver(c, 1, Charge(False, 50.0, Decimal(0), "system failure", Outcome.SYSTEM_FAILURE), at,
                         job=owner(c, {}), pool="cloud-spot", price=3.6)
    rep = call("GET", "/v1/costs?by=pool").json
    assert rep["total"]["charged_usd"] == "0.107001" and rep["total"]["charged_attempts"] == 2
    assert rep["total"]["waived_usd"] == "0.050000" and rep["total"]["waived_attempts"] == 1
    assert {g["key"]: g["charged_usd"] for g in rep["groups"]} == {"cloud-ondemand": "0.100001", "onprem-a": "0.007",
                                                                  "cloud-spot": "0"}
    by_label = call("GET", "/v1/costs?by=label&label_key=project").json
    assert {g["key"]: g["charged_usd"] for g in by_label["groups"]}["x"] == "0.100001"
    assert call("GET", "/v1/costs?by=user").json["groups"][0]["key"] == "t1/vision/alice"
    from gpufleet.devstack.gateway import build_event

    csv = call.api.handle(build_event("GET", "/v1/costs?by=team&format=csv", {}, b"", user_arn=ALICE), None)
    assert csv["statusCode"] == 200 and csv["body"].splitlines()[0].startswith("key,charged_usd,")
    assert csv["body"].splitlines()[-1].startswith("total,0.107001,")
    # a tenant sees only its own costs; an operator may name one
    assert call("GET", "/v1/costs", arn=CAROL).json["total"]["charged_attempts"] == 0
    assert call("GET", "/v1/costs?tenant=t1", arn=CAROL).status == 403
    assert call("GET", "/v1/costs?tenant=t1", arn=OPERATOR).json["total"]["charged_usd"] == "0.107001"
    assert call("GET", "/v1/costs?since=2026-07-01T00:00:00Z").json["total"]["charged_attempts"] == 0


def test_a_past_deadline_is_refused_and_a_pending_job_shows_its_queue_place(ops, call, ddb, tables, clock):
    from gpufleet.clock import iso
    from gpufleet.scheduler.queueview import QueueView
    from gpufleet.store.queueview import DynamoQueueViewStore

    r = call("POST", "/v1/jobs", {**VIDEO, "deadline": iso(clock.now() - 1)}, headers={"Idempotency-Key": "late"})
    assert r.status == 400 and "deadline" in r.json["detail"]
    job = _submit(call, "qv", {**VIDEO, "deadline": iso(clock.now() + 3600)})
    store = DynamoQueueViewStore(ddb, tables.control)
    assert store.get() is None
    store.put(QueueView(at=clock.now(), pending=2, placed=0, pass_interval_s=60.0, jobs={job: (2, None)}))
    assert call("GET", f"/v1/jobs/{job}").json["queue"] is None  # QUEUED: not the scheduler's yet
    job_store.transition(ddb, tables.jobs, job, ["QUEUED"], "PENDING", clock=clock)
    q = call("GET", f"/v1/jobs/{job}").json["queue"]
    assert (q["position"], q["pending"], q["estimated_start"]) == (2, 2, None)
