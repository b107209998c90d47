"""Contract of :class:`gpufleet.store.nodes.NodeStore`, on the in-memory fake and on moto.

A liveness item is written as given and listed in the nodes directory, the write returning the item it replaced
(the node API's "became usable" test); a registration replaces the
previous one (a re-registration rebinds) and, written with an audit record, lands with it or not at all.
"""

from __future__ import annotations

import pytest

from gpufleet.errors import Conflict, NotAllowed
from gpufleet.nodeapi.liveness import Registration
from gpufleet.store.admin import AuditRecord
from gpufleet.tables import DEREGISTERED_AT, DIR_NODES, DIRECTORY_ATTR, NODE_SK, node_pk


def audit(n: int) -> AuditRecord:
    return AuditRecord(at=f"2026-12-02T00:00:{n:02d}Z", id=f"a{n:02d}", actor="arn:aws:iam::1:user/op",
                       action="node.register", target="n1")


def test_a_liveness_item_reads_back_as_written(backend):
    assert backend.nodes.get("n1") is None
    assert backend.nodes.put({"node_id": "n1", "pool": "p", "gpus": 4, "expires_at": 1_780_000_030.5,
                              "labels": {"a": "b"}}) is None  # the first: nothing replaced
    got = backend.nodes.get("n1")
    assert (got["node_id"], got["pool"], got["gpus"], got["expires_at"]) == ("n1", "p", 4, 1_780_000_030.5)
    assert got["labels"] == {"a": "b"} and got[DIRECTORY_ATTR] == DIR_NODES
    replaced = backend.nodes.put({"node_id": "n1", "pool": "p", "gpus": 2})  # a heartbeat replaces the item
    assert (replaced["gpus"], replaced["expires_at"]) == (4, 1_780_000_030.5)  # and returns the one it replaced
    assert backend.nodes.get("n1")["gpus"] == 2 and "expires_at" not in backend.nodes.get("n1")
    assert backend.nodes.registration("n1") is None  # liveness and registration are separate items


def test_a_registration_reads_back_typed_and_a_re_registration_rebinds(backend):
    reg = Registration(node_id="n1", pool="p", site="eu", labels={"rack": "7"}, gpu_type="h100", gpus=8,
                       gpu_memory_gb=80.0, registered_by="op")
    backend.nodes.register(reg)
    assert backend.nodes.registration("n1") == reg
    backend.nodes.register(reg.model_copy(update={"pool": "q", "gpus": 4}))
    got = backend.nodes.registration("n1")
    assert (got.pool, got.gpus, got.site) == ("q", 4, "eu")
    assert backend.nodes.get("n1") is None and backend.nodes.registration("n2") is None


def test_a_registration_with_its_audit_record_lands_with_it_or_not_at_all(backend):
    backend.nodes.register(Registration(node_id="n1", pool="p"), audit(1))
    assert backend.nodes.registration("n1").pool == "p"
    with pytest.raises(Conflict):  # the audit record exists already: never overwritten, nothing written
        backend.nodes.register(Registration(node_id="n1", pool="q"), audit(1))
    assert backend.nodes.registration("n1").pool == "p"
    backend.nodes.register(Registration(node_id="n1", pool="q"), audit(2))
    assert backend.nodes.registration("n1").pool == "q"


def test_a_heartbeat_cannot_overwrite_a_newer_deregistration_but_a_new_registration_can(backend):
    """The race a deregistration closes: a heartbeat that read the registration just before it was deleted names
    that registration's time, older than the tombstone, and is refused; a node registered again later is not."""
    backend.nodes.put({"node_id": "n1", "pool": "p"}, registered_at="2026-12-01T00:00:00.000Z")
    backend.set_attrs("control", (node_pk("n1"), NODE_SK), {DEREGISTERED_AT: "2026-12-02T00:00:00.000Z"})
    stone = backend.nodes.get("n1")
    for stale in ("2026-12-01T00:00:00.000Z", "2026-12-02T00:00:00.000Z", ""):
        with pytest.raises(NotAllowed):
            backend.nodes.put({"node_id": "n1", "pool": "p", "gpus": 9}, registered_at=stale)
    assert backend.nodes.get("n1") == stone
    backend.nodes.put({"node_id": "n1", "pool": "p", "gpus": 2}, registered_at="2026-12-03T00:00:00.000Z")
    got = backend.nodes.get("n1")
    assert got["gpus"] == 2 and DEREGISTERED_AT not in got  # the new registration's item replaces the tombstone
