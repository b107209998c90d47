"""DynamoDB data model: table names and key builders (pure; no boto3).

Three tables (see docs/data-model.md for the access patterns each key serves):

``jobs`` (stream: NEW_AND_OLD_IMAGES, the transactional outbox)
  job       pk=JOB#<job_id>  sk=META
            gsi1pk=TENANT#<tenant>             gsi1sk=<created_at>#<job_id>  (tenant list, newest first)
            gsi2pk=USER#<tenant>#<user>        gsi2sk=<created_at>#<job_id>  (user list, newest first)
            gsi3pk=PENDING (only while PENDING) gsi3sk=<prio_inv>#<created_at>#<job_id> (scheduler)
            gsi4pk=ACTIVE#<tenant>#<team> (only while QUEUED/PENDING/SCHEDULED)
                                               gsi4sk=<user>#<created_at>#<job_id> (soft quota counts)
            (gsi3/gsi4 are maintained by gpufleet.store.jobs.transition / transition_update)
  attempt   pk=JOB#<job_id>  sk=ATTEMPT#<epoch:08d>
  event     pk=JOB#<job_id>  sk=EVENT#<ts>#<seq>
  delivery  pk=JOB#<job_id>  sk=DELIVERY#<ts>#<id>
  log chunk pointers live in S3, not here.

``control``
  idempotency  pk=IDEMP#<tenant>#<key>   sk=IDEMP   (expires_at: TTL attribute, 24 h)
  principal    pk=PRINCIPAL#<arn>        sk=PRINCIPAL
  quota node   pk=QUOTA#<path>           sk=QUOTA   (limits + usage counters, conditional updates)
  node         pk=NODE#<node_id>         sk=NODE    (capacity + heartbeat expiry)
  allocation   pk=ALLOC#<node_id|pool>   sk=<job_id>#<epoch>  gsi1pk=OWNER#<path> (per user/team allocations)
  tenant       pk=TENANT#<tenant>        sk=TENANT  (defaults: placement policy, webhook secret)

``ledger``
  charge    pk=JOB#<job_id>  sk=ATTEMPT#<epoch:08d>   (written once: attribute_not_exists)
            gsi1pk=TENANT#<tenant>  gsi1sk=<ts>#<job_id>
"""

from __future__ import annotations

import os
from dataclasses import dataclass

JOB_META = "META"
NODE_SK = "NODE"
PENDING_PARTITION = "PENDING"


@dataclass(frozen=True)
class TableNames:
    jobs: str = "gpufleet-jobs"
    control: str = "gpufleet-control"
    ledger: str = "gpufleet-ledger"

    @classmethod
    def from_env(cls) -> TableNames:
        return cls(
            jobs=os.environ.get("GPUFLEET_JOBS_TABLE", cls.jobs),
            control=os.environ.get("GPUFLEET_CONTROL_TABLE", cls.control),
            ledger=os.environ.get("GPUFLEET_LEDGER_TABLE", cls.ledger),
        )


def job_pk(job_id: str) -> str:
    return f"JOB#{job_id}"


def attempt_sk(epoch: int) -> str:
    return f"ATTEMPT#{epoch:08d}"


def event_sk(ts_iso: str, seq: int) -> str:
    return f"EVENT#{ts_iso}#{seq:06d}"


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
    return f"QUOTA#{path}"


def node_pk(node_id: str) -> str:
    return f"NODE#{node_id}"
