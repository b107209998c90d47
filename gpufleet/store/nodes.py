"""Node items of the control table: the operator's registration and the node's liveness item.

- ``NODE#<id>`` / ``REGISTRATION``: what an operator bound the node to (pool, site, labels, inventory;
  :class:`gpufleet.nodeapi.liveness.Registration`), written only by the admin-only registration
  (``POST /v1/nodes``), with its audit record; the administration API changes its pool and ``drained``.
- ``NODE#<id>`` / ``NODE``: capacity and heartbeat expiry, read by the scheduler's snapshot
  (:mod:`gpufleet.store.snapshot`). The node API writes it from the registration with the node's
  report clamped into it (:func:`gpufleet.nodeapi.liveness.node_item`); nodes have no DynamoDB access.
  A deregistration (:meth:`gpufleet.store.admin.AdminStore.deregister`) leaves a tombstone here
  (:data:`~gpufleet.tables.DEREGISTERED_AT`); a write that names the registration it comes from
  (``registered_at``) is refused (:class:`~gpufleet.errors.NotRegistered`) over a tombstone newer than it, so a
  heartbeat racing the deregistration cannot bring the node back, while a node registered again after it can.
:meth:`NodeStore.put` writes a liveness item as is (tests, benchmarks, the local stack). AWS errors
become :mod:`gpufleet.errors` exceptions.

In-memory fake: :class:`gpufleet.store.fakes.nodes.MemoryNodeStore`; both are held to one contract suite
(``tests/functional/store/test_store_contract_nodes.py``).
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.errors import NotRegistered
from gpufleet.nodeapi.liveness import Registration
from gpufleet.store.admin import AuditRecord, audit_key
from gpufleet.store.dynamo import marshal, translate_errors, unmarshal
from gpufleet.tables import (
    DEREGISTERED_AT,
    DIR_NODES,
    DIR_REGISTRATIONS,
    DIRECTORY_ATTR,
    NODE_SK,
    REGISTRATION_SK,
    node_pk,
)


def deregistered(node_id: str) -> NotRegistered:
    return NotRegistered(f"node {node_id!r} was deregistered by an operator")


def put_node(client, table: str, node: dict[str, Any], registered_at: str | None = None) -> dict[str, Any] | None:
    """Write a node item (``node["node_id"]`` names it) as the node API does, listed in the control table's
    directory (``gsi2pk``) so the scheduler's snapshot and the pools view find it; returns the item it replaced
    (None: the first), read by the same write (``ReturnValues=ALL_OLD``). With ``registered_at``, not over a
    deregistration's tombstone newer than that registration (see module)."""
    guard: dict[str, Any] = {}
    if registered_at is not None:
        guard = {"ConditionExpression": "attribute_not_exists(#gone) OR #gone < :reg",
                 "ExpressionAttributeNames": {"#gone": DEREGISTERED_AT},
                 "ExpressionAttributeValues": {":reg": {"S": registered_at}}}
    with translate_errors(NotRegistered, str(deregistered(node["node_id"]))):  # the guard is the only condition
        resp = client.put_item(TableName=table, Item=marshal(
            {"pk": node_pk(node["node_id"]), "sk": NODE_SK, **node, DIRECTORY_ATTR: DIR_NODES}),
            ReturnValues="ALL_OLD", **guard)
    return unmarshal(resp.get("Attributes"))


class NodeStore(Protocol):
    def put(self, node: dict[str, Any], registered_at: str | None = None) -> dict[str, Any] | None:
        """Write the node item; the one it replaced (None: the first). With ``registered_at``, refused over a
        newer deregistration's tombstone (see module)."""
        ...

    def get(self, node_id: str) -> dict[str, Any] | None: ...

    def register(self, reg: Registration, audit: AuditRecord | None = None) -> None: ...

    def registration(self, node_id: str) -> Registration | None: ...


class DynamoNodeStore:
    """:class:`NodeStore` over the control table."""

    def __init__(self, client, table: str) -> None:
        self.client = client
        self.table = table

    def _get(self, node_id: str, sk: str) -> dict[str, Any] | None:
        with translate_errors():
            resp = self.client.get_item(TableName=self.table, Key=marshal({"pk": node_pk(node_id), "sk": sk}),
                                        ConsistentRead=True)
        return unmarshal(resp.get("Item"))

    def put(self, node: dict[str, Any], registered_at: str | None = None) -> dict[str, Any] | None:
        return put_node(self.client, self.table, node, registered_at)

    def get(self, node_id: str) -> dict[str, Any] | None:
        return self._get(node_id, NODE_SK)

    def register(self, reg: Registration, audit: AuditRecord | None = None) -> None:
        """Write the registration (replacing one: a re-registration rebinds); with ``audit``, in one transaction
        with that audit record (:mod:`gpufleet.store.admin`)."""
        item = marshal({"pk": node_pk(reg.node_id), "sk": REGISTRATION_SK, **reg.model_dump(mode="json"),
                        DIRECTORY_ATTR: DIR_REGISTRATIONS})  # listed by the administration API
        with translate_errors():
            if audit is None:
                self.client.put_item(TableName=self.table, Item=item)
                return
            pk, sk = audit_key(audit)
            self.client.transact_write_items(TransactItems=[
                {"Put": {"TableName": self.table, "Item": item}},
                {"Put": {"TableName": self.table, "Item": marshal({"pk": pk, "sk": sk, **audit.as_item()}),
                         "ConditionExpression": "attribute_not_exists(pk)"}},
            ])

    def registration(self, node_id: str) -> Registration | None:
        item = self._get(node_id, REGISTRATION_SK)
        if item is None:
            return None
        # administration changes add their bookkeeping (version, updated_at/by) to the item
        return Registration.model_validate({k: v for k, v in item.items() if k in Registration.model_fields})
