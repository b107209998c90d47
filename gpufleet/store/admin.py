"""The administration API's documents in the control table, each change written with its audit record.

Documents (:class:`Ref` kinds → keys of :mod:`gpufleet.tables`): ``tenant`` (``TENANT#<t>`` / ``TENANT``),
``team`` (``TENANT#<t>`` / ``TEAM#<team>``), ``principal`` (``PRINCIPAL#<arn>`` / ``PRINCIPAL``), ``quota``
(``QUOTA#<path>`` / ``QUOTA``), ``safety`` (``SAFETY#<t>`` / ``SAFETY``), ``pool`` (``POOL#<name>`` /
``POOL``), ``registration`` (``NODE#<id>`` / ``REGISTRATION``) and ``safety_report`` (``SAFETYREPORT#<job>`` /
``REPORT``: an operator's label on a job's tier-1 prompt decision) and ``model`` (``MODEL#<name>`` / ``MODEL``: the
model catalog, a model jobs may name and the content hash they run).

Contract:
- :meth:`AdminStore.write` applies one :class:`Change` and puts its :class:`AuditRecord`
  (``AUDIT#<yyyy-mm>`` / ``<ts>#<id>``) in the same transaction: a change is never made without its
  record, and a refused change leaves no record. A change SETs the given attributes (other attributes
  of the item stay: the tenant item's webhook secret, a quota node's usage counters) and increments
  ``version``; a delete removes the item. Its condition: ``expected_version`` 0 = the document must
  not exist yet (no ``version``), ``n`` = its ``version`` must be ``n``, ``None`` = it must exist (any
  version). Each of ``requires`` must exist (a ``ConditionCheck``). Refusals:
  :class:`~gpufleet.errors.NotFound` (a required document, or the document itself when it had to
  exist) and :class:`~gpufleet.errors.Conflict` with ``current_version`` (exists already, or another
  version). AWS errors become :mod:`gpufleet.errors`.
- :meth:`AdminStore.get` reads one document (consistent), :meth:`AdminStore.list` every document of a
  kind (``team``: those of tenant ``parent``, a Query of its partition; every other kind through its
  directory partition, gsi2 :data:`LISTED`, which every change here sets: no Scan),
  :meth:`AdminStore.audit_log` the records of one month, newest first.
- :meth:`AdminStore.mark_draining` sets ``draining`` on a node's liveness item when it has one (so a
  drain is seen by the next scheduler pass, before the node's next heartbeat); False when it has none.
- :meth:`AdminStore.node_allocations` lists the attempts booked on a node (``ALLOC#<node>`` items but its
  ``BOOK``), as ``<job_id>#<epoch>``.
- :meth:`AdminStore.deregister` deletes a node's registration (at ``expected_version``) and turns its liveness
  item into a tombstone (:data:`~gpufleet.tables.DEREGISTERED_AT` set, ``draining``, off the directory, kept
  until ``purge_at`` by the table's TTL) in one transaction with the audit record: the scheduler's next pass no
  longer sees the node, and a heartbeat that read the registration just before cannot bring the liveness item
  back (:func:`gpufleet.store.nodes.put_node` refuses to overwrite a tombstone newer than its registration).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from botocore.exceptions import ClientError

from gpufleet.errors import Conflict, NotFound
from gpufleet.store.dynamo import (
    cancellation_reasons,
    error_code,
    marshal,
    marshal_value,
    paginate,
    reraise,
    translate_errors,
    unmarshal,
)
from gpufleet.tables import (
    BOOK_SK,
    DEREGISTERED_AT,
    DIR_MODELS,
    DIR_POOLS,
    DIR_PRINCIPALS,
    DIR_QUOTAS,
    DIR_REGISTRATIONS,
    DIR_SAFETY_REPORTS,
    DIR_TENANTS,
    DIRECTORY_ATTR,
    DIRECTORY_INDEX,
    MODEL_SK,
    NODE_SK,
    POOL_CONFIG_SK,
    PRINCIPAL_SK,
    QUOTA_SK,
    REGISTRATION_SK,
    SAFETY_REPORT_SK,
    SAFETY_SK,
    TEAM_SK_PREFIX,
    TENANT_SK,
    alloc_pk,
    audit_pk,
    audit_sk,
    directory_of,
    model_pk,
    node_pk,
    pool_config_pk,
    principal_pk,
    quota_pk,
    safety_profile_pk,
    safety_report_pk,
    team_sk,
    tenant_pk,
)

Kind = Literal["tenant", "team", "principal", "quota", "safety", "pool", "registration", "safety_report", "model"]
#: attributes that are the store's, never a document's
KEY_ATTRS = ("pk", "sk", DIRECTORY_ATTR)
#: the directory partition (gsi2) each listed kind is on (teams are listed from their tenant's partition)
LISTED: dict[str, str] = {"tenant": DIR_TENANTS, "principal": DIR_PRINCIPALS, "registration": DIR_REGISTRATIONS,
                          "pool": DIR_POOLS, "quota": DIR_QUOTAS, "safety_report": DIR_SAFETY_REPORTS,
                          "model": DIR_MODELS}


@dataclass(frozen=True)
class Ref:
    """One document: its kind, its id (tenant name, team name, ARN, quota path, pool name, node id, model name) and,
    for a team, its tenant."""

    kind: Kind
    id: str
    parent: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.parent + '/' if self.parent else ''}{self.id}"


@dataclass(frozen=True)
class Change:
    """Set ``attrs`` on ``ref`` (or delete it), under the conditions of the module contract."""

    ref: Ref
    attrs: Mapping[str, Any] = field(default_factory=dict)
    expected_version: int | None = None
    delete: bool = False
    requires: Sequence[Ref] = ()


@dataclass(frozen=True)
class AuditRecord:
    """Who changed what: ``at`` (RFC 3339 UTC), ``id`` (unique), ``actor`` (the caller's ARN), ``action``
    (e.g. ``quota.set``), ``target`` (:meth:`Ref.describe`) and ``detail`` (what was set)."""

    at: str
    id: str
    actor: str
    action: str
    target: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    def as_item(self) -> dict[str, Any]:
        return {"at": self.at, "id": self.id, "actor": self.actor, "action": self.action, "target": self.target,
                "detail": dict(self.detail)}


def key_of(ref: Ref) -> tuple[str, str]:
    """The (pk, sk) of a document."""
    match ref.kind:
        case "tenant":
            return tenant_pk(ref.id), TENANT_SK
        case "team":
            return tenant_pk(ref.parent), team_sk(ref.id)
        case "principal":
            return principal_pk(ref.id), PRINCIPAL_SK
        case "quota":
            return quota_pk(ref.id), QUOTA_SK
        case "safety":
            return safety_profile_pk(ref.id), SAFETY_SK
        case "pool":
            return pool_config_pk(ref.id), POOL_CONFIG_SK
        case "registration":
            return node_pk(ref.id), REGISTRATION_SK
        case "safety_report":
            return safety_report_pk(ref.id), SAFETY_REPORT_SK
        case "model":
            return model_pk(ref.id), MODEL_SK
    raise ValueError(f"unknown document kind {ref.kind}")


def _key(ref: Ref) -> dict[str, Any]:
    pk, sk = key_of(ref)
    return marshal({"pk": pk, "sk": sk})


def audit_key(record: AuditRecord) -> tuple[str, str]:
    return audit_pk(record.at[:7]), audit_sk(record.at, record.id)


def public(item: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored document without its key attributes."""
    return None if item is None else {k: v for k, v in item.items() if k not in KEY_ATTRS}


class AdminStore(Protocol):
    def get(self, ref: Ref) -> dict[str, Any] | None: ...

    def list(self, kind: Kind, parent: str = "") -> list[dict[str, Any]]: ...

    def write(self, change: Change, audit: AuditRecord) -> None: ...

    def audit_log(self, month: str, limit: int) -> list[dict[str, Any]]: ...

    def mark_draining(self, node_id: str, draining: bool) -> bool: ...

    def node_allocations(self, node_id: str) -> list[str]: ...

    def deregister(self, node_id: str, audit: AuditRecord, *, expected_version: int, purge_at: int) -> None: ...


def refusal(change: Change, current: dict[str, Any] | None) -> Exception:
    """The error a refused change answers with, given the document as it is now (pure)."""
    what = change.ref.describe()
    if current is None and change.expected_version != 0:
        return NotFound(f"{what} does not exist")
    version = int((current or {}).get("version", 0))
    if change.expected_version == 0:
        return Conflict(f"{what} exists already", current_version=version)
    return Conflict(f"{what} is at version {version}, not {change.expected_version}", current_version=version)


class DynamoAdminStore:
    """:class:`AdminStore` over the control table."""

    def __init__(self, client, table: str) -> None:
        self.client = client
        self.table = table

    def get(self, ref: Ref) -> dict[str, Any] | None:
        with translate_errors():
            resp = self.client.get_item(TableName=self.table, Key=_key(ref), ConsistentRead=True)
        return public(unmarshal(resp.get("Item")))

    def list(self, kind: Kind, parent: str = "") -> list[dict[str, Any]]:
        with translate_errors():
            if kind == "team":  # on the tenant's partition
                items = list(paginate(
                    self.client.query, TableName=self.table, KeyConditionExpression="pk = :p AND begins_with(sk, :s)",
                    ExpressionAttributeValues={":p": marshal_value(tenant_pk(parent)),
                                               ":s": marshal_value(TEAM_SK_PREFIX)}))
            else:  # the directory index (no Scan)
                items = list(paginate(
                    self.client.query, TableName=self.table, IndexName=DIRECTORY_INDEX,
                    KeyConditionExpression="#d = :d", ExpressionAttributeNames={"#d": DIRECTORY_ATTR},
                    ExpressionAttributeValues={":d": marshal_value(LISTED[kind])}))
        return [public(i) for i in items]

    def _change_item(self, change: Change) -> dict[str, Any]:
        base = {"TableName": self.table, "Key": _key(change.ref)}
        names: dict[str, str] = {"#v": "version"}
        values: dict[str, Any] = {}
        if change.expected_version == 0:
            cond = "attribute_not_exists(#v)"
        elif change.expected_version is None:
            cond = "attribute_exists(pk)"
            names = {}
        else:
            cond = "#v = :expected"
            values[":expected"] = marshal_value(change.expected_version)
        if change.delete:
            return {"Delete": {**base, "ConditionExpression": cond,
                               **({"ExpressionAttributeNames": names} if names else {}),
                               **({"ExpressionAttributeValues": values} if values else {})}}
        names["#v"] = "version"
        sets = ["#v = if_not_exists(#v, :zero) + :one"]
        values.update({":zero": marshal_value(0), ":one": marshal_value(1)})
        listed = LISTED.get(change.ref.kind) or directory_of(*key_of(change.ref))
        if listed:  # on the directory index: the scheduler's quota nodes and pools, the admin listings
            names["#dir"] = DIRECTORY_ATTR
            values[":dir"] = marshal_value(listed)
            sets.append("#dir = :dir")
        for i, (k, v) in enumerate(change.attrs.items()):
            names[f"#a{i}"] = k
            values[f":a{i}"] = marshal_value(v)
            sets.append(f"#a{i} = :a{i}")
        return {"Update": {**base, "UpdateExpression": "SET " + ", ".join(sets), "ConditionExpression": cond,
                           "ExpressionAttributeNames": names, "ExpressionAttributeValues": values}}

    def write(self, change: Change, audit: AuditRecord) -> None:
        items = [self._change_item(change)]
        items += [{"ConditionCheck": {"TableName": self.table, "Key": _key(r),
                                      "ConditionExpression": "attribute_exists(pk)"}} for r in change.requires]
        self._transact(change, items, audit)

    def _transact(self, change: Change, items: list[dict[str, Any]], audit: AuditRecord) -> None:
        """``items`` (the change's first, then its ``requires`` checks, then anything else) and the audit record,
        in one transaction; a refusal is the change's (:func:`refusal`) or a missing required document."""
        pk, sk = audit_key(audit)
        items = [*items, {"Put": {"TableName": self.table, "Item": marshal({"pk": pk, "sk": sk, **audit.as_item()}),
                                  "ConditionExpression": "attribute_not_exists(pk)"}}]
        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as err:
            if error_code(err) != "TransactionCanceledException":
                reraise(err)
            reasons = cancellation_reasons(err)
            for ref, reason in zip(change.requires, reasons[1:], strict=False):
                if reason == "ConditionalCheckFailed":
                    raise NotFound(f"{ref.describe()} does not exist") from err
            raise refusal(change, self.get(change.ref)) from err

    def audit_log(self, month: str, limit: int) -> list[dict[str, Any]]:
        with translate_errors():
            items = list(paginate(self.client.query, limit=limit, TableName=self.table,
                                  KeyConditionExpression="pk = :p", ScanIndexForward=False,
                                  ExpressionAttributeValues={":p": marshal_value(audit_pk(month))}))
        return [public(i) for i in items]

    def mark_draining(self, node_id: str, draining: bool) -> bool:
        try:
            self.client.update_item(TableName=self.table, Key=marshal({"pk": node_pk(node_id), "sk": NODE_SK}),
                                    UpdateExpression="SET draining = :d", ConditionExpression="attribute_exists(pk)",
                                    ExpressionAttributeValues={":d": {"BOOL": draining}})
        except ClientError as err:
            if error_code(err) == "ConditionalCheckFailedException":
                return False
            reraise(err)
        return True

    def node_allocations(self, node_id: str) -> list[str]:
        with translate_errors():
            items = paginate(self.client.query, TableName=self.table, KeyConditionExpression="pk = :p",
                             ProjectionExpression="sk", ExpressionAttributeValues={":p": marshal_value(alloc_pk(node_id))})
            return sorted(str(it["sk"]) for it in items if it.get("sk") != BOOK_SK)

    def deregister(self, node_id: str, audit: AuditRecord, *, expected_version: int, purge_at: int) -> None:
        change = Change(Ref("registration", node_id), delete=True, expected_version=expected_version)
        tombstone = {"Update": {
            "TableName": self.table, "Key": marshal({"pk": node_pk(node_id), "sk": NODE_SK}),
            "UpdateExpression": "SET #gone = :at, #drain = :t, #exp = :purge REMOVE #dir",
            "ExpressionAttributeNames": {"#gone": DEREGISTERED_AT, "#drain": "draining", "#exp": "expires_at",
                                         "#dir": DIRECTORY_ATTR},
            "ExpressionAttributeValues": {":at": marshal_value(audit.at), ":t": {"BOOL": True},
                                          ":purge": marshal_value(purge_at)}}}
        self._transact(change, [self._change_item(change), tombstone], audit)
