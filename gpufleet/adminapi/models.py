"""Request bodies of the administration API (pydantic; unknown fields are refused).

Names (tenants, teams, users) are 1-63 of ``A-Za-z0-9._-`` starting with a letter or digit, as
:class:`gpufleet.store.principals.Principal` requires. Quota maps are GPU type (``*`` = every type) →
milli-GPUs; weights are positive. ``expected_version`` makes a write conditional on the version read
(0: the document must not exist yet); left out, the service uses the version it reads just before.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from gpufleet.models.catalog import HASH_PATTERN
from gpufleet.pools import PoolKind
from gpufleet.spec import GPU_TYPES, POOL_NAME_PATTERN, PlacementPolicy

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
#: an IAM user, role or assumed-role session ARN
ARN_PATTERN = r"^arn:aws[a-z-]*:(iam|sts)::[0-9]{12}:(user|role|assumed-role)/[A-Za-z0-9+=,.@_/-]+$"
QUOTA_TYPES = frozenset(t for t in GPU_TYPES if t != "any") | {"*"}


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TenantIn(_In):
    tenant: Name
    display_name: str = Field("", max_length=200)
    placement_policy: PlacementPolicy | None = None


class TenantPatch(_In):
    display_name: str | None = Field(None, max_length=200)
    placement_policy: PlacementPolicy | None = None
    expected_version: int | None = Field(None, ge=1)


class TeamIn(_In):
    team: Name


class UserIn(_In):
    arn: str = Field(pattern=ARN_PATTERN, max_length=600, description="the IAM principal that calls as this user")
    team: Name
    user: Name
    admin: bool = Field(False, description="an operator: may call /v1/admin and POST /v1/nodes")


def _milli_map(v: dict[str, Any]) -> dict[str, Any]:
    bad = sorted(set(v) - QUOTA_TYPES)
    if bad:
        raise ValueError(f"unknown GPU type(s) {bad}: use one of {sorted(QUOTA_TYPES)}")
    return v


class QuotaIn(_In):
    guarantee: dict[str, Annotated[int, Field(ge=0, le=10_000_000)]] = Field(
        default_factory=dict, description="GPU type → milli-GPUs guaranteed")
    borrow_limit: dict[str, Annotated[int, Field(ge=0, le=10_000_000)]] = Field(
        default_factory=dict, description="GPU type → milli-GPUs it may borrow above its guarantee")
    weight: dict[str, Annotated[float, Field(gt=0, le=1000)]] = Field(
        default_factory=dict, description="GPU type → fair-share weight (default 1)")
    expected_version: int | None = Field(None, ge=0)

    _check = field_validator("guarantee", "borrow_limit", "weight")(_milli_map)


class SafetyIn(_In):
    frame_thresholds: dict[str, float] = Field(default_factory=dict)
    backend: str | None = Field(None, max_length=64)
    max_frames: int | None = None
    expected_version: int | None = Field(None, ge=0)


class SafetyReportIn(_In):
    """An operator's label on a job's tier-1 prompt decision: ``unsafe`` (the filter should have blocked it)
    or ``safe`` (it should not have). ``prompt`` and ``decision`` (the job's ``prompt_checked`` event detail)
    are what the operator read from the job (``gpufleet safety report`` fetches them); the report becomes a
    row of the evaluation set (``GET /v1/admin/safety-reports``, ``gpufleet safety eval``)."""

    label: Literal["safe", "unsafe"]
    category: str | None = Field(None, max_length=64, pattern=r"^[a-z][a-z0-9_]{0,63}$")
    prompt: str = Field(min_length=1, max_length=4000)
    decision: dict[str, Any] | None = None
    note: str | None = Field(None, max_length=500)
    expected_version: int | None = Field(None, ge=0)


class PoolIn(_In):
    """A pool definition an operator adds (on-prem) or whose capacity and prices it changes (any kind; a cloud
    pool's Batch queue and job definition stay the deployment's)."""

    kind: PoolKind = PoolKind.ONPREM
    region: str = Field(min_length=1, max_length=64)
    gpu_type: str
    max_gpus: int = Field(ge=0, le=1_000_000)
    price_per_gpu_hour: float = Field(0.0, ge=0)
    egress_per_gb: float = Field(0.0, ge=0)
    cold_start_s: float = Field(0.0, ge=0)
    expected_version: int | None = Field(None, ge=0)


class NodeBindIn(_In):
    pool: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=POOL_NAME_PATTERN)]
    expected_version: int | None = Field(None, ge=1)


class ModelIn(_In):
    """A model catalog registration: the server reads the published manifest itself and registers its hash; a model
    that is not published (only on nodes' local model roots) needs ``content_hash``."""

    content_hash: str | None = Field(None, pattern=HASH_PATTERN, description="the model's content hash (64 lower-case "
                                     "hex: the SHA-256 of its manifest); must match the published manifest's if any")
    expected_version: int | None = Field(None, ge=0)


class AdminPage(BaseModel):
    """A listing: ``items`` (documents as stored, without keys)."""

    items: list[dict[str, Any]]


class AdminDoc(BaseModel):
    """One document as stored (``version`` counts its administration changes)."""

    model_config = ConfigDict(extra="allow")
