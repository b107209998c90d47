"""Contract of :class:`gpufleet.store.webhook_endpoints.WebhookEndpointStore`, on the fake and on moto."""

from __future__ import annotations

import threading

import pytest

from gpufleet.errors import Conflict, LimitReached, NotFound
from gpufleet.webhooks.endpoints import WebhookEndpoint


def _ep(n: int, tenant: str = "t1") -> WebhookEndpoint:
    return WebhookEndpoint(id=f"we_{n:026d}", tenant=tenant, url=f"https://h.example.com/{n}", events=("completed",),
                           labels={"team": "v"}, description="d", created_at="2026-01-01T00:00:00Z")


def test_create_read_page_toggle_delete_and_the_cap(backend):
    store = backend.webhook_endpoints
    for n in range(3):
        store.create(_ep(n), cap=3)
    with pytest.raises(LimitReached):
        store.create(_ep(9), cap=3)
    with pytest.raises(Conflict):  # an existing id (the cap not reached)
        store.create(_ep(1), cap=5)
    store.create(_ep(9, "t2"), cap=3)  # the cap is per tenant
    assert store.get("t1", _ep(1).id) == _ep(1)
    with pytest.raises(NotFound):
        store.get("t2", _ep(1).id)  # another tenant's id
    page, after = store.list("t1", 2)
    assert [e.id for e in page] == [_ep(0).id, _ep(1).id] and after == _ep(1).id
    page, after = store.list("t1", 2, after)
    assert [e.id for e in page] == [_ep(2).id] and after is None
    assert store.list("t1", 3) == (store.all("t1"), None)  # exactly a page: no cursor to an empty one
    assert [e.id for e in store.all("t2")] == [_ep(9, "t2").id]
    off = store.set_enabled("t1", _ep(2).id, False, "2026-01-02T00:00:00Z")
    assert (off.enabled, off.updated_at) == (False, "2026-01-02T00:00:00Z") and store.get("t1", off.id) == off
    for op in (lambda: store.set_enabled("t2", _ep(2).id, True, "x"), lambda: store.delete("t2", _ep(2).id)):
        with pytest.raises(NotFound):
            op()
    store.delete("t1", _ep(0).id)
    with pytest.raises(NotFound):
        store.delete("t1", _ep(0).id)
    store.create(_ep(5), cap=3)  # the delete gave its place back
    with pytest.raises(LimitReached):
        store.create(_ep(6), cap=3)


def test_racing_creations_never_pass_the_cap(backend):
    store, won, lost = backend.webhook_endpoints, [], []

    def create(n: int) -> None:
        try:
            store.create(_ep(n), cap=4)
            won.append(n)
        except LimitReached:
            lost.append(n)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 4 and len(lost) == 6 and len(store.all("t1")) == 4
