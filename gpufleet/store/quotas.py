"""Quota nodes of the control table (``QUOTA#<path>`` / ``QUOTA``): configuration and usage counters.

Item: ``guarantee``/``borrow_limit``/``weight``/``limits`` maps (GPU type → milli; ``*`` = all
types), ``path``, and usage counters ``used_<type>`` / ``used_all`` (milli in use). The counters are
changed only by the scheduler's placement transactions and releases (:mod:`gpufleet.store.placements`).

Contract:
- :meth:`QuotaStore.put` creates or replaces a node's configuration and keeps its usage counters.
- :meth:`QuotaStore.read_nodes` returns, for each path asked (``tenant``, ``tenant/team``,
  ``tenant/team/user``), the stored quota node without key attributes, or ``None`` when the path
  has no node (used by ``GET /v1/quota``).
- AWS errors become :mod:`gpufleet.errors` exceptions.

In-memory fake: :class:`gpufleet.store.fakes.quotas.MemoryQuotaStore`; both are held to one contract suite
(``tests/functional/store/test_store_contract_quotas.py``).
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.scheduler.model import ALL_TYPES, QuotaNode
from gpufleet.store.dynamo import marshal, marshal_value, translate_errors, unmarshal
from gpufleet.tables import DIR_QUOTAS, DIRECTORY_ATTR, QUOTA_PREFIX, QUOTA_SK, quota_pk

_USED = "used_"


def usage_attr(gpu_type: str) -> str:
    """The usage counter attribute of ``gpu_type`` (``used_all`` for every type)."""
    return "used_all" if gpu_type == ALL_TYPES else f"{_USED}{gpu_type}"


def usage_from_item(item: dict[str, Any]) -> dict[str, int]:
    """The usage counters of a quota item: GPU type (``ALL_TYPES`` for all) → milli."""
    return {(ALL_TYPES if k == "used_all" else k[len(_USED):]): int(v) for k, v in item.items() if k.startswith(_USED)}


def put_quota(client, table: str, node: QuotaNode) -> None:
    """Create or replace a quota node's configuration, keeping its usage counters."""
    limits = {t: node.limit(t) for t in set(node.guarantee) | set(node.borrow_limit)}
    with translate_errors():
        client.update_item(
            TableName=table,
            Key=marshal({"pk": quota_pk(node.path), "sk": QUOTA_SK}),
            UpdateExpression="SET guarantee = :g, borrow_limit = :b, weight = :w, limits = :l, #p = :p, #d = :d",
            ExpressionAttributeNames={"#p": "path", "#d": DIRECTORY_ATTR},
            ExpressionAttributeValues={
                ":g": marshal_value(dict(node.guarantee)),
                ":b": marshal_value(dict(node.borrow_limit)),
                ":w": marshal_value({k: float(v) for k, v in node.weight.items()}),
                ":l": marshal_value(limits),
                ":p": marshal_value(node.path),
                ":d": marshal_value(DIR_QUOTAS),
            },
        )


def read_quota_nodes(client, table: str, paths: list[str]) -> dict[str, dict[str, Any] | None]:
    """The stored node of each of ``paths`` (key attributes dropped), None where there is none."""
    keys = [marshal({"pk": quota_pk(p), "sk": QUOTA_SK}) for p in paths]
    found: dict[str, dict[str, Any] | None] = {p: None for p in paths}
    request: dict[str, Any] = {table: {"Keys": keys, "ConsistentRead": True}} if keys else {}
    while request:
        with translate_errors():
            resp = client.batch_get_item(RequestItems=request)
        for raw in resp.get("Responses", {}).get(table, []):
            item = unmarshal(raw) or {}
            path = item["pk"][len(QUOTA_PREFIX):]
            found[path] = {k: v for k, v in item.items() if k not in ("pk", "sk")}
        request = resp.get("UnprocessedKeys") or {}
    return found


class QuotaStore(Protocol):
    def put(self, node: QuotaNode) -> None: ...

    def read_nodes(self, paths: list[str]) -> dict[str, dict[str, Any] | None]: ...


class DynamoQuotaStore:
    """:class:`QuotaStore` over the control table."""

    def __init__(self, client, table: str) -> None:
        self.client = client
        self.table = table

    def put(self, node: QuotaNode) -> None:
        put_quota(self.client, self.table, node)

    def read_nodes(self, paths: list[str]) -> dict[str, dict[str, Any] | None]:
        return read_quota_nodes(self.client, self.table, paths)
