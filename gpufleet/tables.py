"""DynamoDB data model: table names and key builders (pure; no boto3).

Three tables (see docs/data-model.md for the access patterns each key serves):

``jobs`` (stream: NEW_AND_OLD_IMAGES, the transactional outbox)
  job       pk=JOB#<job_id>  sk=META
            gsi1pk=TENANT#<tenant>             gsi1sk=<created_at>#<job_id>  (tenant list, newest first)
            gsi2pk=USER#<tenant>#<user>        gsi2sk=<created_at>#<job_id>  (user list, newest first)
            gsi3pk=PENDING#<shard> (only while PENDING; :func:`pending_partition`)
                                               gsi3sk=<prio_inv>#<created_at>#<job_id> (scheduler)
            gsi4pk=ACTIVE#<tenant>#<team> (only while QUEUED/PENDING/SCHEDULED)
                                               gsi4sk=<user>#<created_at>#<job_id> (soft quota counts)
            (gsi3/gsi4 are maintained by gpufleet.store.jobs.transition / transition_update)
  attempt   pk=JOB#<job_id>  sk=ATTEMPT#<epoch:08d>
  event     pk=JOB#<job_id>  sk=EVENT#<ts>#<seq>
  delivery  pk=JOB#<job_id>  sk=DELIVERY#<ts>#<id>
  delivery claim pk=JOB#<job_id> sk=WHMSG#<msg_id> (which queued message delivers the event: a duplicate
                                               message of the same event finds it claimed and is dropped)
  provenance pk=WM#<payload>  sk=JOB#<job_id>  (a delivered video's manifest, found by its watermark payload;
                                               written once by Publish: gpufleet.store.provenance)
  log chunk pointers live in S3, not here.

``control``
  idempotency  pk=IDEMP#<tenant>#<key>   sk=IDEMP   (expires_at: TTL attribute, 24 h)
  principal    pk=PRINCIPAL#<arn>        sk=PRINCIPAL
  quota node   pk=QUOTA#<path>           sk=QUOTA   (limits + usage counters, conditional updates)
  node         pk=NODE#<node_id>         sk=NODE    (capacity + heartbeat expiry)
  registration pk=NODE#<node_id>         sk=REGISTRATION (pool, site, inventory: bound by an operator)
  allocation   pk=ALLOC#<node_id|pool>   sk=<job_id>#<epoch>  gsi1pk=OWNER#<path> (per user/team allocations)
  tenant       pk=TENANT#<tenant>        sk=TENANT  (defaults: placement policy, webhook secret)
  safety       pk=SAFETY#<tenant>        sk=SAFETY  (the tenant's tier-2 safety profile: its own partition, so a
                                                     role that reads profiles cannot read the tenant item)
  rate bucket  pk=RATE#<tenant>[#lookup] sk=RATE   (API request rate limit, and the provenance lookup's: theoretical arrival time;
                                                     expires_at: TTL attribute)
  directory    gsi2pk=DIR#NODES | DIR#USAGE | DIR#ALLOCATIONS | DIR#QUOTAS (sparse index gsi2, hash only):
               what the scheduler's snapshot and the pools view list instead of scanning the table,
               set by every writer of node liveness items, BOOK/POOL counters, allocation records and
               quota nodes (:func:`directory_of`); principals, tenants, idempotency and rate items are
               never on it
  team         pk=TENANT#<tenant>        sk=TEAM#<team> (a team of the tenant, created by an operator)
  pool         pk=POOL#<name>            sk=POOL    (an operator's pool definition: adds or overrides a deployed pool)
  model        pk=MODEL#<name>           sk=MODEL   (the model catalog: a model jobs may name and the content hash they
                                                     run, registered by an operator; gpufleet.store.model_catalog)
  webhook endpoint pk=WHEP#<tenant>     sk=EP#<endpoint_id> (a tenant's webhook endpoint: url, event filter,
                                                     label selector, enabled; gpufleet.store.webhook_endpoints)
  endpoint count   pk=WHEP#<tenant>     sk=COUNT   (how many endpoints the tenant has: the cap's condition)
  audit        pk=AUDIT#<yyyy-mm>        sk=<ts>#<id> (one record per administration change, written in the
                                                     same transaction as the change)

``ledger``
  charge    pk=JOB#<job_id>  sk=ATTEMPT#<epoch:08d>   (written once: attribute_not_exists)
            gsi1pk=TENANT#<tenant>  gsi1sk=<ts>#<job_id>
  waiver    pk=JOB#<job_id>  sk=WAIVER#<epoch:08d>    (a waived attempt, written once; same gsi1 keys)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

JOB_META = "META"
#: the unsharded PENDING partition of gsi3 (before sharding; still read, so jobs left there are scheduled)
PENDING_PARTITION = "PENDING"
#: how many gsi3 partitions the PENDING queue is spread over, so no one key takes every pending job's
#: writes (DynamoDB's per-partition limit: about 1,000 writes/s). A job's shard is fixed by its id.
PENDING_SHARDS = 16


def pending_partition(job_id: str) -> str:
    """The gsi3 partition of a PENDING job: ``PENDING#<shard>``, the shard a hash of the job id."""
    return f"{PENDING_PARTITION}#{int(hashlib.sha256(job_id.encode()).hexdigest()[:8], 16) % PENDING_SHARDS}"


#: every gsi3 partition a reader of the PENDING queue queries (the unsharded one first)
PENDING_PARTITIONS = (PENDING_PARTITION,) + tuple(f"{PENDING_PARTITION}#{i}" for i in range(PENDING_SHARDS))

# constant sort keys of the control table's singleton items
#: on a node's liveness item: an operator deregistered the node then (RFC 3339); the item is a tombstone
DEREGISTERED_AT = "deregistered_at"
BOOK_SK = "BOOK"  # ALLOC#<node>: GPU bookings of a node (g<i> = milli booked on GPU i)
POOL_SK = "POOL"  # ALLOC#<pool>: used_milli of a cloud pool
QUOTA_SK = "QUOTA"
NODE_SK = "NODE"
REGISTRATION_SK = "REGISTRATION"  # NODE#<node>: what an operator bound the node to (pool, site, inventory)
TENANT_SK = "TENANT"
PRINCIPAL_SK = "PRINCIPAL"
IDEMPOTENCY_SK = "IDEMP"
LEASE_SK = "LEASE"
RATE_SK = "RATE"
SAFETY_SK = "SAFETY"
SAFETY_REPORT_SK = "REPORT"  # SAFETYREPORT#<job_id>: an operator's label on a job's tier-1 decision
POOL_CONFIG_SK = "POOL"
TEAM_SK_PREFIX = "TEAM#"
#: the scheduler pass's lease item (one pass at a time; with sharded passes, one per shard: :func:`scheduler_lease_pk`)
SCHEDULER_LEASE_PK = "LEASE#scheduler"
#: a scheduler commit lane's quota escrow (``ESCROW#<lane>`` / ``ESCROW``: quota reserved by the lane, not yet
#: charged to a placement; gpufleet.store.escrow)
ESCROW_PREFIX = "ESCROW#"
ESCROW_SK = "ESCROW"
#: the last pass's queue view (positions and estimated starts of PENDING jobs): ``QUEUEVIEW#scheduler`` / ``QUEUE``
QUEUE_VIEW_PK = "QUEUEVIEW#scheduler"
QUEUE_VIEW_SK = "QUEUE"

# key prefixes of the control table's item kinds
NODE_PREFIX = "NODE#"
ALLOC_PREFIX = "ALLOC#"
QUOTA_PREFIX = "QUOTA#"
TENANT_PREFIX = "TENANT#"
JOB_PREFIX = "JOB#"
RATE_PREFIX = "RATE#"
SAFETY_PREFIX = "SAFETY#"
SAFETY_REPORT_PREFIX = "SAFETYREPORT#"
DELIVERY_PREFIX = "DELIVERY#"
DELIVERY_CLAIM_PREFIX = "WHMSG#"
WATERMARK_PREFIX = "WM#"
POOL_PREFIX = "POOL#"
MODEL_PREFIX = "MODEL#"
MODEL_SK = "MODEL"
AUDIT_PREFIX = "AUDIT#"
WEBHOOK_ENDPOINT_PREFIX = "WHEP#"
WEBHOOK_ENDPOINT_SK_PREFIX = "EP#"
WEBHOOK_ENDPOINT_COUNT_SK = "COUNT"


# the control table's directory index (gsi2): one partition per kind of item a scheduler pass lists
DIRECTORY_INDEX = "gsi2"
DIRECTORY_ATTR = "gsi2pk"
DIR_NODES = "DIR#NODES"  # NODE#<id>/NODE liveness items
DIR_USAGE = "DIR#USAGE"  # ALLOC#<node>/BOOK GPU bookings and ALLOC#<pool>/POOL cloud pool usage
DIR_ALLOCATIONS = "DIR#ALLOCATIONS"  # ALLOC#<node|pool>/<job_id>#<epoch> allocation records
DIR_QUOTAS = "DIR#QUOTAS"  # QUOTA#<path>/QUOTA quota nodes and usage counters
DIR_POOLS = "DIR#POOLS"  # POOL#<name>/POOL operators' pool definitions (scheduler, pools view)
# what only the administration API lists (its role alone is granted these partitions)
DIR_TENANTS = "DIR#TENANTS"  # TENANT#<t>/TENANT tenants onboarded through the administration API
DIR_PRINCIPALS = "DIR#PRINCIPALS"  # PRINCIPAL#<arn>/PRINCIPAL principals onboarded through it
DIR_REGISTRATIONS = "DIR#REGISTRATIONS"  # NODE#<id>/REGISTRATION operators' node registrations
DIR_SAFETY_REPORTS = "DIR#SAFETYREPORTS"  # SAFETYREPORT#<job_id>/REPORT operators' prompt-filter reports
DIR_MODELS = "DIR#MODELS"  # MODEL#<name>/MODEL the model catalog
DIRECTORY_PREFIX = "DIR#"


@dataclass(frozen=True)
class TableNames:
    jobs: str = "gpufleet-jobs"
    control: str = "gpufleet-control"
    ledger: str = "gpufleet-ledger"


def job_pk(job_id: str) -> str:
    return f"{JOB_PREFIX}{job_id}"


def attempt_sk(epoch: int) -> str:
    return f"ATTEMPT#{epoch:08d}"


#: the sort-key prefix of a job's timeline events
EVENT_PREFIX = "EVENT#"


def event_sk(ts_iso: str, seq: int) -> str:
    return f"{EVENT_PREFIX}{ts_iso}#{seq:06d}"


def tenant_list_pk(tenant: str) -> str:
    return f"TENANT#{tenant}"


def user_list_pk(tenant: str, user: str) -> str:
    return f"USER#{tenant}#{user}"


def list_sk(created_at_iso: str, job_id: str) -> str:
    return f"{created_at_iso}#{job_id}"


def active_pk(tenant: str, team: str) -> str:
    return f"ACTIVE#{tenant}#{team}"


def active_sk(user: str, created_at_iso: str, job_id: str) -> str:
    return f"{user}#{created_at_iso}#{job_id}"


def pending_sk(priority: int, created_at_iso: str, job_id: str) -> str:
    """Higher priority sorts first (inverted), then oldest first."""
    return f"{1000 - priority:04d}#{created_at_iso}#{job_id}"


def idempotency_pk(tenant: str, key: str) -> str:
    return f"IDEMP#{tenant}#{key}"


def principal_pk(arn: str) -> str:
    return f"PRINCIPAL#{arn}"


def quota_pk(path: str) -> str:
    return f"{QUOTA_PREFIX}{path}"


def node_pk(node_id: str) -> str:
    return f"{NODE_PREFIX}{node_id}"


def tenant_pk(tenant: str) -> str:
    """The tenant item (control table, sk :data:`TENANT_SK`): placement policy, webhook secret."""
    return f"{TENANT_PREFIX}{tenant}"


def safety_profile_pk(tenant: str) -> str:
    """The tenant's safety profile (control table, sk :data:`SAFETY_SK`); not on ``TENANT#<tenant>``, whose
    tenant item holds the webhook signing secret (IAM conditions on the partition key only)."""
    return f"{SAFETY_PREFIX}{tenant}"


def safety_report_pk(job_id: str) -> str:
    """An operator's report on a job's tier-1 prompt decision (control table, sk :data:`SAFETY_REPORT_SK`)."""
    return f"{SAFETY_REPORT_PREFIX}{job_id}"


def team_sk(team: str) -> str:
    """A team item's sort key on its tenant's partition (``TENANT#<tenant>``)."""
    return f"{TEAM_SK_PREFIX}{team}"


def model_pk(name: str) -> str:
    """A model's catalog entry (control table, sk :data:`MODEL_SK`)."""
    return f"{MODEL_PREFIX}{name}"


def pool_config_pk(name: str) -> str:
    """An operator's pool definition (control table, sk :data:`POOL_CONFIG_SK`)."""
    return f"{POOL_PREFIX}{name}"


def audit_pk(month: str) -> str:
    """The audit partition of one month (``yyyy-mm``)."""
    return f"{AUDIT_PREFIX}{month}"


def audit_sk(ts_iso: str, record_id: str) -> str:
    return f"{ts_iso}#{record_id}"


def webhook_endpoints_pk(tenant: str) -> str:
    """A tenant's webhook endpoints partition (control table): its endpoints and their count. Not on
    ``TENANT#<tenant>``, so the functions that fan events out read endpoints, never the signing secrets."""
    return f"{WEBHOOK_ENDPOINT_PREFIX}{tenant}"


def webhook_endpoint_sk(endpoint_id: str) -> str:
    return f"{WEBHOOK_ENDPOINT_SK_PREFIX}{endpoint_id}"


def rate_pk(tenant: str) -> str:
    """The tenant's API request-rate bucket (control table, sk :data:`RATE_SK`)."""
    return f"{RATE_PREFIX}{tenant}"


def scheduler_lease_pk(shard: int, count: int) -> str:
    """The lease of shard ``shard`` of ``count`` scheduler passes (``LEASE#scheduler`` when passes are not sharded)."""
    return SCHEDULER_LEASE_PK if count == 1 else f"{SCHEDULER_LEASE_PK}#{shard}of{count}"


def escrow_pk(lane: str) -> str:
    """The quota escrow item of a scheduler commit lane (:data:`ESCROW_PREFIX`)."""
    return f"{ESCROW_PREFIX}{lane}"


def alloc_pk(node_or_pool: str) -> str:
    """Allocation partition of a node (bookings + records) or a cloud pool (usage + records)."""
    return f"{ALLOC_PREFIX}{node_or_pool}"


def alloc_sk(job_id: str, epoch: int) -> str:
    """One allocation record per gang member of attempt ``epoch`` of ``job_id``."""
    return f"{job_id}#{epoch:08d}"


def owner_pk(owner_path: str) -> str:
    """``gsi1pk`` of an allocation record: the allocations of a user/team/tenant path."""
    return f"OWNER#{owner_path}"


def delivery_sk(ts_iso: str, msg_id: str, attempt: int) -> str:
    """One webhook delivery try on the job's partition."""
    return f"{DELIVERY_PREFIX}{ts_iso}#{msg_id}#{attempt:03d}"


def delivery_claim_sk(msg_id: str) -> str:
    """The claim of one webhook message (``webhook-id``) on the job's partition: written once per message chain."""
    return f"{DELIVERY_CLAIM_PREFIX}{msg_id}"


def directory_of(pk: str, sk: str) -> str | None:
    """The directory partition (``gsi2pk``) a control-table item belongs on, None for items never listed
    (principals, tenants with their webhook secrets, idempotency, rate buckets, registrations, leases)."""
    if pk.startswith(NODE_PREFIX):
        return DIR_NODES if sk == NODE_SK else None
    if pk.startswith(ALLOC_PREFIX):
        return DIR_USAGE if sk in (BOOK_SK, POOL_SK) else DIR_ALLOCATIONS
    if pk.startswith(QUOTA_PREFIX):
        return DIR_QUOTAS if sk == QUOTA_SK else None
    if pk.startswith(POOL_PREFIX):
        return DIR_POOLS if sk == POOL_CONFIG_SK else None
    return None


def watermark_pk(payload_hex: str) -> str:
    """The provenance index partition of a 48-bit watermark payload (12 lower-case hex digits)."""
    return f"{WATERMARK_PREFIX}{payload_hex}"


def watermark_sk(job_id: str) -> str:
    """One provenance entry per job carrying the payload (payloads of distinct jobs may collide)."""
    return f"{JOB_PREFIX}{job_id}"
