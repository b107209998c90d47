"""Contract of :class:`gpufleet.store.idempotency.IdempotencyStore`, on the fake and on moto."""

from __future__ import annotations

import threading

import pytest

from gpufleet.errors import IdempotencyInFlight, IdempotencyMismatch
from gpufleet.store import idempotency as idem


def test_claim_is_per_tenant_and_payload_bound(backend):
    s = backend.idempotency
    c = s.begin("t1", "k1", "h1", wait_s=0)
    assert isinstance(c, idem.Claim) and c.tenant == "t1" and c.key == "k1"
    with pytest.raises(IdempotencyMismatch):
        s.begin("t1", "k1", "h2", wait_s=0)
    with pytest.raises(IdempotencyInFlight):
        s.begin("t1", "k1", "h1", wait_s=0.05)
    assert isinstance(s.begin("t2", "k1", "h9", wait_s=0), idem.Claim)
    rec = s.get_record("t1", "k1")
    assert rec["state"] == idem.IN_PROGRESS and rec["payload_hash"] == "h1" and rec["token"] == c.token


def test_completed_key_replays_until_it_expires(backend):
    s = backend.idempotency
    c = s.begin("t1", "k1", "h1", wait_s=0)
    backend.commit([s.completion(c, 202, {"Location": "/v1/jobs/j1"}, '{"id": "j1"}', "j1")])
    r = s.begin("t1", "k1", "h1", wait_s=0)
    assert isinstance(r, idem.Replay)
    assert (r.status, r.headers, r.body, r.job_id) == (202, {"Location": "/v1/jobs/j1"}, '{"id": "j1"}', "j1")
    with pytest.raises(IdempotencyMismatch):
        s.begin("t1", "k1", "other", wait_s=0)
    backend.clock.advance(idem.TTL_SECONDS + 1)
    assert isinstance(s.begin("t1", "k1", "other", wait_s=0), idem.Claim)


def test_abandoned_or_dead_claims_can_be_taken_over_and_lose_their_completion(backend):
    s = backend.idempotency
    c1 = s.begin("t1", "k", "h", wait_s=0)
    s.abandon(c1)
    assert s.get_record("t1", "k") is None
    c2 = s.begin("t1", "k", "h", wait_s=0)
    assert isinstance(c2, idem.Claim) and c2.token != c1.token
    s.abandon(c1)  # no longer ours: a no-op
    assert s.get_record("t1", "k")["token"] == c2.token
    backend.clock.advance(idem.IN_FLIGHT_SECONDS + 1)
    c3 = s.begin("t1", "k", "h", wait_s=0)  # c2's owner died: taken over
    assert isinstance(c3, idem.Claim) and c3.token != c2.token
    with pytest.raises(Exception) as failed:  # the dead owner's completion cannot land
        backend.commit([s.completion(c2, 202, {}, "{}", "late")])
    assert not isinstance(failed.value, AssertionError)
    assert s.get_record("t1", "k")["state"] == idem.IN_PROGRESS
    backend.commit([s.completion(c3, 202, {}, "{}", "j3")])
    assert s.begin("t1", "k", "h", wait_s=0).job_id == "j3"


def test_racing_requests_get_one_claim(backend):
    s = backend.idempotency
    results: list[object] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def request() -> None:
        start.wait()
        try:
            got: object = s.begin("t1", "race", "h", wait_s=0)
        except IdempotencyInFlight as err:
            got = err
        with lock:
            results.append(got)

    threads = [threading.Thread(target=request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    claims = [r for r in results if isinstance(r, idem.Claim)]
    assert len(results) == 8 and len(claims) == 1
    assert all(isinstance(r, IdempotencyInFlight) for r in results if r is not claims[0])
    backend.commit([s.completion(claims[0], 202, {}, "{}", "winner")])
    # (Waiters that poll while the completion lands are not exercised here: moto applies an
    # update's SET clauses one by one, so a concurrent read can see half of one.)
    assert {s.begin("t1", "race", "h", wait_s=0).job_id for _ in range(3)} == {"winner"}
