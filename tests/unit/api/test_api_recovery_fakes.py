"""Recovery, retry, arrays, bulk cancel and cost grouping on the in-memory fakes (no AWS)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.api import arrays, costs, recovery, service
from gpufleet.api.models import JobArrayRequest
from gpufleet.api.settings import load
from gpufleet.clock import FakeClock
from gpufleet.errors import InvalidTransition, NotFound, QuotaExceeded, Unauthorized, ValidationFailed
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus as S
from gpufleet.store.fakes.idempotency import MemoryIdempotencyStore
from gpufleet.store.fakes.jobs import MemoryJobStore
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.principals import Principal

ALICE = Principal(arn="arn:aws:iam::1:user/alice", tenant="t1", team="vision", user="alice")
EVE = Principal(arn="arn:aws:iam::2:user/eve", tenant="t2", team="red", user="eve")
OPS = Principal(arn="arn:aws:iam::1:role/ops", tenant="ops", team="platform", user="oncall", admin=True)
VIDEO = {"workload": {"kind": "video.generate", "prompt": "a kite {index}"}}


@pytest.fixture
def deps() -> service.Deps:
    clock = FakeClock(1_780_000_000.0)
    db = MemoryDatabase()
    settings = load(cursor_secret="unit-cursor-secret-0123456789", queued_jobs_per_user=30, queued_jobs_per_team=50)
    return service.Deps(settings=settings, ddb=None, clock=clock, jobs=MemoryJobStore(db, clock),
                        idempotency=MemoryIdempotencyStore(db, clock))


def _quarantined(deps) -> str:
    job_id = service.submit(deps, ALICE, JobSpec.model_validate(VIDEO), "q").job_id
    for to in (S.PENDING, S.SCHEDULED):
        deps.jobs.transition(job_id, [deps.jobs.get(job_id)["status"]], to)
    deps.jobs.transition(job_id, [S.SCHEDULED], S.QUARANTINED, {"system_failures": 3, "crashed_workers": {"a", "b"}})
    return job_id


def test_only_operators_recover_and_a_repeat_is_refused(deps):
    job_id = _quarantined(deps)
    for fn in (recovery.release, recovery.close, recovery.refinalize):
        with pytest.raises(Unauthorized):
            fn(deps, ALICE, job_id)
    view = recovery.release(deps, OPS, job_id, "fixed")
    assert view.status is S.QUEUED and view.system_failures == 0 and view.recovery["reason"] == "fixed"
    with pytest.raises(InvalidTransition):
        recovery.release(deps, OPS, job_id)
    with pytest.raises(InvalidTransition):  # a QUEUED job is not re-finalizable
        recovery.refinalize(deps, OPS, job_id)


def test_retry_needs_an_ended_job_of_the_callers_tenant(deps):
    job_id = service.submit(deps, ALICE, JobSpec.model_validate(VIDEO), "r").job_id
    with pytest.raises(InvalidTransition):
        recovery.retry(deps, ALICE, job_id, "k")
    deps.jobs.transition(job_id, [S.QUEUED], S.CANCELLED)
    with pytest.raises(NotFound):
        recovery.retry(deps, EVE, job_id, "k")
    first = recovery.retry(deps, ALICE, job_id, "k")
    assert recovery.retry(deps, ALICE, job_id, "k").job_id == first.job_id
    assert deps.jobs.get(first.job_id)["retry_of"] == job_id


def test_array_is_all_or_nothing_and_replays(deps):
    req = JobArrayRequest(spec=VIDEO, count=5)
    first = arrays.submit_array(deps, ALICE, req, "a")
    again = arrays.submit_array(deps, ALICE, req, "a")
    assert again.replayed and again.body == first.body
    items, _ = deps.jobs.list(tenant="t1", secret=b"x" * 32, limit=100)
    assert sorted(i["spec"]["workload"]["prompt"] for i in items) == [f"a kite {i}" for i in range(5)]
    with pytest.raises(QuotaExceeded):  # 5 queued + 26 > 30: nothing of the array is written
        arrays.submit_array(deps, ALICE, JobArrayRequest(spec=VIDEO, count=26), "b")
    assert len(deps.jobs.list(tenant="t1", secret=b"x" * 32, limit=100)[0]) == 5


def test_array_element_that_does_not_validate_is_named():
    req = JobArrayRequest(spec={"workload": {"kind": "video.generate", "prompt": "p", "steps": "{index}"}}, count=3)
    with pytest.raises(ValidationFailed, match="array element 0"):
        arrays.element_specs(req)


@given(st.recursive(st.text(max_size=8) | st.integers(), lambda c: st.lists(c, max_size=3)
                    | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=10), st.integers(0, 99))
def test_substitute_only_touches_string_values(doc, index):
    out = arrays.substitute(doc, "{i}", index)
    if isinstance(doc, dict):
        assert set(out) == set(doc)
    assert arrays.substitute(doc, "\x00never\x00", index) == doc


def test_bulk_cancel_needs_a_selector_and_matches_all_of_it(deps):
    a = service.submit(deps, ALICE, JobSpec.model_validate({**VIDEO, "labels": {"x": "1", "y": "2"}}), "1").job_id
    b = service.submit(deps, ALICE, JobSpec.model_validate({**VIDEO, "labels": {"x": "1"}}), "2").job_id
    with pytest.raises(Exception, match="selector"):
        arrays.bulk_cancel(deps, ALICE, None, None)
    done = arrays.bulk_cancel(deps, ALICE, None, {"x": "1", "y": "2"})
    assert done.cancelled == [a] and deps.jobs.get(b)["cancel_requested"] is False


def _entry(sk, job, amount="0", waived="0", secs=1.0, pool="p", owner="t1/vision/alice", labels=None, epoch=1):
    return {"sk": sk, "job_id": job, "epoch": epoch, "tenant": "t1", "owner_path": owner, "pool": pool,
            "labels": labels or {}, "amount_usd": amount, "waived_usd": waived, "gpu_seconds": secs}


def test_cost_summary_is_exact_and_keeps_waived_apart():
    rows = [_entry("ATTEMPT#00000001", "j1", "0.333333", pool="a", labels={"team": "x"}),
            _entry("ATTEMPT#00000001", "j2", "0.666667", pool="b", owner="t1/audio/bob"),
            _entry("WAIVER#00000001", "j3", waived="1.000000", pool="a"),
            _entry("WAIVER#00000001", "j1", waived="0.333333", pool="a")]  # j1's attempt was later charged
    groups, total = costs.summarize(rows, "pool")
    assert Decimal(total.charged_usd) == Decimal("1.000000") and total.waived_attempts == 1
    assert [(g.key, g.charged_usd, g.waived_usd) for g in groups] == [("a", "0.333333", "1.000000"),
                                                                      ("b", "0.666667", "0")]
    assert [g.key for g in costs.summarize(rows, "team")[0]] == ["t1/audio", "t1/vision"]
    assert [g.key for g in costs.summarize(rows, "label", "team")[0]] == ["(none)", "x"]


def test_the_client_keeps_its_retry_policy_apart_from_retrying_a_job():
    from gpufleet.sdk import Client

    # ``Client.retry`` is the instance's RetryPolicy: a method of that name would be shadowed by it
    assert "retry" not in vars(Client) and callable(Client.retry_job)


def test_a_pending_job_shows_its_place_in_the_last_pass(deps):
    from gpufleet.scheduler.queueview import QueueView

    class View:
        def get(self):
            return QueueView(at=1_780_000_000.0, pending=3, placed=1, pass_interval_s=60.0,
                             jobs={job_id: (2, 1_780_000_120.0)})

    job_id = service.submit(deps, ALICE, JobSpec.model_validate(VIDEO), "p").job_id
    deps.queue_view = View()
    assert service.get(deps, ALICE, job_id).queue is None  # QUEUED: not in the scheduler's queue yet
    deps.jobs.transition(job_id, [S.QUEUED], S.PENDING)
    q = service.get(deps, ALICE, job_id).queue
    assert (q.position, q.pending, q.estimated_start) == (2, 3, "2026-05-28T20:28:40.000Z")
