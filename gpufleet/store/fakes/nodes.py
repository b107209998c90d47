"""In-memory :class:`~gpufleet.store.nodes.NodeStore`: liveness items and registrations in the control table.

Items have the DynamoDB store's keys and attributes (directory attribute included) and go through the
marshalling round trip. A registration written with an audit record lands with it or not at all: an audit
record that exists already is never overwritten (:class:`~gpufleet.errors.Conflict`, as the transaction's
``attribute_not_exists`` refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.errors import Conflict
from gpufleet.nodeapi.liveness import Registration
from gpufleet.store.admin import AuditRecord, audit_key
from gpufleet.store.fakes.jobs import stored
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.nodes import deregistered
from gpufleet.tables import (
    DEREGISTERED_AT,
    DIR_NODES,
    DIR_REGISTRATIONS,
    DIRECTORY_ATTR,
    NODE_SK,
    REGISTRATION_SK,
    node_pk,
)


@dataclass
class MemoryNodeStore:
    db: MemoryDatabase
    table: str = "control"

    def put(self, node: dict[str, Any], registered_at: str | None = None) -> dict[str, Any] | None:
        with self.db.lock:  # the read of the old item and the write are one step, as ReturnValues=ALL_OLD
            previous = self.db.get(self.table, (node_pk(node["node_id"]), NODE_SK))
            gone = (previous or {}).get(DEREGISTERED_AT)
            if registered_at is not None and gone is not None and not gone < registered_at:
                raise deregistered(node["node_id"])
            self.db.put(self.table, stored({"pk": node_pk(node["node_id"]), "sk": NODE_SK, **node,
                                            DIRECTORY_ATTR: DIR_NODES}))
        return previous

    def get(self, node_id: str) -> dict[str, Any] | None:
        return self.db.get(self.table, (node_pk(node_id), NODE_SK))

    def register(self, reg: Registration, audit: AuditRecord | None = None) -> None:
        item = stored({"pk": node_pk(reg.node_id), "sk": REGISTRATION_SK, **reg.model_dump(mode="json"),
                       DIRECTORY_ATTR: DIR_REGISTRATIONS})
        with self.db.lock:
            if audit is not None:
                pk, sk = audit_key(audit)
                if self.db.get(self.table, (pk, sk)) is not None:
                    raise Conflict("TransactionCanceledException")
                self.db.put(self.table, stored({"pk": pk, "sk": sk, **audit.as_item()}))
            self.db.put(self.table, item)

    def registration(self, node_id: str) -> Registration | None:
        item = self.db.get(self.table, (node_pk(node_id), REGISTRATION_SK))
        if item is None:
            return None
        return Registration.model_validate({k: v for k, v in item.items() if k in Registration.model_fields})
