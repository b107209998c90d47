"""Contract of :class:`gpufleet.store.deliveries.DeliveryStore`, on the in-memory fake and on moto.

A delivery try is written once (a redelivered message keeps the first record); tries list oldest first.
An event's claim goes to the first message, to that message's redeliveries, and to another message only
once the lease ran out, never after the event was delivered.
"""

from __future__ import annotations

NOW = 1_780_000_000.0


def test_tries_are_written_once_and_listed_oldest_first(backend):
    d = backend.deliveries
    d.record("j1", "2026-12-02T09:00:05Z", "m1", 2, {"status": 500, "endpoint": "e1"})
    d.record("j1", "2026-12-02T09:00:00Z", "m1", 1, {"status": 503, "endpoint": "e1"})
    d.record("j1", "2026-12-02T09:00:00Z", "m1", 1, {"status": 200, "endpoint": "e1"})  # redelivered: kept
    d.record("j2", "2026-12-02T09:00:00Z", "m9", 1, {"status": 200})
    rows = d.list("j1")
    assert [(r["status"], r["endpoint"]) for r in rows] == [(503, "e1"), (500, "e1")]
    assert [r["sk"] for r in rows] == sorted(r["sk"] for r in rows)
    assert [r["status"] for r in d.list("j2")] == [200] and d.list("none") == []


def test_a_claim_holds_an_event_for_its_owner_until_the_lease_runs_out(backend):
    d = backend.deliveries
    assert d.claim("j1", "ev1", "msgA", NOW, 60) is True
    assert d.claim("j1", "ev1", "msgB", NOW + 10, 60) is False  # a duplicate message of the same event
    assert d.claim("j1", "ev1", "msgA", NOW + 20, 60) is True  # the owner's own redelivery; lease renewed
    assert d.claim("j1", "ev1", "msgB", NOW + 70, 60) is False  # still inside the renewed lease
    assert d.claim("j1", "ev2", "msgB", NOW + 10, 60) is True  # another event is its own claim
    assert d.claim("j1", "ev1", "msgB", NOW + 81, 60) is True  # lease ran out: a redriven chain takes over
    assert d.claim("j1", "ev1", "msgA", NOW + 82, 60) is False


def test_no_claim_after_delivery_and_marking_a_missing_claim_writes_nothing(backend):
    d = backend.deliveries
    assert d.claim("j1", "ev1", "msgA", NOW, 60) is True
    d.mark_delivered("j1", "ev1", NOW + 1)
    assert d.claim("j1", "ev1", "msgA", NOW + 2, 60) is False
    assert d.claim("j1", "ev1", "msgB", NOW + 1000, 60) is False
    d.mark_delivered("j1", "ev-unclaimed", NOW)  # no claim item: nothing created
    assert d.claim("j1", "ev-unclaimed", "msgC", NOW + 1, 60) is True
    assert d.list("j1") == []  # claims are not delivery tries
