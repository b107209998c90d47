"""DynamoDB table definitions as data: the single source of truth.

Contract:
- :data:`TABLES` describes every table: key schema, global secondary indexes,
  stream and TTL attribute. The CDK data stack reads it to declare the tables;
  tests and the local dev stack call :func:`create_tables` to create the same
  tables in moto. Nothing else declares keys or indexes.
- Key *values* (``JOB#<id>`` and so on) are built by :mod:`gpufleet.tables`;
  this module only names attributes.
- All key attributes are strings. Tables are on-demand (PAY_PER_REQUEST). A GSI
  projects ALL attributes unless its ``projection`` says KEYS_ONLY (gsi4 is only
  ever counted, so it carries keys alone).

Indexes (see docs/data-model.md for the access pattern each one serves):

``jobs``
  gsi1  TENANT#<tenant> / <created_at>#<job_id>            a tenant's jobs, newest first
  gsi2  USER#<tenant>#<user> / <created_at>#<job_id>       a user's jobs, newest first
  gsi3  PENDING#<shard> / <prio_inv>#<created_at>#<job_id> pending jobs for the scheduler (sparse, 16 shards)
  gsi4  ACTIVE#<tenant>#<team> / <user>#<created_at>#<id>  queued jobs per team and user (sparse,
                                                           soft quota at submission)
``control``
  gsi1  OWNER#<path> (hash only)                           a user's / team's allocations
  gsi2  DIR#<kind> (hash only, sparse)                     nodes, usage counters, allocations, quota
                                                           nodes: the scheduler's snapshot without a Scan
``ledger``
  gsi1  TENANT#<tenant> / <ts>#<job_id>                    a tenant's charges over time
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.tables import TableNames


@dataclass(frozen=True)
class Index:
    """A global secondary index; ``projection`` is ``ALL`` or ``KEYS_ONLY``."""

    name: str
    hash_key: str
    range_key: str | None = None
    projection: str = "ALL"


@dataclass(frozen=True)
class TableDef:
    """One table: logical name (the field of :class:`TableNames`), keys, indexes, stream, TTL."""

    logical: str
    hash_key: str = "pk"
    range_key: str | None = "sk"
    indexes: tuple[Index, ...] = ()
    stream: str | None = None  # StreamViewType, e.g. NEW_AND_OLD_IMAGES
    ttl_attribute: str | None = None
    description: str = ""

    def key_attributes(self) -> list[str]:
        """Every attribute that appears in a key of the table or an index (deduplicated, ordered)."""
        names: list[str] = []
        for n in (self.hash_key, self.range_key, *[a for i in self.indexes for a in (i.hash_key, i.range_key)]):
            if n and n not in names:
                names.append(n)
        return names


JOBS = TableDef(
    logical="jobs",
    indexes=(
        Index("gsi1", "gsi1pk", "gsi1sk"),
        Index("gsi2", "gsi2pk", "gsi2sk"),
        Index("gsi3", "gsi3pk", "gsi3sk"),
        Index("gsi4", "gsi4pk", "gsi4sk", projection="KEYS_ONLY"),
    ),
    stream="NEW_AND_OLD_IMAGES",
    description="jobs, attempts, events, webhook deliveries; its stream is the transactional outbox",
)

CONTROL = TableDef(
    logical="control",
    indexes=(Index("gsi1", "gsi1pk"), Index("gsi2", "gsi2pk")),
    ttl_attribute="expires_at",
    description="idempotency records, principals, quota tree, nodes, allocations, tenants",
)

LEDGER = TableDef(
    logical="ledger",
    indexes=(Index("gsi1", "gsi1pk", "gsi1sk"),),
    description="billing ledger: one charge per (job, attempt), written once",
)

#: logical name → definition
TABLES: dict[str, TableDef] = {t.logical: t for t in (JOBS, CONTROL, LEDGER)}


def _key_schema(hash_key: str, range_key: str | None) -> list[dict[str, str]]:
    ks = [{"AttributeName": hash_key, "KeyType": "HASH"}]
    if range_key:
        ks.append({"AttributeName": range_key, "KeyType": "RANGE"})
    return ks


def create_table_request(t: TableDef, physical_name: str) -> dict[str, Any]:
    """The ``CreateTable`` request for ``t`` under ``physical_name`` (pure)."""
    req: dict[str, Any] = {
        "TableName": physical_name,
        "KeySchema": _key_schema(t.hash_key, t.range_key),
        "AttributeDefinitions": [{"AttributeName": a, "AttributeType": "S"} for a in t.key_attributes()],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if t.indexes:
        req["GlobalSecondaryIndexes"] = [
            {
                "IndexName": i.name,
                "KeySchema": _key_schema(i.hash_key, i.range_key),
                "Projection": {"ProjectionType": i.projection},
            }
            for i in t.indexes
        ]
    if t.stream:
        req["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": t.stream}
    return req


@dataclass
class CreatedTables:
    names: TableNames
    stream_arns: dict[str, str] = field(default_factory=dict)


def create_tables(client, names: TableNames | None = None) -> CreatedTables:
    """Create every table of :data:`TABLES` (with TTL where declared) and wait until active.

    ``client`` is a boto3 ``dynamodb`` client (moto in tests). Tables that
    already exist are left as they are. Returns the names and stream ARNs.
    """
    names = names or TableNames()
    out = CreatedTables(names=names)
    existing = set(client.list_tables().get("TableNames", []))
    for t in TABLES.values():
        physical = getattr(names, t.logical)
        if physical not in existing:
            client.create_table(**create_table_request(t, physical))
            client.get_waiter("table_exists").wait(TableName=physical, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
            if t.ttl_attribute:
                client.update_time_to_live(
                    TableName=physical,
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": t.ttl_attribute},
                )
        desc = client.describe_table(TableName=physical)["Table"]
        if desc.get("LatestStreamArn"):
            out.stream_arns[t.logical] = desc["LatestStreamArn"]
    return out
