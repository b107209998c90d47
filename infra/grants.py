"""Per-function data grants of the control plane: each function's role allows the calls its code makes.

Contract:
- :data:`TABLE_GRANTS` lists, per function key, the DynamoDB actions it may call on each table and the
  partition-key prefixes (``dynamodb:LeadingKeys``, as ``ForAllValues:StringLike``) it may touch; an
  ``index`` grant allows ``Query`` on the table's GSIs (the leading key of an index query is the index's
  partition key, so it is not conditioned). ``attributes`` restricts the written attributes
  (``dynamodb:Attributes``) where a put shares the job's partition with its META item but must never
  be one (CheckPrompt, which handles untrusted prompts; the webhook sender's delivery log). IAM
  cannot condition on the sort key, so the attribute set is what keeps these puts from replacing
  a job.
- Every PutItem and UpdateItem on the jobs table names its attributes, the job movers' too (the API, the
  scheduler, AwaitPlacement, CompleteRun, ClassifyFailure, MarkTerminal, Publish: ``*_ATTRIBUTES`` below, composed
  from the constants the writing code exports: ``gpufleet.store.jobs.TRANSITION_ATTRIBUTES``,
  ``gpufleet.lifecycle.steps.*_WRITES``, ``gpufleet.store.placements.*_ATTRIBUTES``, ...).
- :data:`BUCKET_GRANTS` lists, per function key, object actions on ``jobs/*`` of a bucket (or the grant's
  ``objects``: the administration API reads published models' ``models/*/manifest.json`` only) and listing
  only under ``jobs/``.
- A table or bucket a function does not name is out of its reach. No function may ``Scan`` (a ``Scan``
  carries no leading key, so a leading-key condition cannot bound it): listings go through an index
  partition, e.g. the control table's directory index (``gsi2``, :data:`DIRECTORY`), whose grant names
  that index and its partitions.
- :func:`grant_data` applies both to the functions of :class:`infra.functions.Functions`.
  ``tests/infra/test_infra_calls_vs_policy.py`` derives each function's calls by running it and checks
  that these grants allow exactly what it does; docs/security.md explains each line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3

from gpufleet import tables as keys
from gpufleet.gang import BATCH_NODE_PREFIX
from gpufleet.lifecycle import recovery, steps
from gpufleet.store import guard, model_catalog, placements
from gpufleet.store import jobs as job_items
from gpufleet.store.fencing import FENCE_ATTRIBUTES
from gpufleet.store.provenance import ENTRY_ATTRIBUTES as PROVENANCE_ATTRIBUTES

JOB = keys.JOB_PREFIX + "*"
IDEMPOTENCY = keys.idempotency_pk("*", "*")
PRINCIPAL = keys.principal_pk("*")
QUOTA = keys.QUOTA_PREFIX + "*"
ALLOC = keys.ALLOC_PREFIX + "*"  # allocations of pools and nodes
TENANT = keys.TENANT_PREFIX + "*"
NODE = keys.NODE_PREFIX + "*"  # a node's registration and liveness items
LEASE = keys.SCHEDULER_LEASE_PK
#: the sharded passes' leases (``LEASE#scheduler#<i>of<n>``, gpufleet.scheduler.shards)
SHARD_LEASE = keys.SCHEDULER_LEASE_PK + "#*"
#: the scheduler's commit lanes' quota escrow items (gpufleet.store.escrow)
ESCROW = keys.ESCROW_PREFIX + "*"
SAFETY = keys.safety_profile_pk("*")  # tenants' safety profiles (not the tenant items)
SAFETY_REPORT = keys.safety_report_pk("*")  # operators' reports on tier-1 prompt decisions (administration API)
RATE = keys.rate_pk("*")  # per-tenant API request rate buckets
WATERMARK = keys.watermark_pk("*")  # the provenance index (a video's manifest by its watermark payload)
#: the control table's directory index and its partitions (nodes, usage counters, allocations, quota nodes)
DIRECTORY = keys.DIRECTORY_INDEX
CAPACITY_DIRS = (keys.DIR_NODES, keys.DIR_USAGE, keys.DIR_POOLS)
SCHEDULER_DIRS = (*CAPACITY_DIRS, keys.DIR_ALLOCATIONS, keys.DIR_QUOTAS)
#: what the API lists: the pools view's capacity, and for an operator's diagnosis (GET /v1/admin/diagnose,
#: gpufleet.store.diagnosis) the attempts holding GPUs and the onboarded tenants (whose ledger entries it reads)
API_DIRS = (*CAPACITY_DIRS, keys.DIR_ALLOCATIONS, keys.DIR_TENANTS)
#: what the administration API lists (only its role reads these partitions)
ADMIN_DIRS = (keys.DIR_TENANTS, keys.DIR_PRINCIPALS, keys.DIR_REGISTRATIONS, keys.DIR_POOLS, keys.DIR_SAFETY_REPORTS,
              keys.DIR_MODELS)
#: what the scheduler reads of a tenant item (never its webhook secret)
TENANT_POLICY_ATTRIBUTES = ("pk", "sk", "placement_policy")
POOL = keys.POOL_PREFIX + "*"  # operators' pool definitions
MODEL = keys.MODEL_PREFIX + "*"  # the model catalog (gpufleet.store.model_catalog)
#: what submission reads of a catalog entry: the content hash a job of the model pins
MODEL_PIN_ATTRIBUTES = ("pk", "sk", "content_hash")
#: what a tenant's model listing reads of each catalog entry (``GET /v1/models``): never who registered it
MODEL_LIST_ATTRIBUTES = model_catalog.LIST_ATTRIBUTES
#: what the administration API reads of the models bucket: published models' manifests (a registration's hash), never
#: their files and no listing (infra.data.MODELS_PREFIX, gpufleet.models.catalog.MANIFEST)
MODEL_MANIFESTS = "models/*/manifest.json"
AUDIT = keys.AUDIT_PREFIX + "*"  # administration audit records
QUEUE_VIEW = keys.QUEUE_VIEW_PK  # the scheduler's last queue view (positions of PENDING jobs)
WEBHOOK_ENDPOINTS = keys.webhook_endpoints_pk("*")  # tenants' webhook endpoints and their counts

#: a job's identity and content, fixed at submission (``gpufleet.store.jobs.build_job``: the API creates the item
#: with ``PutItem``): every role that may update job items is explicitly denied an ``UpdateItem`` naming one of them
#: (:func:`grant_data`), so no step's bug and no compromised step can re-own a job, rewrite its spec (a tenant's
#: prompt, its container's command and environment), move it to another tenant's lists or change the model content
#: it runs (``model_hash``, pinned from the model catalog at submission: gpufleet.store.model_catalog). The sparse
#: indexes' sort keys (``pending_sort``, ``active_part``, ``active_sort``) are read by every transition, so they are not here.
IMMUTABLE_JOB_ATTRIBUTES = ("type", "job_id", "tenant", "team", "user", "owner_path", "spec", "created_at", "priority",
                            "gsi1pk", "gsi1sk", "gsi2pk", "gsi2sk", "model_hash")

#: what the outbox writes on a job (``gpufleet.store.workflow.record_execution_arn``: the key, the ARN its condition
#: names too)
OUTBOX_ATTRIBUTES = ("pk", "sk", "execution_arn")
#: what CollectOutputs writes on a container job: its ``output``, fenced on ``current_epoch``
COLLECT_OUTPUTS_ATTRIBUTES = ("pk", "sk", "output", "current_epoch")
#: what Bill writes on a job: its ``billing``, fenced on ``current_epoch`` (or on the item existing: ``pk``)
BILL_ATTRIBUTES = ("pk", "sk", "billing", "current_epoch")
#: attributes of a timeline event item (``gpufleet.store.jobs.build_event``)
EVENT_ATTRIBUTES = ("pk", "sk", "type", "job_id", "ts", "kind", "detail")
#: a webhook delivery log item (``gpufleet.webhooks.delivery._log``)
DELIVERY_ATTRIBUTES = ("pk", "sk", "msg_id", "event_type", "url", "attempt", "status_code", "delivered", "at",
                       "next_retry_at", "dead_lettered", "reason", "endpoint_id")
#: an event's delivery claim (``gpufleet.store.deliveries``: ``WHMSG#<msg_id>`` on the job's partition)
DELIVERY_CLAIM_ATTRIBUTES = ("pk", "sk", "msg_id", "claimed_by", "claimed_at", "claim_until", "delivered_at")
#: what CheckPrompt writes on its job: the frozen safety settings (condition: not cancel-requested)
SAFETY_DECISION_ATTRIBUTES = ("pk", "sk", "safety", "cancel_requested")

#: what the node API writes on a job or attempt item for a node: the runtime's fenced worker attributes
#: (progress, heartbeat, checkpoint and generated pointers, staging and phases on the attempt) and the fenced
#: SCHEDULED -> RUNNING move (status, running_since, leaving the sparse gsi3/gsi4 indexes)
NODE_WORKER_ATTRIBUTES = ("pk", "sk", "current_epoch", "progress", "heartbeat_at", "checkpoint", "generated", "staging",
                          "phases", "updated_at", "status", "running_since", "gsi3pk", "gsi3sk", "gsi4pk", "gsi4sk",
                          "gang", "gang_ready", "gang_succeeded", "gang_beats", "gang_gpu_seconds", "gang_failed",
                          # a cloud supervisor's token exchange claims the attempt's token, conditioned on its hash
                          # (gpufleet.nodeapi.supervisor; IAM counts a condition's attributes as written ones: the
                          # role could set the hash, but it can vend a supervisor session directly anyway)
                          "supervisor_token_claimed_at", "supervisor_token_sha256")
#: what a cloud run attempt (the GPU job definitions' role: the generate and container stages' runtime, and a cloud
#: gang's members) writes on its job and attempt items itself (gpufleet.store.jobitem, fenced on ``current_epoch``):
#: progress, heartbeats, the checkpoint and generated pointers, staging and phases, the SCHEDULED -> RUNNING move, a
#: crash record (gpufleet.runtime.context.record_crash: ClassifyFailure compares fingerprints) and a cloud gang
#: member's state (``batch_node_<rank>``, gpufleet.gang.batch_member_record: matched as ``StringLike``)
RUN_JOB_ATTRIBUTES = ("pk", "sk", "current_epoch", "progress", "heartbeat_at", "checkpoint", "generated", "staging",
                      "phases", "updated_at", "status", "running_since", "gsi3pk", "gsi3sk", "gsi4pk", "gsi4sk", "crash",
                      BATCH_NODE_PREFIX + "*")
#: what the finalize stage writes (its Batch job role and FinalizeLambda's role): the job item's moderation verdict and
#: output, heartbeats and progress, and a crash record on the attempt item, each fenced on ``current_epoch``
#: (gpufleet.store.jobitem: set_finalized, heartbeat, set_progress, record_attempt)
FINALIZE_ATTRIBUTES = ("pk", "sk", "current_epoch", "moderation", "output", "heartbeat_at", "progress", "crash")
#: what RunOnPrem's dispatch writes: the task token, and the inputs the attempt's credentials may read, on the
#: attempt item (with the job's epoch check)
DISPATCH_ATTRIBUTES = ("pk", "sk", "current_epoch", "run_token", "dispatched_at", "inputs", "gang", "gang_ready",
                       "gang_succeeded", "gang_beats", "gang_gpu_seconds", "gang_failed")
#: what RunCloudContainer's dispatch writes on the attempt item: the task token, the inputs the supervisor's session
#: may read and the sha256 of the supervisor's one-time token (gpufleet.nodeapi.cloud_dispatch)
CLOUD_DISPATCH_ATTRIBUTES = ("pk", "sk", "current_epoch", "run_token", "dispatched_at", "inputs",
                             "supervisor_token_sha256")
#: what the node API reads of a job item and its attempt items (``gpufleet.store.runs.NODE_JOB_FIELDS`` and
#: ``NODE_ATTEMPT_FIELDS``): never ``spec`` (prompts, container env) or ``placement_token``; ``tenant``: whose
#: inputs an attempt's credentials may read (gpufleet.ownership)
NODE_READ_ATTRIBUTES = ("pk", "sk", "job_id", "tenant", "status", "current_epoch", "cancel_requested", "preempt_requested",
                        "progress", "checkpoint", "generated", "placement", "run_token", "dispatched_at", "inputs",
                        "gang", "gang_ready", "gang_succeeded", "gang_beats", "gang_gpu_seconds", "gang_failed",
                        "supervisor_token_sha256", "supervisor_token_claimed_at")
#: what a write may return to a role that may not read whole items (no ``ALL_NEW``/``ALL_OLD``)
PARTIAL_RETURN_VALUES = ("NONE", "UPDATED_NEW")

#: the tenant item's webhook signing secrets (``gpufleet.store.webhook_keys``; ``webhook_secret``: removed by a
#: rotation when an earlier version left one in plaintext)
WEBHOOK_KEY_ATTRIBUTES = ("pk", "sk", "webhook_keys", "webhook_key_id", "webhook_secret")

#: what the administration API writes on a tenant item or a team item (``TENANT#<t>``), never the webhook secret
TENANT_ADMIN_ATTRIBUTES = ("pk", "sk", "tenant", "team", "display_name", "placement_policy", "created_at",
                           "created_by", "updated_at", "updated_by", "version", keys.DIRECTORY_ATTR)

#: an attempt item the scheduler creates with a placement (``gpufleet.scheduler.store``)
ATTEMPT_ATTRIBUTES = ("pk", "sk", "type", "job_id", "epoch", "state", "placement", "charge", "created_at")


def _union(*parts: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for part in parts for a in part))


# The job movers: what each writes on job and attempt items (UpdateItem), composed from the constants the writing
# code exports. A status move (gpufleet.store.jobs.transition_update) names the key, status, updated_at and the
# sparse indexes' keys, the epoch it is fenced on, its extra/remove attributes and its guard's; a move to PENDING or
# into the active queue also names the precomputed index keys it copies (read, but IAM counts every name).
_MOVE = _union(job_items.TRANSITION_ATTRIBUTES, FENCE_ATTRIBUTES)
#: AwaitPlacement: the placement token, on a move to PENDING or a PENDING job's fenced update, both guarded on no
#: cancel request
AWAIT_PLACEMENT_ATTRIBUTES = _union(_MOVE, job_items.TO_PENDING_ATTRIBUTES, job_items.TO_ACTIVE_ATTRIBUTES,
                                   (guard.CANCEL_REQUESTED,), steps.AWAIT_PLACEMENT_WRITES)
#: CompleteRun: SCHEDULED -> RUNNING -> FINALIZING with the run's record (ResumeFinalize: its ``last_run``), and the
#: attempt's ``released_at``
COMPLETE_RUN_ATTRIBUTES = _union(_MOVE, steps.COMPLETE_RUN_WRITES, placements.RELEASE_ATTRIBUTES)
#: ClassifyFailure: the retry accounting (a new epoch, or fenced), a terminal move with ``final``, the release
CLASSIFY_FAILURE_ATTRIBUTES = _union(_MOVE, steps.CLASSIFY_FAILURE_WRITES, placements.RELEASE_ATTRIBUTES)
#: MarkTerminal: REJECTED / FAILED with ``final``, the release of a placed attempt
MARK_TERMINAL_ATTRIBUTES = _union(_MOVE, steps.MARK_TERMINAL_WRITES, placements.RELEASE_ATTRIBUTES)
#: Publish: FINALIZING -> SUCCEEDED / BLOCKED with ``final``, ``published_at``, the finalize phase; BLOCKED removes the
#: ``output`` (so the role may name it: IAM does not tell a REMOVE from a SET)
PUBLISH_ATTRIBUTES = _union(_MOVE, steps.PUBLISH_WRITES)
#: the scheduler: PENDING -> SCHEDULED with the new epoch and placement (its backoff attributes removed), a
#: PENDING job's backoff and wait reason, a victim's preemption request, the release of a placement whose workflow
#: no longer waits
SCHEDULER_JOB_ATTRIBUTES = _union(_MOVE, job_items.TO_ACTIVE_ATTRIBUTES, placements.PLACED_ATTRIBUTES,
                                  placements.PLACEMENT_RESETS, placements.BACKOFF_ATTRIBUTES,
                                  placements.PREEMPT_ATTRIBUTES, placements.RELEASE_ATTRIBUTES)
#: the API: a cancel request, and the operators' recovery moves (release: QUARANTINED -> QUEUED; close; refinalize:
#: FAILED -> FINALIZING at the job's epoch), guarded on the observed ``workflow_run``
API_JOB_ATTRIBUTES = _union(job_items.CANCEL_REQUEST_ATTRIBUTES, _MOVE, job_items.TO_ACTIVE_ATTRIBUTES,
                            (guard.WORKFLOW_RUN,), recovery.WRITES)
#: what the API puts on a job's partition: a new job item (QUEUED, gpufleet.store.jobs.build_job, with a submit's
#: extra attributes) and its timeline events; never ``output``, ``final``, ``billing`` or a placement
JOB_CREATE_ATTRIBUTES = _union(job_items.JOB_ITEM_ATTRIBUTES, job_items.SUBMIT_ATTRIBUTES, EVENT_ATTRIBUTES)

READ = ("dynamodb:GetItem",)
WRITE = ("dynamodb:PutItem", "dynamodb:UpdateItem")
#: releasing an attempt's capacity (``gpufleet.scheduler.store.release``): allocation items and quota usage
RELEASE = ("dynamodb:UpdateItem", "dynamodb:DeleteItem")


@dataclass(frozen=True)
class TableGrant:
    table: str
    actions: tuple[str, ...]
    leading_keys: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    index: bool = False
    #: the index a grant with ``index`` names (``*``: every index of the table)
    index_name: str = "*"
    #: a read limited to ``attributes``: also requires ``dynamodb:Select`` = ``SPECIFIC_ATTRIBUTES`` where the
    #: request has one, so a read without a projection (all attributes) is denied
    projected: bool = False
    #: the ``dynamodb:ReturnValues`` a write may ask for (empty: any)
    return_values: tuple[str, ...] = ()


@dataclass(frozen=True)
class BucketGrant:
    bucket: str  # outputs | checkpoints | logs | models
    actions: tuple[str, ...]
    list_jobs: bool = False
    #: the ``s3:prefix`` a listing may name (``StringLike``); outputs: only a job's ``output/`` folder
    list_prefix: str = "jobs/*"
    #: the object keys ``actions`` are granted on
    objects: str = "jobs/*"


_RELEASE = (TableGrant("control", RELEASE, (ALLOC, QUOTA)),)


def _job_step(update: tuple[str, ...], put: tuple[str, ...] = EVENT_ATTRIBUTES) -> tuple[TableGrant, ...]:
    """A job mover: read job/attempt items, update only ``update`` on them; its puts are ``put`` (timeline events)."""
    return (TableGrant("jobs", READ, (JOB,)),
            TableGrant("jobs", ("dynamodb:UpdateItem",), (JOB,), update),
            TableGrant("jobs", ("dynamodb:PutItem",), (JOB,), put))


TABLE_GRANTS: Mapping[str, tuple[TableGrant, ...]] = {
    "api": (
        # submit (a new job item and its events), cancel and the operators' recovery moves
        TableGrant("jobs", READ, (JOB,)),
        TableGrant("jobs", ("dynamodb:PutItem",), (JOB,), JOB_CREATE_ATTRIBUTES),
        TableGrant("jobs", ("dynamodb:UpdateItem",), (JOB,), API_JOB_ATTRIBUTES),
        TableGrant("jobs", ("dynamodb:Query",), (JOB,)),  # a job's events and webhook deliveries
        TableGrant("jobs", ("dynamodb:Query",), index=True),  # lists, active and pending counts
        TableGrant("control", READ, (PRINCIPAL, QUEUE_VIEW)),  # the caller; a PENDING job's queue position
        TableGrant("control", ("dynamodb:BatchGetItem",), (QUOTA,)),
        # a generate job's model in the catalog: its content hash only (pinned on the job; gpufleet.store.model_catalog)
        TableGrant("control", ("dynamodb:GetItem",), (MODEL,), MODEL_PIN_ATTRIBUTES, projected=True),
        # GET /v1/models: the catalog through the directory index, projected (gpufleet.store.model_catalog.entries)
        TableGrant("control", ("dynamodb:Query",), (keys.DIR_MODELS,), MODEL_LIST_ATTRIBUTES, index=True,
                   index_name=DIRECTORY, projected=True),
        TableGrant("control", ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
                               "dynamodb:DeleteItem"), (IDEMPOTENCY,)),
        TableGrant("control", ("dynamodb:UpdateItem",), (RATE,)),  # the tenant's request rate bucket
        # GET /v1/pools lists nodes and usage counters through the directory index; GET /v1/admin/diagnose also
        # allocations and tenants (projected to their keys)
        TableGrant("control", ("dynamodb:Query",), API_DIRS, index=True, index_name=DIRECTORY),
        TableGrant("ledger", ("dynamodb:Query",), index=True),  # GET /v1/costs: the tenant's entries (gsi1)
        # the tenant's webhook signing secrets: fetch (a first one is made) and rotate, sealed attributes only
        TableGrant("control", READ, (TENANT,)),
        TableGrant("control", ("dynamodb:UpdateItem",), (TENANT,), WEBHOOK_KEY_ATTRIBUTES),
        # the tenant's webhook endpoints (WHEP#<t>): create and delete are transactions with the count item
        TableGrant("control", ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
                               "dynamodb:Query"), (WEBHOOK_ENDPOINTS,)),
    ),
    # POST /v1/provenance/lookup: the caller and its rate buckets, the index (WM#<payload>), the jobs it names
    "provenance_lookup": (
        TableGrant("control", READ, (PRINCIPAL,)),
        TableGrant("control", ("dynamodb:UpdateItem",), (RATE,)),  # the request bucket and the lookup bucket
        TableGrant("jobs", ("dynamodb:Query",), (WATERMARK,)),
        TableGrant("jobs", ("dynamodb:GetItem",), (JOB,)),
    ),
    # the execution's ARN, once, on the job it started (gpufleet.store.workflow.record_execution_arn): nothing else
    "outbox": (TableGrant("jobs", ("dynamodb:UpdateItem",), (JOB,), OUTBOX_ATTRIBUTES),),
    "check_prompt": (
        TableGrant("jobs", READ, (JOB,)),
        TableGrant("jobs", ("dynamodb:UpdateItem",), (JOB,), SAFETY_DECISION_ATTRIBUTES),
        TableGrant("jobs", ("dynamodb:PutItem",), (JOB,), EVENT_ATTRIBUTES),
        TableGrant("control", READ, (SAFETY,)),  # the tenant's safety profile (SAFETY#<t> / SAFETY)
    ),
    "await_placement": _job_step(AWAIT_PLACEMENT_ATTRIBUTES),
    "prepare_run": (TableGrant("jobs", READ, (JOB,)),),
    "complete_run": (*_job_step(COMPLETE_RUN_ATTRIBUTES), *_RELEASE),  # the run's GPUs and quota go back at FINALIZING
    "classify_failure": (*_job_step(CLASSIFY_FAILURE_ATTRIBUTES), *_RELEASE),
    "mark_terminal": (*_job_step(MARK_TERMINAL_ATTRIBUTES), *_RELEASE),
    # a container job's file count and size, fenced on the attempt's epoch (lifecycle.steps.collect_outputs)
    "collect_outputs": (TableGrant("jobs", ("dynamodb:GetItem",), (JOB,)),
                        TableGrant("jobs", ("dynamodb:UpdateItem",), (JOB,), COLLECT_OUTPUTS_ATTRIBUTES)),
    # Publish indexes the video's manifest by its watermark payload (WM#<payload> / JOB#<job>)
    # (the attempt's GPUs and quota went back at CompleteRun: no release here)
    "publish": (*_job_step(PUBLISH_ATTRIBUTES), TableGrant("jobs", ("dynamodb:PutItem",), (WATERMARK,), PROVENANCE_ATTRIBUTES)),
    # a charge (with the fenced job update) or a waiver entry, each written once; on the job only its ``billing``
    # (fenced on ``current_epoch``: gpufleet.store.ledger.record / record_waiver), never its state
    "bill": (TableGrant("jobs", ("dynamodb:GetItem",), (JOB,)),
             TableGrant("jobs", ("dynamodb:UpdateItem",), (JOB,), BILL_ATTRIBUTES),
             TableGrant("jobs", ("dynamodb:PutItem",), (JOB,), EVENT_ATTRIBUTES),
             TableGrant("ledger", ("dynamodb:GetItem", "dynamodb:PutItem"), (JOB,))),
    # the job, and its tenant's webhook endpoints to fan the event out to
    "notify": (TableGrant("jobs", READ, (JOB,)), TableGrant("control", ("dynamodb:Query",), (WEBHOOK_ENDPOINTS,))),
    "scheduler": (
        TableGrant("jobs", ("dynamodb:Query",), index=True),  # the pending index
        *_job_step(SCHEDULER_JOB_ATTRIBUTES, _union(ATTEMPT_ATTRIBUTES, EVENT_ATTRIBUTES)),
        # nodes, usage counters, allocations, quota nodes through the directory index
        TableGrant("control", ("dynamodb:Query",), SCHEDULER_DIRS, index=True, index_name=DIRECTORY),
        # the pending jobs' tenants' default placement policy, projected: not the webhook secret
        TableGrant("control", ("dynamodb:BatchGetItem",), (TENANT,), TENANT_POLICY_ATTRIBUTES, projected=True),
        TableGrant("control", (*WRITE, "dynamodb:DeleteItem"), (LEASE, SHARD_LEASE, ALLOC, QUOTA)),
        # the commit lanes' quota escrow: read (what a dead pass left), reserved into and given back (transactions)
        TableGrant("control", ("dynamodb:GetItem", "dynamodb:UpdateItem"), (ESCROW,)),
        # a lane short of quota reads what its level has left before reserving that
        TableGrant("control", READ, (QUOTA,)),
        TableGrant("control", ("dynamodb:PutItem",), (QUEUE_VIEW,)),  # the pass's queue view
    ),
    "webhook": (
        TableGrant("jobs", ("dynamodb:PutItem",), (JOB,), DELIVERY_ATTRIBUTES),  # delivery log items
        TableGrant("jobs", ("dynamodb:UpdateItem",), (JOB,), DELIVERY_CLAIM_ATTRIBUTES),  # an event's claim
        TableGrant("control", READ, (TENANT,)),  # the tenant's sealed signing secrets
        TableGrant("control", ("dynamodb:UpdateItem",), (TENANT,), WEBHOOK_KEY_ATTRIBUTES),  # a first secret
        TableGrant("control", READ, (WEBHOOK_ENDPOINTS,)),  # an endpoint's message: is the endpoint still enabled
    ),
    "webhook_events": (TableGrant("control", ("dynamodb:Query",), (WEBHOOK_ENDPOINTS,)),),  # the tenant's endpoints
    # the admin check reads the caller's principal; the registration item is NODE#<id> / REGISTRATION, put in
    # one transaction with its audit record
    "register_node": (TableGrant("control", READ, (PRINCIPAL,)),
                      TableGrant("control", ("dynamodb:PutItem",), (NODE, AUDIT))),
    # the administration API: each change (conditional update or delete, parents checked) with its audit
    # record in one transaction; listings scan; the audit log is a query of one month's partition; the model
    # catalog (MODEL#<name>: the models jobs may name, each with its content hash) is written by it alone
    "admin_api": (
        TableGrant("control", READ, (PRINCIPAL, TENANT, QUOTA, SAFETY, POOL, NODE, SAFETY_REPORT, MODEL)),
        TableGrant("control", ("dynamodb:UpdateItem", "dynamodb:DeleteItem"),
                   (PRINCIPAL, QUOTA, SAFETY, POOL, NODE, SAFETY_REPORT, MODEL)),
        # the tenant item also holds the webhook signing secret: only the tenant's and its teams' attributes;
        # a change's parents (tenant, team) are condition-checked in its transaction
        TableGrant("control", ("dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"), (TENANT,),
                   TENANT_ADMIN_ATTRIBUTES),
        TableGrant("control", ("dynamodb:PutItem", "dynamodb:Query"), (AUDIT,)),
        TableGrant("control", ("dynamodb:Query",), (TENANT,)),  # a tenant's teams (TENANT#<t> / TEAM#<team>)
        # a deregistration first lists the attempts booked on the node (ALLOC#<node>: keys only)
        TableGrant("control", ("dynamodb:Query",), (ALLOC,)),
        # listings of tenants, principals, registrations, pools, safety reports and the model catalog through the
        # directory index (no Scan)
        TableGrant("control", ("dynamodb:Query",), ADMIN_DIRS, index=True, index_name=DIRECTORY),
    ),
    # RunOnPrem's dispatch: reads the attempt, stores its task token (a transaction with the epoch check)
    "dispatch_onprem": (TableGrant("jobs", READ, (JOB,)),
                        TableGrant("jobs", ("dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"), (JOB,),
                                   DISPATCH_ATTRIBUTES)),
    # RunCloudContainer's dispatch: reads the job (its spec: the image, the tenant's command and env go to Batch, never
    # to the state) and the attempt, stores the task token and the supervisor token's hash (with the epoch check)
    "dispatch_cloud": (TableGrant("jobs", READ, (JOB,)),
                       TableGrant("jobs", ("dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"), (JOB,),
                                  CLOUD_DISPATCH_ATTRIBUTES)),
    # the node API: reads what it checks of jobs and attempts (projected: not the spec or the placement
    # token), the worker's fenced writes (returning only what they set) and timeline events; node items
    "node_api": (
        TableGrant("jobs", READ, (JOB,), NODE_READ_ATTRIBUTES, projected=True),
        TableGrant("jobs", ("dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"), (JOB,), NODE_WORKER_ATTRIBUTES,
                   return_values=PARTIAL_RETURN_VALUES),
        TableGrant("jobs", ("dynamodb:PutItem",), (JOB,), EVENT_ATTRIBUTES),
        TableGrant("control", ("dynamodb:GetItem", "dynamodb:PutItem"), (NODE,)),
    ),
}

BUCKET_GRANTS: Mapping[str, tuple[BucketGrant, ...]] = {
    # a model registration reads the published manifest (gpufleet.models.catalog.S3Manifests): manifests only
    "admin_api": (BucketGrant("models", ("s3:GetObject",), objects=MODEL_MANIFESTS),),
    # log pages and presigned output links (the caller's GET is signed with this role)
    "api": (BucketGrant("logs", ("s3:GetObject",), list_jobs=True),
            BucketGrant("outputs", ("s3:GetObject", "s3:GetObjectVersion"), list_jobs=True,
                        list_prefix="jobs/*/output/*")),  # + a container job's files
    # a match's presigned manifest (and, to its own tenant, video) links, signed with this role
    "provenance_lookup": (BucketGrant("outputs", ("s3:GetObject",)),),
    # CollectOutputs lists (only lists) a container job's published files to check them against the cap
    "collect_outputs": (BucketGrant("outputs", (), list_jobs=True, list_prefix="jobs/*/output/*"),),
    # terminal writers tag the job's checkpoints (gpufleet.store.objects.mark_checkpoints_ended)
    **{k: (BucketGrant("checkpoints", ("s3:GetObjectTagging", "s3:PutObjectTagging"), list_jobs=True),)
       for k in ("mark_terminal", "publish", "classify_failure")},
}


def _leading(grant: TableGrant) -> dict:
    conditions: dict = {}
    if grant.leading_keys:
        conditions["ForAllValues:StringLike"] = {"dynamodb:LeadingKeys": list(grant.leading_keys)}
    if grant.attributes:
        conditions["ForAllValues:StringEquals"] = {"dynamodb:Attributes": list(grant.attributes)}
    if grant.projected:
        conditions.setdefault("StringEqualsIfExists", {})["dynamodb:Select"] = "SPECIFIC_ATTRIBUTES"
    if grant.return_values:
        conditions.setdefault("StringEqualsIfExists", {})["dynamodb:ReturnValues"] = list(grant.return_values)
    return conditions


def updates_jobs(grants: tuple[TableGrant, ...]) -> bool:
    """Whether these grants let a function update items of the jobs table."""
    return any(g.table == "jobs" and "dynamodb:UpdateItem" in g.actions for g in grants)


def immutable_job_denial(table: ddb.ITable) -> iam.PolicyStatement:
    """The explicit Deny of an ``UpdateItem`` on the jobs table that names one of :data:`IMMUTABLE_JOB_ATTRIBUTES`."""
    return iam.PolicyStatement(
        sid="JobIdentityImmutable", effect=iam.Effect.DENY, actions=["dynamodb:UpdateItem"],
        resources=[table.table_arn],
        conditions={"ForAnyValue:StringEquals": {"dynamodb:Attributes": list(IMMUTABLE_JOB_ATTRIBUTES)}})


def grant_data(
    functions: Mapping[str, lambda_.IFunction],
    tables: Mapping[str, ddb.ITable],
    buckets: Mapping[str, s3.IBucket],
) -> None:
    """Add the statements of :data:`TABLE_GRANTS` and :data:`BUCKET_GRANTS` to each function's role, and to each
    role that may update job items the explicit Deny of :data:`IMMUTABLE_JOB_ATTRIBUTES`."""
    for key, grants in TABLE_GRANTS.items():
        fn = functions[key]
        for g in grants:
            table = tables[g.table]
            resource = f"{table.table_arn}/index/{g.index_name}" if g.index else table.table_arn
            fn.add_to_role_policy(
                iam.PolicyStatement(actions=list(g.actions), resources=[resource], conditions=_leading(g) or None)
            )
        if updates_jobs(grants):
            fn.add_to_role_policy(immutable_job_denial(tables["jobs"]))
    for key, grants in BUCKET_GRANTS.items():
        fn = functions[key]
        for g in grants:
            bucket = buckets[g.bucket]
            if g.actions:
                fn.add_to_role_policy(
                    iam.PolicyStatement(actions=list(g.actions), resources=[bucket.arn_for_objects(g.objects)])
                )
            if g.list_jobs:
                fn.add_to_role_policy(
                    iam.PolicyStatement(
                        actions=["s3:ListBucket"],
                        resources=[bucket.bucket_arn],
                        conditions={"StringLike": {"s3:prefix": [g.list_prefix]}},
                    )
                )
