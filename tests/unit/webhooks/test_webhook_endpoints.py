"""Tenants' webhook endpoints on the in-memory fakes: the event filter (hypothesis), the per-tenant cap, paging,
tenant isolation in the service, and the fan-out of one job event to the matching endpoints."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.api import webhook_endpoints as service
from gpufleet.api.models import WebhookEndpointRequest
from gpufleet.api.service import Deps
from gpufleet.api.settings import load
from gpufleet.clock import FakeClock
from gpufleet.errors import LimitReached, NotFound, ValidationFailed
from gpufleet.jobrecord import JobRecord
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.webhook_endpoints import MemoryWebhookEndpoints
from gpufleet.store.principals import Principal
from gpufleet.webhooks import delivery
from gpufleet.webhooks.endpoints import (
    MAX_ENDPOINTS,
    WebhookEndpoint,
    endpoint_message_id,
    matches,
    new_endpoint_id,
    targets,
)
from gpufleet.webhooks.events import KINDS

ALICE = Principal(arn="arn:aws:iam::1:user/alice", tenant="t1", team="vision", user="alice")
EVE = Principal(arn="arn:aws:iam::2:user/eve", tenant="t2", team="red", user="eve")

labels = st.dictionaries(st.sampled_from(["team", "env", "app"]), st.sampled_from(["a", "b"]), max_size=3)


@st.composite
def endpoints(draw) -> WebhookEndpoint:
    return WebhookEndpoint(id=f"we_{draw(st.integers(0, 10**6)):026d}", tenant=draw(st.sampled_from(["t1", "t2"])),
                           url="https://hooks.example.com/", events=tuple(draw(st.sets(st.sampled_from(KINDS)))),
                           labels=draw(labels), enabled=draw(st.booleans()))


@settings(max_examples=60, deadline=None)
@given(st.lists(endpoints(), max_size=8), st.sampled_from(KINDS), labels)
def test_an_event_goes_to_exactly_the_enabled_matching_endpoints_of_its_tenant(eps, kind, job_labels):
    got = targets(eps, "t1", kind, job_labels)
    for ep in eps:
        filtered = ep.enabled and kind in ep.events and set(ep.labels.items()) <= set(job_labels.items())
        assert matches(ep, kind, job_labels) == filtered
        assert (ep in got) == (filtered and ep.tenant == "t1")
    assert [e.id for e in got] == sorted(e.id for e in got)


@settings(max_examples=30, deadline=None)
@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_each_endpoint_gets_its_own_stable_message_id(event_id, endpoint_id):
    one = endpoint_message_id(event_id, endpoint_id)
    assert one == endpoint_message_id(event_id, endpoint_id) and one.startswith("msg_")
    assert one != endpoint_message_id(event_id, endpoint_id + "x")


@pytest.fixture
def deps() -> Deps:
    db = MemoryDatabase()
    return Deps(settings=load(cursor_secret="unit-cursor-secret-0123456789"), ddb=None,
                clock=FakeClock(1_780_000_000.0), webhook_endpoints=MemoryWebhookEndpoints(db))


def _req(**kw) -> WebhookEndpointRequest:
    return WebhookEndpointRequest.model_validate({"url": "https://hooks.example.com/x", **kw})


def test_the_service_scopes_every_operation_to_the_callers_tenant(deps):
    ep = service.create(deps, ALICE, _req(events=["started", "started", "completed"]))
    assert ep.events == ["started", "completed"]
    assert service.get(deps, ALICE, ep.id) == ep
    for op in (lambda: service.get(deps, EVE, ep.id), lambda: service.delete(deps, EVE, ep.id),
               lambda: service.set_enabled(deps, EVE, ep.id, False)):
        with pytest.raises(NotFound):
            op()
    assert service.list_endpoints(deps, EVE, limit=10, cursor_token=None).endpoints == []
    assert service.set_enabled(deps, ALICE, ep.id, False).enabled is False
    service.delete(deps, ALICE, ep.id)
    with pytest.raises(NotFound):
        service.get(deps, ALICE, ep.id)


@pytest.mark.parametrize("url", ["http://hooks.example.com/x", "https://192.168.1.10/x", "https://[::1]/x",
                                 "https://metadata.localhost/x"])
def test_the_url_policy_of_job_webhooks_applies(deps, url):
    with pytest.raises(ValidationFailed) as err:
        service.create(deps, ALICE, _req(url=url))
    assert err.value.extra["errors"][0]["field"] == "url"


def test_the_cap_is_per_tenant_and_a_delete_frees_a_place(deps):
    made = [service.create(deps, ALICE, _req()) for _ in range(MAX_ENDPOINTS)]
    with pytest.raises(LimitReached) as err:
        service.create(deps, ALICE, _req())
    assert err.value.status == 409 and err.value.extra["limit"] == MAX_ENDPOINTS
    service.create(deps, EVE, _req())
    service.delete(deps, ALICE, made[0].id)
    service.create(deps, ALICE, _req())


def test_listing_pages_in_creation_order(deps):
    made = []
    for _ in range(5):
        made.append(service.create(deps, ALICE, _req()).id)
        deps.clock.advance(1)
    seen, token = [], None
    while True:
        page = service.list_endpoints(deps, ALICE, limit=2, cursor_token=token)
        seen += [e.id for e in page.endpoints]
        if not (token := page.next_cursor):
            break
    assert seen == made


class _Queue:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send_message(self, QueueUrl: str, MessageBody: str) -> dict:  # noqa: N803 - boto3's names
        self.sent.append(json.loads(MessageBody))
        return {"MessageId": str(len(self.sent))}


def _job(tenant: str, job_labels: dict, webhook: bool) -> JobRecord:
    spec: dict = {"workload": {"kind": "video.generate", "prompt": "a cat"}, "labels": job_labels}
    if webhook:
        spec["webhook"] = {"url": "https://own.example.com/h"}
    return JobRecord.from_item({"job_id": "job_01hzzzzzzzzzzzzzzzzzzzzzzz", "tenant": tenant, "team": "t", "user": "u",
                                "owner_path": f"{tenant}/t/u", "status": "SUCCEEDED", "spec": spec, "priority": 100,
                                "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"})


def test_a_job_event_is_queued_for_its_own_webhook_and_each_matching_endpoint(deps):
    store, now = deps.webhook_endpoints, deps.clock.now()
    wanted = WebhookEndpoint(id=new_endpoint_id(now), tenant="t1", url="https://a.example.com/", events=("completed",))
    store.create(wanted)
    for i, ep in enumerate([
        WebhookEndpoint(id="", tenant="t1", url="https://b.example.com/", events=("started",)),
        WebhookEndpoint(id="", tenant="t1", url="https://c.example.com/", events=("completed",), labels={"env": "x"}),
        WebhookEndpoint(id="", tenant="t2", url="https://d.example.com/", events=("completed",)),
        WebhookEndpoint(id="", tenant="t1", url="https://e.example.com/", events=("completed",), enabled=False),
    ]):
        store.create(WebhookEndpoint(**{**ep.__dict__, "id": new_endpoint_id(now + i + 1)}))
    q = _Queue()
    job = _job("t1", {"env": "prod"}, webhook=True)
    ids = delivery.queue_event(q, "q", job, "completed", clock=deps.clock, endpoints=store)
    assert [m["url"] for m in q.sent] == ["https://own.example.com/h", "https://a.example.com/"]
    assert q.sent[1]["endpoint_id"] == wanted.id and "endpoint_id" not in q.sent[0]
    assert ids == [m["msg_id"] for m in q.sent] and len(set(ids)) == 2
    assert q.sent[0]["body"] == q.sent[1]["body"]
    # queued again (a retried Notify): the same ids, so the sender's claim drops the duplicates
    assert delivery.queue_event(_Queue(), "q", job, "completed", clock=deps.clock, endpoints=store) == ids
    # no own webhook, no endpoint store: nothing queued
    assert delivery.queue_event(_Queue(), "q", _job("t1", {}, webhook=False), "completed", clock=deps.clock) == []
