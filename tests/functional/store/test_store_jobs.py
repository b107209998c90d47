"""Job repository, idempotency records and principals against moto DynamoDB."""

from __future__ import annotations

import pytest

from gpufleet.errors import (
    BadRequest,
    IdempotencyInFlight,
    IdempotencyMismatch,
    InvalidTransition,
    NotFound,
    Unauthorized,
)
from gpufleet.status import JobStatus as S
from gpufleet.store import idempotency as idem
from gpufleet.store import jobs, principals
from gpufleet.store.schema import TABLES, create_tables

SECRET = b"k" * 32
SPEC = {"workload": {"kind": "video.generate", "prompt": "a fox"}, "priority": 100}


def _new(ddb, tables, clock, tenant="t1", team="a", user="u1", **kw):
    job = jobs.create_job(ddb, tables, tenant=tenant, team=team, user=user, spec=SPEC, clock=clock, **kw)
    clock.advance(0.003)
    return job


def test_create_tables_matches_schema_and_is_idempotent(ddb, tables):
    desc = ddb.describe_table(TableName=tables.jobs)["Table"]
    assert {i["IndexName"] for i in desc["GlobalSecondaryIndexes"]} == {i.name for i in TABLES["jobs"].indexes}
    assert desc["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    ttl = ddb.describe_time_to_live(TableName=tables.control)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "expires_at"
    again = create_tables(ddb, tables)
    assert "jobs" in again.stream_arns


def test_create_writes_job_and_created_event_and_get_is_tenant_scoped(ddb, tables, clock):
    job = _new(ddb, tables, clock)
    got = jobs.get_job(ddb, tables.jobs, job["job_id"], "t1")
    assert got["status"] == "QUEUED" and got["owner_path"] == "t1/a/u1"
    with pytest.raises(NotFound):
        jobs.get_job(ddb, tables.jobs, job["job_id"], "t2")
    with pytest.raises(NotFound):
        jobs.get_job(ddb, tables.jobs, "job_01unknown", "t1")
    events = jobs.list_events(ddb, tables.jobs, job["job_id"], "t1")
    assert [e["type"] for e in events] == ["created"]
    with pytest.raises(NotFound):
        jobs.list_events(ddb, tables.jobs, job["job_id"], "t2")


def test_transition_follows_table_maintains_indexes_and_appends_events(ddb, tables, clock):
    job = _new(ddb, tables, clock)
    jid = job["job_id"]
    after = jobs.transition(ddb, tables.jobs, jid, [S.QUEUED], S.PENDING, {"placement_token": "tok"}, clock=clock)
    assert after["status"] == "PENDING" and after["gsi3pk"].startswith("PENDING#") and after["placement_token"] == "tok"
    assert after["gsi3sk"] == after["pending_sort"] and "gsi4pk" in after
    with pytest.raises(InvalidTransition) as ei:
        jobs.transition(ddb, tables.jobs, jid, [S.QUEUED], S.PENDING, clock=clock)
    assert ei.value.extra["current_status"] == "PENDING"
    with pytest.raises(InvalidTransition):  # not in the table at all
        jobs.transition(ddb, tables.jobs, jid, [S.PENDING], S.SUCCEEDED, clock=clock)
    jobs.transition(ddb, tables.jobs, jid, [S.PENDING], S.SCHEDULED, clock=clock)
    run = jobs.transition(ddb, tables.jobs, jid, [S.SCHEDULED], S.RUNNING, clock=clock)
    assert "gsi3pk" not in run and "gsi4pk" not in run
    with pytest.raises(NotFound):
        jobs.transition(ddb, tables.jobs, "job_01missing", [S.QUEUED], S.PENDING, clock=clock)
    jobs.append_event(ddb, tables.jobs, jid, "progress", {"step": 3}, clock=clock)
    kinds = [e["type"] for e in jobs.list_events(ddb, tables.jobs, jid)]
    assert kinds == ["created", "status", "status", "status", "progress"]


def test_count_active_follows_status(ddb, tables, clock):
    a = _new(ddb, tables, clock, user="u1")
    _new(ddb, tables, clock, user="u1")
    _new(ddb, tables, clock, user="u2")
    _new(ddb, tables, clock, team="b", user="u1")
    assert jobs.count_active(ddb, tables.jobs, "t1", "a", "u1") == (2, 3)
    jobs.transition(ddb, tables.jobs, a["job_id"], [S.QUEUED], S.REJECTED, clock=clock)
    assert jobs.count_active(ddb, tables.jobs, "t1", "a", "u1") == (1, 2)


def test_request_cancel_is_idempotent_and_refuses_terminal(ddb, tables, clock):
    job = _new(ddb, tables, clock)
    jid = job["job_id"]
    with pytest.raises(NotFound):
        jobs.request_cancel(ddb, tables.jobs, jid, "t2", clock=clock)
    first = jobs.request_cancel(ddb, tables.jobs, jid, "t1", clock=clock)
    second = jobs.request_cancel(ddb, tables.jobs, jid, "t1", clock=clock)
    assert first["cancel_requested"] is True and first == second
    assert [e["type"] for e in jobs.list_events(ddb, tables.jobs, jid)].count("cancel_requested") == 1
    done = _new(ddb, tables, clock)
    jobs.transition(ddb, tables.jobs, done["job_id"], [S.QUEUED], S.REJECTED, clock=clock)
    with pytest.raises(InvalidTransition) as ei:
        jobs.request_cancel(ddb, tables.jobs, done["job_id"], "t1", clock=clock)
    assert ei.value.status == 409 and ei.value.extra["current_status"] == "REJECTED"


def test_list_newest_first_paged_filtered_and_scoped(ddb, tables, clock):
    made = [_new(ddb, tables, clock, user="u1" if i % 2 else "u2") for i in range(7)]
    _new(ddb, tables, clock, tenant="t2")
    jobs.transition(ddb, tables.jobs, made[0]["job_id"], [S.QUEUED], S.REJECTED, clock=clock)
    seen, cur = [], None
    while True:
        page, cur = jobs.list_jobs(ddb, tables.jobs, tenant="t1", secret=SECRET, limit=3, cursor=cur)
        seen += [j["job_id"] for j in page]
        if not cur:
            break
    assert seen == [j["job_id"] for j in reversed(made)]
    assert all("gsi1pk" not in j for j in page)
    mine, _ = jobs.list_jobs(ddb, tables.jobs, tenant="t1", user="u1", secret=SECRET, limit=100)
    assert [j["job_id"] for j in mine] == [j["job_id"] for j in reversed(made) if j["user"] == "u1"]
    rej, _ = jobs.list_jobs(ddb, tables.jobs, tenant="t1", secret=SECRET, statuses=["REJECTED"])
    assert [j["job_id"] for j in rej] == [made[0]["job_id"]]
    window, _ = jobs.list_jobs(
        ddb,
        tables.jobs,
        tenant="t1",
        secret=SECRET,
        created_after=made[2]["created_at"],
        created_before=made[5]["created_at"],
    )
    assert [j["job_id"] for j in window] == [made[4]["job_id"], made[3]["job_id"], made[2]["job_id"]]


def test_list_cursor_is_tamper_evident_and_scope_bound(ddb, tables, clock):
    for _ in range(3):
        _new(ddb, tables, clock)
    _, cur = jobs.list_jobs(ddb, tables.jobs, tenant="t1", secret=SECRET, limit=1)
    assert cur
    forged = cur[:-2] + ("A" if cur[-2] != "A" else "B") + cur[-1]
    for bad in (forged, "garbage", "", "x" * 80):
        if not bad:
            continue
        with pytest.raises(BadRequest):
            jobs.list_jobs(ddb, tables.jobs, tenant="t1", secret=SECRET, limit=1, cursor=bad)
    with pytest.raises(BadRequest):  # another tenant replaying the cursor
        jobs.list_jobs(ddb, tables.jobs, tenant="t2", secret=SECRET, limit=1, cursor=cur)
    with pytest.raises(BadRequest):  # another secret
        jobs.list_jobs(ddb, tables.jobs, tenant="t1", secret=b"other", limit=1, cursor=cur)


def test_list_no_duplicates_or_gaps_while_jobs_arrive(ddb, tables, clock):
    before = [_new(ddb, tables, clock)["job_id"] for _ in range(10)]
    seen, cur = [], None
    while True:
        page, cur = jobs.list_jobs(ddb, tables.jobs, tenant="t1", secret=SECRET, limit=3, cursor=cur)
        seen += [j["job_id"] for j in page]
        _new(ddb, tables, clock)  # a newer job arrives between pages
        if not cur:
            break
    assert seen == list(reversed(before))


def test_idempotency_claim_replay_mismatch_inflight_and_expiry(ddb, tables, clock):
    c = idem.begin(ddb, tables.control, "t1", "k1", "h1", clock=clock, wait_s=0)
    assert isinstance(c, idem.Claim)
    with pytest.raises(IdempotencyMismatch):
        idem.begin(ddb, tables.control, "t1", "k1", "h2", clock=clock, wait_s=0)
    with pytest.raises(IdempotencyInFlight):
        idem.begin(ddb, tables.control, "t1", "k1", "h1", clock=clock, wait_s=0.1, poll_s=0.02)
    assert isinstance(idem.begin(ddb, tables.control, "t2", "k1", "h9", clock=clock, wait_s=0), idem.Claim)
    job = jobs.create_job(
        ddb,
        tables,
        tenant="t1",
        team="a",
        user="u1",
        spec=SPEC,
        clock=clock,
        extra_items=lambda item: [
            idem.completion_item(tables.control, c, 202, {"Location": "/x"}, "{}", item["job_id"])
        ],
    )
    r = idem.begin(ddb, tables.control, "t1", "k1", "h1", clock=clock, wait_s=0)
    assert isinstance(r, idem.Replay) and r.status == 202 and r.job_id == job["job_id"] and r.body == "{}"
    clock.advance(idem.TTL_SECONDS + 1)
    assert isinstance(idem.begin(ddb, tables.control, "t1", "k1", "other", clock=clock, wait_s=0), idem.Claim)


def test_idempotency_abandon_and_dead_owner_takeover(ddb, tables, clock):
    c = idem.begin(ddb, tables.control, "t1", "k", "h", clock=clock, wait_s=0)
    idem.abandon(ddb, tables.control, c)
    c2 = idem.begin(ddb, tables.control, "t1", "k", "h", clock=clock, wait_s=0)
    clock.advance(idem.IN_FLIGHT_SECONDS + 1)
    c3 = idem.begin(ddb, tables.control, "t1", "k", "h", clock=clock, wait_s=0)
    assert c3.token != c2.token
    # The dead owner's late completion cannot land: its claim is gone, so the transaction fails.
    with pytest.raises(IdempotencyInFlight):
        jobs.create_job(
            ddb,
            tables,
            tenant="t1",
            team="a",
            user="u1",
            spec=SPEC,
            clock=clock,
            extra_items=[idem.completion_item(tables.control, c2, 202, {}, "{}", None)],
        )
    assert jobs.list_jobs(ddb, tables.jobs, tenant="t1", secret=SECRET)[0] == []


def test_principals_resolve_exact_role_and_unknown(ddb, tables):
    principals.put_principal(ddb, tables.control, "arn:aws:iam::123456789012:user/alice", "t1", "a", "alice")
    principals.put_principal(ddb, tables.control, "arn:aws:iam::123456789012:role/ci", "t1", "b", "ci")
    p = principals.resolve(ddb, tables.control, "arn:aws:iam::123456789012:user/alice")
    assert p.owner_path == "t1/a/alice"
    r = principals.resolve(ddb, tables.control, "arn:aws:sts::123456789012:assumed-role/ci/run-42")
    assert (r.tenant, r.team, r.user) == ("t1", "b", "ci")
    for arn in ("arn:aws:iam::123456789012:user/mallory", None, ""):
        with pytest.raises(Unauthorized):
            principals.resolve(ddb, tables.control, arn)


def test_count_active_stops_at_its_cap(ddb, tables, clock):
    for _ in range(5):
        _new(ddb, tables, clock)
    assert jobs.count_active(ddb, tables.jobs, "t1", "a", "u1", cap_user=3, cap_team=2) == (3, 2)
    assert jobs.count_active(ddb, tables.jobs, "t1", "a", "u1", cap_user=10, cap_team=10) == (5, 5)
