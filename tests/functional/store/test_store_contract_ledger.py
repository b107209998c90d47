"""Contract of :class:`gpufleet.store.ledger.LedgerStore`, on the in-memory fake and on moto.

A charge is written once per ``(job, epoch)``, fenced on the job's current epoch, together with the
job's ``billing``; a replay returns False and writes nothing; a fenced-off epoch is StaleEpoch and a
missing job NotFound, leaving no entry. A waiver sets ``billing`` (fenced when epoch > 0) and writes one
waiver entry, kept apart from the charges.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufleet.errors import NotFound, StaleEpoch
from gpufleet.lifecycle.billing import Charge, Outcome, charge_for
from gpufleet.tables import tenant_list_pk

SPEC = {"workload": {"kind": "video.generate", "prompt": "a red kite"}, "labels": {"x": "1"}}
AT = "2026-12-02T09:00:00Z"


def job_at_epoch(backend, epoch: int, job_id: str = "j1") -> dict:
    item = backend.jobs.create(tenant="t1", team="team", user="u", spec=SPEC, job_id=job_id)
    for e in range(epoch):
        backend.jobs.issue_epoch(job_id, e)
    return {"job_id": job_id, "tenant": item["tenant"], "owner_path": item["owner_path"], "labels": {"x": "1"}}


def test_a_charge_is_written_once_with_the_jobs_billing(backend):
    job = job_at_epoch(backend, 1)
    charge = charge_for(Outcome.SUCCEEDED, 90.0, 3.6)
    assert backend.ledger.record(job, 1, charge, pool="p", price=3.6, at=AT) is True
    assert backend.ledger.record(job, 1, charge, pool="other", price=9.9, at="2027-01-01T00:00:00Z") is False
    (row,) = backend.ledger.entries("j1")
    assert (row["job_id"], row["epoch"], row["tenant"], row["owner_path"]) == ("j1", 1, "t1", "t1/team/u")
    assert (row["pool"], row["price_per_gpu_hour"], row["at"], row["charged"]) == ("p", 3.6, AT, True)
    assert Decimal(row["amount_usd"]) == charge.amount_usd and row["outcome"] == "SUCCEEDED"
    assert row["labels"] == {"x": "1"} and row["gsi1pk"] == tenant_list_pk("t1")
    billing = backend.jobs.get("j1")["billing"]
    assert billing["epoch"] == 1 and billing["at"] == AT and billing["charged"] is True
    assert backend.ledger.waivers("j1") == []


def test_each_epoch_is_billed_on_its_own_in_epoch_order(backend):
    job = job_at_epoch(backend, 1)
    backend.ledger.record(job, 1, charge_for(Outcome.USER_ERROR, 10.0, 1.0), pool="p", price=1.0, at=AT)
    backend.jobs.issue_epoch("j1", 1)
    backend.ledger.record(job, 2, charge_for(Outcome.SUCCEEDED, 20.0, 1.0), pool="p", price=1.0, at=AT)
    assert [r["epoch"] for r in backend.ledger.entries("j1")] == [1, 2]
    assert backend.ledger.entries("other") == []


def test_a_fenced_off_epoch_cannot_bill(backend):
    job = job_at_epoch(backend, 2)
    before = backend.jobs.get("j1")
    with pytest.raises(StaleEpoch) as err:
        backend.ledger.record(job, 1, charge_for(Outcome.SUCCEEDED, 5.0, 1.0), pool="p", price=1.0, at=AT)
    assert err.value.extra["current_epoch"] == 2
    assert backend.ledger.entries("j1") == [] and backend.jobs.get("j1") == before  # nothing written
    with pytest.raises(NotFound):
        backend.ledger.record({**job, "job_id": "nope"}, 1, charge_for(Outcome.SUCCEEDED, 5.0, 1.0), pool="p",
                              price=1.0, at=AT)
    assert backend.ledger.entries("nope") == []


def test_epoch_zero_is_billable_on_a_fresh_job_and_a_future_epoch_is_stale(backend):
    job = job_at_epoch(backend, 0)  # created at epoch 0: charging epoch 0 is allowed by the fence
    assert backend.ledger.record(job, 0, charge_for(Outcome.SUCCEEDED, 1.0, 1.0), pool=None, price=1.0, at=AT)
    with pytest.raises(StaleEpoch):
        backend.ledger.record(job, 3, charge_for(Outcome.SUCCEEDED, 1.0, 1.0), pool=None, price=1.0, at=AT)


def test_record_refuses_an_uncharged_attempt(backend):
    job = job_at_epoch(backend, 1)
    with pytest.raises(ValueError):
        backend.ledger.record(job, 1, charge_for(Outcome.PREEMPTED, 5.0, 1.0), pool="p", price=1.0, at=AT)


def test_a_waiver_sets_billing_and_writes_one_waiver_entry(backend):
    job = job_at_epoch(backend, 1)
    waived = charge_for(Outcome.PREEMPTED, 3600.0, 2.0)
    backend.ledger.record_waiver("j1", 1, waived, AT, job=job, pool="p", price=2.0)
    backend.ledger.record_waiver("j1", 1, waived, AT, job=job, pool="p", price=99.0)  # replay: entry kept
    (w,) = backend.ledger.waivers("j1")
    assert (w["charged"], w["amount_usd"], Decimal(w["waived_usd"]), w["epoch"]) == (False, "0", Decimal("2"), 1)
    assert w["waiver"] == waived.waiver and w["pool"] == "p"
    assert backend.ledger.entries("j1") == []  # charges and waivers are read apart
    billing = backend.jobs.get("j1")["billing"]
    assert billing["charged"] is False and billing["waiver"] == waived.waiver and billing["epoch"] == 1


def test_a_waiver_is_fenced_when_its_epoch_is_positive(backend):
    job_at_epoch(backend, 2)
    waived = charge_for(Outcome.PREEMPTED, 1.0, 1.0)
    with pytest.raises(StaleEpoch):
        backend.ledger.record_waiver("j1", 1, waived, AT)
    assert "billing" not in backend.jobs.get("j1")
    with pytest.raises(NotFound):
        backend.ledger.record_waiver("nope", 1, waived, AT)


def test_a_waiver_before_any_attempt_needs_only_the_job(backend):
    job = job_at_epoch(backend, 0)
    never = Charge(False, 0.0, Decimal("0"), "cancelled before it started", Outcome.CANCELLED_BEFORE_START)
    backend.ledger.record_waiver("j1", 0, never, AT)  # no job given: billing only
    assert backend.jobs.get("j1")["billing"]["outcome"] == "CANCELLED_BEFORE_START"
    assert backend.ledger.waivers("j1") == []
    backend.ledger.record_waiver("j1", 0, never, AT, job=job)
    assert [w["epoch"] for w in backend.ledger.waivers("j1")] == [0]
    with pytest.raises(NotFound):
        backend.ledger.record_waiver("nope", 0, never, AT)
