"""Contract of :class:`gpufleet.store.jobs.JobStore`, on the in-memory fake and on moto.

The last test runs one seeded random sequence of operations on both backends side by side and
requires the same results and the same errors, so the fake cannot drift from the real store.
"""

from __future__ import annotations

import random
import threading

import pytest
from store_backends import memory_backend, moto_backend

from gpufleet.errors import (
    BadRequest,
    Cancelled,
    Conflict,
    IdempotencyInFlight,
    InvalidTransition,
    NotFound,
    StaleEpoch,
)
from gpufleet.jobrecord import JobRecord
from gpufleet.placement import Placement
from gpufleet.safety.profile import FrozenSafety
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus as S
from gpufleet.store import idempotency as idem
from gpufleet.store.guard import Guard
from gpufleet.store.jobs import public
from gpufleet.tables import pending_partition

SPEC = {"workload": {"kind": "video.generate", "prompt": "a red kite"}, "priority": 120, "labels": {"x": "1"}}


def new(backend, job_id: str = "j1", tenant: str = "t1", **kw):
    return backend.jobs.create(tenant=tenant, team="team", user="u", spec=kw.pop("spec", SPEC), job_id=job_id, **kw)


def statuses(backend, job_id: str) -> list[str]:
    return [e["detail"].get("to") or e["detail"].get("status") for e in backend.jobs.events(job_id)]


def test_create_get_and_tenant_scope(backend):
    item = new(backend)
    got = backend.jobs.get("j1")
    assert public(got) == public(item)  # what create returns is what get reads
    assert got["status"] == "QUEUED" and got["current_epoch"] == 0 and got["priority"] == 120
    assert got["gsi4pk"] == "ACTIVE#t1#team" and "gsi3pk" not in got
    assert backend.jobs.get("j1", "t1")["job_id"] == "j1"
    with pytest.raises(NotFound):
        backend.jobs.get("j1", "t2")
    with pytest.raises(NotFound):
        backend.jobs.get("nope")
    with pytest.raises(Conflict):
        new(backend)
    assert [e["type"] for e in backend.jobs.events("j1")] == ["created"]
    with pytest.raises(NotFound):
        backend.jobs.events("j1", "t2")


def test_get_record_is_the_typed_job(backend):
    new(backend)
    backend.jobs.transition("j1", [S.QUEUED], S.PENDING, {"placement_token": "tok"})
    rec = backend.jobs.get_record("j1", "t1")
    assert isinstance(rec, JobRecord)
    assert (rec.job_id, rec.tenant, rec.owner_path, rec.status) == ("j1", "t1", "t1/team/u", S.PENDING)
    assert rec.spec == JobSpec.model_validate(SPEC) and rec.priority == 120 and rec.placement_token == "tok"
    assert rec.spec.resources.gpus == 1 and rec.spec.workload.frames == 9  # JobSpec's defaults, nobody else's
    assert rec.placement is None and rec.current_epoch == 0 and not rec.cancel_requested
    epoch = backend.jobs.issue_epoch("j1", 0, {"placement": {"epoch": 1, "attempt": 1, "pool": "p", "node": "n1"}})
    assert backend.jobs.get_record("j1").placement == Placement(epoch=epoch, attempt=1, pool="p", node="n1")
    with pytest.raises(NotFound):
        backend.jobs.get_record("j1", "t2")


def test_create_completes_the_idempotency_claim_in_the_same_write(backend):
    claim = backend.idempotency.begin("t1", "key", "h", wait_s=0)
    item = new(backend, extra_items=lambda it: [backend.idempotency.completion(claim, 202, {}, it["job_id"], it["job_id"])])
    replay = backend.idempotency.begin("t1", "key", "h", wait_s=0)
    assert isinstance(replay, idem.Replay) and replay.job_id == item["job_id"] == "j1"
    lost = backend.idempotency.begin("t1", "key2", "h", wait_s=0)
    backend.idempotency.abandon(lost)  # the claim is gone: the job must not be written either
    with pytest.raises(IdempotencyInFlight):
        new(backend, job_id="j2", extra_items=[backend.idempotency.completion(lost, 202, {}, "{}", "j2")])
    with pytest.raises(NotFound):
        backend.jobs.get("j2")


def test_transitions_follow_the_table_and_keep_the_indexes(backend):
    new(backend)
    with pytest.raises(InvalidTransition):  # not in the transition table: refused before any write
        backend.jobs.transition("j1", [S.QUEUED], S.SUCCEEDED)
    pending = backend.jobs.transition("j1", [S.QUEUED], S.PENDING, {"placement_token": "tok"}, detail={"why": "x"})
    assert pending["status"] == "PENDING" and pending["gsi3pk"] == pending_partition("j1") and pending["gsi3sk"] == pending["pending_sort"]
    assert pending["placement_token"] == "tok" and pending["gsi4pk"] == "ACTIVE#t1#team"
    with pytest.raises(InvalidTransition) as wrong:
        backend.jobs.transition("j1", [S.QUEUED], S.PENDING)
    assert wrong.value.extra['current_status'] == "PENDING"
    scheduled = backend.jobs.transition("j1", [S.PENDING], S.SCHEDULED, {"current_epoch": 1}, remove=["placement_token"])
    assert "gsi3pk" not in scheduled and "placement_token" not in scheduled and scheduled["gsi4sk"] == scheduled["active_sort"]
    running = backend.jobs.transition("j1", [S.SCHEDULED], S.RUNNING, epoch=1)
    assert "gsi4pk" not in running and running["status"] == "RUNNING"
    events = backend.jobs.events("j1")
    assert [e["type"] for e in events] == ["created", "status", "status", "status"]
    assert events[1]["detail"] == {"to": "PENDING", "from": ["QUEUED"], "why": "x"}
    assert events[3]["detail"] == {"to": "RUNNING", "from": ["SCHEDULED"], "epoch": 1}
    with pytest.raises(NotFound):
        backend.jobs.transition("ghost", [S.QUEUED], S.PENDING)


def test_fencing_rejects_stale_epochs_with_nothing_written(backend):
    new(backend)
    backend.jobs.transition("j1", [S.QUEUED], S.PENDING)
    assert backend.jobs.issue_epoch("j1", 0, {"scheduled_at": "now"}) == 1
    with pytest.raises(Conflict):
        backend.jobs.issue_epoch("j1", 0)
    backend.jobs.transition("j1", [S.PENDING], S.SCHEDULED, epoch=1)
    before = backend.jobs.get("j1")
    with pytest.raises(StaleEpoch) as late:
        backend.jobs.transition("j1", [S.SCHEDULED], S.RUNNING, epoch=0)
    assert late.value.extra['current_epoch'] == 1
    with pytest.raises(StaleEpoch):
        backend.jobs.fenced_update("j1", 2, {"progress": 0.5})
    assert backend.jobs.get("j1") == before and len(backend.jobs.events("j1")) == 3
    assert backend.jobs.fenced_update("j1", 1, {"progress": 0.5, "generated": {"key": "k"}})["progress"] == 0.5
    with pytest.raises(NotFound):
        backend.jobs.fenced_update("ghost", 1, {"progress": 1})
    with pytest.raises(Conflict):
        backend.jobs.issue_epoch("ghost", 0)


def test_guards_and_cancellation(backend):
    new(backend)
    backend.jobs.transition("j1", [S.QUEUED], S.PENDING, {"placement_token": "a"}, guard=Guard(not_cancelled=True))
    again = backend.jobs.fenced_update("j1", 0, {"placement_token": "b"}, guard=Guard(status=S.PENDING, not_cancelled=True))
    assert again["placement_token"] == "b"
    with pytest.raises(Conflict):  # the guard's status does not hold
        backend.jobs.fenced_update("j1", 0, {"placement_token": "c"}, guard=Guard(status=S.RUNNING))
    first = backend.jobs.request_cancel("j1", "t1", requested_by="u")
    assert first["cancel_requested"] is True
    assert backend.jobs.request_cancel("j1", requested_by="u") == first  # idempotent: no second write
    assert [e["type"] for e in backend.jobs.events("j1")].count("cancel_requested") == 1
    with pytest.raises(Conflict):
        backend.jobs.fenced_update("j1", 0, {"placement_token": "d"}, guard=Guard(not_cancelled=True))
    with pytest.raises(InvalidTransition):
        backend.jobs.transition("j1", [S.PENDING], S.QUEUED, guard=Guard(not_cancelled=True))
    with pytest.raises(NotFound):
        backend.jobs.request_cancel("j1", "t2")
    backend.jobs.transition("j1", [S.PENDING], S.CANCELLED)
    new(backend, job_id="j2")
    backend.jobs.transition("j2", [S.QUEUED], S.REJECTED)
    with pytest.raises(InvalidTransition) as done:
        backend.jobs.request_cancel("j2")
    assert done.value.extra['current_status'] == "REJECTED"


def test_safety_is_frozen_once(backend):
    new(backend)
    a = FrozenSafety(source="tenant", profile_version=1, resolved_at="2026-01-01T00:00:00.000Z")
    assert backend.jobs.freeze_safety("j1", a) == a
    b = a.model_copy(update={"profile_version": 2})
    assert backend.jobs.freeze_safety("j1", b) == a
    new(backend, job_id="j2")
    backend.jobs.request_cancel("j2")
    with pytest.raises(Cancelled):
        backend.jobs.freeze_safety("j2", a)
    with pytest.raises(NotFound):
        backend.jobs.freeze_safety("ghost", a)


def test_racing_epoch_issuers_one_wins(backend):
    new(backend)
    wins: list[int] = []
    losses: list[Exception] = []
    start = threading.Barrier(6)

    def issue() -> None:
        start.wait()
        try:
            wins.append(backend.jobs.issue_epoch("j1", 0))
        except Conflict as err:
            losses.append(err)

    threads = [threading.Thread(target=issue) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert wins == [1] and len(losses) == 5 and backend.jobs.get("j1")["current_epoch"] == 1


def _run(backend, seed: int, steps: int = 120) -> list[object]:
    """A seeded random sequence of JobStore calls; each call's outcome (the job's public view, or the
    error's class name) in order."""
    rng = random.Random(seed)
    ids = ["a", "b", "c"]
    all_statuses = list(S)
    out: list[object] = []
    for _ in range(steps):
        job_id = rng.choice(ids)
        op = rng.choice(["create", "move", "move", "fenced", "epoch", "cancel", "get"])
        backend.clock.advance(rng.random())
        try:
            if op == "create":
                got = new(backend, job_id=job_id)
            elif op == "move":
                frm, to = rng.choice(all_statuses), rng.choice(all_statuses)
                epoch = rng.choice([None, 0, 1, 2])
                guard = rng.choice([None, Guard(not_cancelled=True)])
                got = backend.jobs.transition(job_id, [frm], to, {"note": rng.randint(0, 9)}, epoch=epoch, guard=guard)
            elif op == "fenced":
                guard = rng.choice([None, Guard(status=rng.choice(all_statuses)), Guard(not_cancelled=True)])
                got = backend.jobs.fenced_update(job_id, rng.choice([0, 1, 2]), {"progress": rng.random()}, guard=guard)
            elif op == "epoch":
                got = backend.jobs.issue_epoch(job_id, rng.choice([0, 1, 2]))
            elif op == "cancel":
                got = backend.jobs.request_cancel(job_id)
            else:
                got = backend.jobs.get(job_id)
        except Exception as err:  # noqa: BLE001 - the outcome under comparison is the error's kind
            got = type(err).__name__
        out.append(public(got) if isinstance(got, dict) else got)
    out.append({j: [e["type"] for e in backend.jobs.events(j)] for j in ids if _exists(backend, j)})
    return out


def _exists(backend, job_id: str) -> bool:
    try:
        backend.jobs.get(job_id)
    except NotFound:
        return False
    return True


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fake_and_moto_agree_on_a_random_sequence(seed, clock, ddb, tables):
    memory = _run(memory_backend(type(clock)(clock.now())), seed)
    moto = _run(moto_backend(type(clock)(clock.now()), ddb, tables), seed)
    assert len(memory) == len(moto)
    for i, (m, r) in enumerate(zip(memory, moto, strict=True)):
        assert m == r, f"step {i}: fake {m!r} != moto {r!r}"
    assert sum(isinstance(x, dict) for x in memory) > 20 and sum(isinstance(x, str) for x in memory) > 20


SECRET = b"contract-cursor-secret-0123456789"


def test_listing_pages_newest_first_without_gaps_or_duplicates(backend):
    for i in range(7):
        backend.clock.advance(1)
        backend.jobs.create(tenant="t1", team="team", user="u" if i % 2 else "v", spec=SPEC, job_id=f"j{i}")
    backend.jobs.create(tenant="t2", team="team", user="u", spec=SPEC, job_id="other")
    backend.jobs.transition("j3", [S.QUEUED], S.PENDING)
    backend.jobs.transition("j5", [S.QUEUED], S.PENDING)
    seen, cursor = [], None
    while True:
        page, cursor = backend.jobs.list(tenant="t1", secret=SECRET, limit=3, cursor=cursor)
        seen += [j["job_id"] for j in page]
        assert all("pk" not in j and "gsi1pk" not in j for j in page)
        if cursor is None:
            break
    assert seen == [f"j{i}" for i in reversed(range(7))]
    mine, _ = backend.jobs.list(tenant="t1", secret=SECRET, user="u")
    assert [j["job_id"] for j in mine] == ["j5", "j3", "j1"]
    pending, nxt = backend.jobs.list(tenant="t1", secret=SECRET, statuses=["PENDING"], limit=1)
    assert [j["job_id"] for j in pending] == ["j5"]
    rest, _ = backend.jobs.list(tenant="t1", secret=SECRET, statuses=["PENDING"], limit=1, cursor=nxt)
    assert [j["job_id"] for j in rest] == ["j3"]
    j2 = backend.jobs.get("j2")["created_at"]
    j5 = backend.jobs.get("j5")["created_at"]
    window, _ = backend.jobs.list(tenant="t1", secret=SECRET, created_after=j2, created_before=j5)
    assert [j["job_id"] for j in window] == ["j4", "j3", "j2"]  # after: inclusive, before: exclusive
    with pytest.raises(BadRequest):
        backend.jobs.list(tenant="t1", secret=SECRET, cursor="forged")
    with pytest.raises(BadRequest):  # a cursor is bound to the query that made it
        backend.jobs.list(tenant="t1", secret=SECRET, user="u", limit=1, cursor=nxt)


def test_active_counts_follow_the_status_and_stop_at_their_caps(backend):
    for i in range(5):
        backend.jobs.create(tenant="t1", team="team", user="u" if i < 3 else "v", spec=SPEC, job_id=f"j{i}")
    backend.jobs.create(tenant="t1", team="other", user="u", spec=SPEC, job_id="x")
    assert backend.jobs.count_active("t1", "team", "u") == (3, 5)
    assert backend.jobs.count_active("t1", "team", "u", cap_user=2, cap_team=4) == (2, 4)
    backend.jobs.transition("j0", [S.QUEUED], S.PENDING)
    backend.jobs.transition("j0", [S.PENDING], S.SCHEDULED)
    assert backend.jobs.count_active("t1", "team", "u") == (3, 5)  # QUEUED, PENDING, SCHEDULED count
    backend.jobs.transition("j0", [S.SCHEDULED], S.RUNNING)
    backend.jobs.transition("j1", [S.QUEUED], S.REJECTED)
    assert backend.jobs.count_active("t1", "team", "u") == (1, 3)
    assert backend.jobs.deliveries("j0") == []
