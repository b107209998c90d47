"""Pool configuration: where jobs can run (on-prem node pools and cloud GPU pools).

Contract (docs/contracts.md, "Pools"): a validated list of pools with ``name``,
``kind`` (``onprem`` | ``spot`` | ``ondemand``), ``region`` (a cloud region or an
on-prem site), ``gpu_type``, ``max_gpus``, ``price_per_gpu_hour``,
``egress_per_gb``, ``cold_start_s`` and, for cloud pools, the Batch ``job_queue``
and ``job_definition``, and ``gangs``: the pool runs multi-node jobs (``resources.nodes > 1``) as AWS Batch
multi-node parallel jobs. Only an on-demand pool may set it (Batch runs no multi-node parallel job on Spot
compute environments); on-prem pools place a gang one member per node without it, and a cloud pool without
it runs single-node jobs only. The default ``cloud-gang`` pool is the template's gang queue (its own
on-demand compute environment in a cluster placement group, infra/compute.py) with ``max_gpus`` 0: off
until an operator gives it GPUs through a pool document. Loaded from ``GPUFLEET_POOLS`` (a JSON list) or the
defaults below. Invalid configuration raises :class:`gpufleet.errors.ConfigError`.
On-prem capacity comes from node heartbeats; ``max_gpus`` caps it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufleet.errors import ConfigError
from gpufleet.spec import GPU_TYPES, POOL_NAME_PATTERN


class PoolKind(StrEnum):
    ONPREM = "onprem"
    SPOT = "spot"
    ONDEMAND = "ondemand"

    @property
    def is_cloud(self) -> bool:
        return self is not PoolKind.ONPREM


#: cost-optimised order: on-prem first, then spot, then on-demand
KIND_ORDER = {PoolKind.ONPREM: 0, PoolKind.SPOT: 1, PoolKind.ONDEMAND: 2}


class Pool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., min_length=1, max_length=64, pattern=POOL_NAME_PATTERN)
    kind: PoolKind
    region: str = Field(..., min_length=1, max_length=64)
    gpu_type: str
    max_gpus: int = Field(..., ge=0)
    price_per_gpu_hour: float = Field(0.0, ge=0)
    egress_per_gb: float = Field(0.0, ge=0)
    cold_start_s: float = Field(0.0, ge=0)
    job_queue: str | None = None
    job_definition: str | None = None
    gangs: bool = False

    @model_validator(mode="after")
    def _check(self) -> Pool:
        if self.gangs and self.kind is not PoolKind.ONDEMAND:
            raise ValueError(f"pool {self.name}: gangs need an on-demand cloud pool (AWS Batch runs no multi-node "
                             "parallel job on Spot; on-prem pools place gangs one member per node without the flag)")
        if self.gpu_type not in GPU_TYPES or self.gpu_type == "any":
            raise ValueError(f"gpu_type must be a concrete GPU type, got {self.gpu_type!r}")
        if self.kind.is_cloud and not (self.job_queue and self.job_definition):
            raise ValueError(f"cloud pool {self.name} needs job_queue and job_definition")
        return self


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pools: tuple[Pool, ...] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> PoolConfig:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError("pool names must be unique")
        return self

    def by_name(self) -> dict[str, Pool]:
        return {p.name: p for p in self.pools}


DEFAULT_POOLS: tuple[dict, ...] = (
    {"name": "onprem-a", "kind": "onprem", "region": "eu-west-1", "gpu_type": "A100", "max_gpus": 512,
     "price_per_gpu_hour": 0.9, "egress_per_gb": 0.0, "cold_start_s": 5},
    {"name": "cloud-spot", "kind": "spot", "region": "eu-west-1", "gpu_type": "A10G", "max_gpus": 64,
     "price_per_gpu_hour": 0.45, "egress_per_gb": 0.02, "cold_start_s": 240,
     "job_queue": "gpufleet-gpu-spot", "job_definition": "gpufleet-gpu"},
    {"name": "cloud-ondemand", "kind": "ondemand", "region": "eu-west-1", "gpu_type": "A10G", "max_gpus": 32,
     "price_per_gpu_hour": 1.21, "egress_per_gb": 0.02, "cold_start_s": 180,
     "job_queue": "gpufleet-gpu-ondemand", "job_definition": "gpufleet-gpu"},
    {"name": "cloud-gang", "kind": "ondemand", "region": "eu-west-1", "gpu_type": "A10G", "max_gpus": 0,
     "price_per_gpu_hour": 1.21, "egress_per_gb": 0.02, "cold_start_s": 300,
     "job_queue": "gpufleet-gpu-gang", "job_definition": "gpufleet-gpu-gang", "gangs": True},
)


def parse_pools(raw: str | list) -> tuple[Pool, ...]:
    """Validate a JSON string (or already-parsed list) of pools."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
        return PoolConfig(pools=tuple(data)).pools
    except (ValueError, TypeError, ValidationError) as err:
        raise ConfigError(f"invalid pool configuration: {err}") from err


def load_pools(env: Mapping[str, str]) -> tuple[Pool, ...]:
    """Pools from ``env["GPUFLEET_POOLS"]`` (JSON list) or :data:`DEFAULT_POOLS` (processes read them
    through :class:`gpufleet.settings.PoolSettings`)."""
    raw = env.get("GPUFLEET_POOLS")
    return parse_pools(raw if raw else list(DEFAULT_POOLS))


#: the fields of a pool an operator's pool document may set (``POOL#<name>``, :mod:`gpufleet.adminapi`)
OPERATOR_FIELDS = ("kind", "region", "gpu_type", "max_gpus", "price_per_gpu_hour", "egress_per_gb", "cold_start_s")


def merge_pools(deployed: tuple[Pool, ...], docs, *, skip_invalid: bool = False) -> tuple[Pool, ...]:
    """The deployment's pools overlaid by operators' pool documents (pure): a document naming a deployed pool
    changes its :data:`OPERATOR_FIELDS` (not its kind, nor a cloud pool's Batch queue and job definition); any
    other document adds an on-prem pool. An invalid document raises ``ValueError`` (``skip_invalid``: is
    left out, as the scheduler does, so one bad document never stops a pass)."""
    by_name = {p.name: p for p in deployed}
    for doc in docs:
        try:
            name = str(doc["name"])
            fields = {k: doc[k] for k in OPERATOR_FIELDS if doc.get(k) is not None}
            base = by_name.get(name)
            if base is not None:
                if str(fields.get("kind", base.kind.value)) != base.kind.value:
                    raise ValueError(f"pool {name} is {base.kind.value} in the deployment; its kind cannot change")
                by_name[name] = Pool.model_validate({**base.model_dump(), **fields})
            else:
                if str(fields.get("kind", PoolKind.ONPREM.value)) != PoolKind.ONPREM.value:
                    raise ValueError(f"pool {name}: only on-prem pools can be added by an operator")
                by_name[name] = Pool.model_validate({"name": name, **fields})
        except (ValueError, KeyError, TypeError) as err:
            if skip_invalid:
                continue
            raise ValueError(str(err)) from err
    return tuple(by_name.values())
