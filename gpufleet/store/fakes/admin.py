"""In-memory :class:`gpufleet.store.admin.AdminStore` with the same conditions and refusals."""

from __future__ import annotations

import copy
from typing import Any

from gpufleet.errors import Conflict, NotFound
from gpufleet.store.admin import AuditRecord, Change, Kind, Ref, audit_key, key_of, public, refusal
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.tables import BOOK_SK, DEREGISTERED_AT, DIRECTORY_ATTR, NODE_SK, TEAM_SK_PREFIX, alloc_pk, node_pk


class MemoryAdminStore:
    def __init__(self, db: MemoryDatabase | None = None, table: str = "control") -> None:
        self.db = db or MemoryDatabase()
        self.table = table

    def get(self, ref: Ref) -> dict[str, Any] | None:
        return public(self.db.get(self.table, key_of(ref)))

    def list(self, kind: Kind, parent: str = "") -> list[dict[str, Any]]:
        pk, sk = key_of(Ref(kind, "", parent))
        with self.db.lock:
            items = [copy.deepcopy(i) for (p, s), i in self.db.table(self.table).items()
                     if (p == pk and s.startswith(TEAM_SK_PREFIX) if kind == "team" else p.startswith(pk) and s == sk)]
        return [public(i) for i in items]

    def _ok(self, change: Change, current: dict[str, Any] | None) -> bool:
        if change.expected_version == 0:
            return current is None or "version" not in current
        if current is None:
            return False
        return change.expected_version is None or current.get("version") == change.expected_version

    def write(self, change: Change, audit: AuditRecord) -> None:
        pk, sk = key_of(change.ref)
        with self.db.lock:
            current = self.db.get(self.table, (pk, sk))
            # as DynamoAdminStore's transaction reports it: a missing required document first, then the version
            for ref in change.requires:
                if self.db.get(self.table, key_of(ref)) is None:
                    raise NotFound(f"{ref.describe()} does not exist")
            if not self._ok(change, current):
                raise refusal(change, public(current))
            apk, ask = audit_key(audit)
            if self.db.get(self.table, (apk, ask)) is not None:  # an audit record is never overwritten
                raise Conflict(f"audit record {audit.id} at {audit.at} exists already")
            if change.delete:
                self.db.delete(self.table, (pk, sk))
            else:
                item = {**(current or {"pk": pk, "sk": sk}), **copy.deepcopy(dict(change.attrs))}
                item["version"] = int((current or {}).get("version", 0)) + 1
                self.db.put(self.table, item)
            self.db.put(self.table, {"pk": apk, "sk": ask, **audit.as_item()})

    def audit_log(self, month: str, limit: int) -> list[dict[str, Any]]:
        pk = audit_key(AuditRecord(at=f"{month}-01", id="", actor="", action="", target=""))[0]
        with self.db.lock:
            items = sorted(((s, i) for (p, s), i in self.db.table(self.table).items() if p == pk), reverse=True)
        return [public(copy.deepcopy(i)) for _, i in items[:limit]]

    def mark_draining(self, node_id: str, draining: bool) -> bool:
        with self.db.lock:
            item = self.db.get(self.table, (node_pk(node_id), NODE_SK))
            if item is None:
                return False
            item["draining"] = draining
            self.db.put(self.table, item)
            return True

    def node_allocations(self, node_id: str) -> list[str]:
        pk = alloc_pk(node_id)
        with self.db.lock:
            return sorted(s for (p, s) in self.db.table(self.table) if p == pk and s != BOOK_SK)

    def deregister(self, node_id: str, audit: AuditRecord, *, expected_version: int, purge_at: int) -> None:
        with self.db.lock:  # the registration's delete, the tombstone and the audit record land together
            self.write(Change(Ref("registration", node_id), delete=True, expected_version=expected_version), audit)
            key = (node_pk(node_id), NODE_SK)
            item = {k: v for k, v in (self.db.get(self.table, key) or {"pk": key[0], "sk": key[1]}).items()
                    if k != DIRECTORY_ATTR}
            self.db.put(self.table, {**item, DEREGISTERED_AT: audit.at, "draining": True, "expires_at": purge_at})
