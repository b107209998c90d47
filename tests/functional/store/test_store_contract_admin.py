"""Contract of :class:`gpufleet.store.admin.AdminStore`, on the fake and on moto.

A change is versioned (``expected_version`` 0: create; N: only at version N; None: the document must
exist), may require other documents to exist, and is written together with its audit record: a refused
change writes neither. Listings are per kind (callers sort); the audit log is newest first.
"""

from __future__ import annotations

import pytest

from gpufleet.errors import Conflict, NotFound
from gpufleet.nodeapi.liveness import Registration
from gpufleet.store.admin import AuditRecord, Change, Ref
from gpufleet.tables import BOOK_SK, DEREGISTERED_AT, DIRECTORY_ATTR, NODE_SK, alloc_pk, node_pk

TENANT = Ref("tenant", "t1")
TEAM = Ref("team", "a", "t1")


class Audits:
    """Audit records with increasing times and unique ids."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, action: str = "test.change") -> AuditRecord:
        self.n += 1
        return AuditRecord(at=f"2026-12-02T00:00:{self.n:02d}Z", id=f"a{self.n:02d}", actor="arn:aws:iam::1:user/op",
                           action=action, target="t")


@pytest.fixture
def audit() -> Audits:
    return Audits()


def _state(store) -> tuple:
    """What a refused change must leave as it was: the documents and the audit log."""
    return (store.get(TENANT), store.get(TEAM), store.audit_log("2026-12", 100))


def test_versions_create_update_and_delete(backend, audit):
    store = backend.admin
    store.write(Change(TENANT, {"tenant": "t1", "name": "one"}, expected_version=0), audit("tenant.create"))
    assert store.get(TENANT) == {"tenant": "t1", "name": "one", "version": 1}
    store.write(Change(TENANT, {"name": "two"}, expected_version=1), audit())
    store.write(Change(TENANT, {"name": "three"}), audit())  # None: whatever version it is at
    assert store.get(TENANT) == {"tenant": "t1", "name": "three", "version": 3}
    store.write(Change(TENANT, delete=True, expected_version=3), audit())
    assert store.get(TENANT) is None
    assert [a["id"] for a in store.audit_log("2026-12", 10)] == ["a04", "a03", "a02", "a01"]
    assert store.audit_log("2026-12", 2) == [
        {"at": f"2026-12-02T00:00:0{n}Z", "id": f"a0{n}", "actor": "arn:aws:iam::1:user/op", "action": "test.change",
         "target": "t", "detail": {}} for n in (4, 3)]
    assert store.audit_log("2026-11", 10) == []


#: (what, change, error): each refused with nothing written, whatever the backend
REFUSED = [
    ("create an existing document", Change(TENANT, {"name": "x"}, expected_version=0), Conflict),
    ("update at another version", Change(TENANT, {"name": "x"}, expected_version=7), Conflict),
    ("delete at another version", Change(TENANT, delete=True, expected_version=7), Conflict),
    ("update a missing document", Change(Ref("tenant", "t9"), {"name": "x"}), NotFound),
    ("versioned update of a missing one", Change(Ref("tenant", "t9"), {"name": "x"}, expected_version=2), NotFound),
    ("delete a missing document", Change(Ref("tenant", "t9"), delete=True), NotFound),
    ("a required document is missing",
     Change(Ref("team", "b", "t9"), {"team": "b"}, expected_version=0, requires=(Ref("tenant", "t9"),)), NotFound),
    # both the version and a required document fail: the missing document is what is reported
    ("stale and a required document missing",
     Change(TEAM, {"team": "a"}, expected_version=0, requires=(Ref("tenant", "t9"),)), NotFound),
]


def test_a_refused_change_writes_nothing(backend, audit):
    store = backend.admin
    store.write(Change(TENANT, {"tenant": "t1"}, expected_version=0), audit())
    store.write(Change(TEAM, {"team": "a"}, expected_version=0, requires=(TENANT,)), audit())
    before = _state(store)
    for what, change, error in REFUSED:
        with pytest.raises(error):
            store.write(change, audit())
        assert _state(store) == before, what


def test_a_conflict_says_the_current_version(backend, audit):
    store = backend.admin
    store.write(Change(TENANT, {"tenant": "t1"}, expected_version=0), audit())
    store.write(Change(TENANT, {"name": "n"}, expected_version=1), audit())
    with pytest.raises(Conflict) as err:
        store.write(Change(TENANT, {"name": "x"}, expected_version=1), audit())
    assert err.value.extra["current_version"] == 2


def test_an_audit_record_is_never_overwritten(backend, audit):
    store = backend.admin
    store.write(Change(TENANT, {"tenant": "t1", "name": "one"}, expected_version=0), audit())
    before = _state(store)
    again = AuditRecord(at="2026-12-02T00:00:01Z", id="a01", actor="arn:aws:iam::1:user/other", action="x", target="t")
    with pytest.raises(Conflict):
        store.write(Change(TENANT, {"name": "two"}), again)
    assert _state(store) == before


def test_each_kind_is_listed_on_its_own(backend, audit):
    store = backend.admin
    docs = [
        (TENANT, {"tenant": "t1"}), (Ref("tenant", "t2"), {"tenant": "t2"}),
        (TEAM, {"team": "a"}), (Ref("team", "b", "t1"), {"team": "b"}), (Ref("team", "c", "t2"), {"team": "c"}),
        (Ref("principal", "arn:aws:iam::1:user/x"), {"arn": "arn:aws:iam::1:user/x", "tenant": "t1"}),
        (Ref("quota", "t1/a"), {"path": "t1/a"}), (Ref("pool", "p1"), {"name": "p1"}),
        (Ref("registration", "node-1"), {"node_id": "node-1"}),
    ]
    for ref, attrs in docs:
        store.write(Change(ref, attrs, expected_version=0), audit())

    def listed(kind, parent="", field="version"):
        return sorted(d[field] for d in store.list(kind, parent))

    assert listed("tenant", field="tenant") == ["t1", "t2"]
    assert listed("team", "t1", field="team") == ["a", "b"] and listed("team", "t2", field="team") == ["c"]
    assert listed("principal", field="arn") == ["arn:aws:iam::1:user/x"]
    assert listed("quota", field="path") == ["t1/a"]
    assert listed("pool", field="name") == ["p1"]
    assert listed("registration", field="node_id") == ["node-1"]
    assert all("pk" not in d and "sk" not in d and "gsi2pk" not in d for d in store.list("tenant"))


def test_draining_marks_only_a_live_node(backend):
    store = backend.admin
    assert store.mark_draining("node-1", True) is False  # no liveness item: nothing is created
    backend.put_node("node-1")
    assert store.mark_draining("node-1", True) is True
    assert store.mark_draining("node-1", False) is True


def test_a_nodes_allocations_are_its_booked_attempts(backend):
    store = backend.admin
    assert store.node_allocations("node-1") == []
    backend.set_attrs("control", (alloc_pk("node-1"), BOOK_SK), {"g0": 1000})  # the node's bookings: not an attempt
    assert store.node_allocations("node-1") == []
    backend.set_attrs("control", (alloc_pk("node-1"), "job-b#2"), {"node": "node-1"})
    backend.set_attrs("control", (alloc_pk("node-1"), "job-a#1"), {"node": "node-1"})
    backend.set_attrs("control", (alloc_pk("node-2"), "job-c#1"), {"node": "node-2"})
    assert store.node_allocations("node-1") == ["job-a#1", "job-b#2"]


def test_deregistering_deletes_the_registration_and_tombstones_the_liveness_item(backend, audit):
    store, ref = backend.admin, Ref("registration", "node-1")
    backend.nodes.register(Registration(node_id="node-1", pool="p", registered_at="2026-12-01T00:00:00.000Z"))
    backend.put_node("node-1")
    store.write(Change(ref, {"drained": True}), audit("node.drain"))  # version 1
    before = _state(store)
    with pytest.raises(Conflict):  # another version: nothing deleted, no tombstone, no record
        store.deregister("node-1", audit("node.deregister"), expected_version=7, purge_at=1_900_000_000)
    assert _state(store) == before and backend.nodes.registration("node-1") is not None
    assert DEREGISTERED_AT not in backend.nodes.get("node-1")
    record = audit("node.deregister")
    store.deregister("node-1", record, expected_version=1, purge_at=1_900_000_000)
    assert store.get(ref) is None and backend.nodes.registration("node-1") is None
    assert store.list("registration") == []
    stone = backend.get_item("control", (node_pk("node-1"), NODE_SK))
    assert stone[DEREGISTERED_AT] == record.at and stone["draining"] is True and stone["expires_at"] == 1_900_000_000
    assert DIRECTORY_ATTR not in stone  # off the nodes directory: the scheduler's snapshot no longer reads it
    assert [r["action"] for r in store.audit_log("2026-12", 10)][0] == "node.deregister"
    with pytest.raises(NotFound):  # deregistered already
        store.deregister("node-1", audit("node.deregister"), expected_version=2, purge_at=1_900_000_000)
