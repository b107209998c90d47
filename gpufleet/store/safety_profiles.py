"""Tenant safety profiles in the control table (``SAFETY#<tenant>`` / ``SAFETY``) and their freezing onto jobs.

Contract:
- :func:`get_profile` returns the tenant's :class:`~gpufleet.safety.profile.SafetyProfile`
  or ``None`` (no profile: the deployment default applies). A stored item that no longer
  validates raises :class:`ConfigError` (fail closed; never silently the default).
- :func:`put_profile` is an optimistic, versioned write: ``expected_version`` is the
  version the operator read (0: there must be no profile yet); the new item has
  ``version = expected_version + 1`` and lands only if the stored version still is
  ``expected_version``, else :class:`Conflict` (someone else wrote in between). The
  profile is validated before anything is written (:class:`ValidationFailed`).
  There is no delete: :func:`put_profile` with no thresholds, backend or max_frames
  clears it (versions stay monotonic, so a job's ``profile_version`` stays unambiguous).
- :func:`freeze_on_job` sets the job item's ``safety`` once (condition: the job exists,
  has no ``safety`` yet and is not cancel-requested). A retried CheckPrompt gets the
  settings frozen the first time back; a cancelled job raises :class:`Cancelled`.
- Operators write profiles through the administration API (``PUT /v1/admin/tenants/{tenant}/safety-profile``,
  audited; ``gpufleet admin safety-profile`` calls it); the tenant API never does.
- A profile has its own partition, apart from the tenant item (``TENANT#<tenant>`` /
  ``TENANT``, which holds the webhook signing secret), so CheckPrompt's role can be
  granted ``SAFETY#*`` and not the secret. :func:`move_legacy_profiles` (operator,
  ``gpufleet admin safety-profile migrate``) moves profiles written before at
  ``TENANT#<tenant>`` / ``SAFETY`` to their partition; until it runs, such a
  profile is not read (the deployment default applies).
"""

from __future__ import annotations

from typing import Any, Protocol

from botocore.exceptions import ClientError
from pydantic import ValidationError

from gpufleet.clock import Clock, iso
from gpufleet.errors import Cancelled, ConfigError, Conflict, NotFound, ValidationFailed
from gpufleet.safety.profile import FrozenSafety, SafetyProfile, resolve
from gpufleet.store.dynamo import error_code, marshal, marshal_value, reraise, translate_errors, unmarshal
from gpufleet.store.fencing import current_item, job_key
from gpufleet.tables import SAFETY_SK, TENANT_PREFIX, safety_profile_pk

SK = SAFETY_SK
_ITEM_FIELDS = ("tenant", "frame_thresholds", "backend", "max_frames", "version", "updated_at", "updated_by")


def profile_key(tenant: str) -> dict[str, Any]:
    return marshal({"pk": safety_profile_pk(tenant), "sk": SK})


def get_profile(client, table: str, tenant: str, *, consistent: bool = True) -> SafetyProfile | None:
    """The tenant's profile, or ``None`` when it has none."""
    with translate_errors():
        resp = client.get_item(TableName=table, Key=profile_key(tenant), ConsistentRead=consistent)
    return profile_from_item(tenant, unmarshal(resp.get("Item")))


def profile_from_item(tenant: str, item: dict[str, Any] | None) -> SafetyProfile | None:
    """The profile a stored item holds (``None``: no item); an item that no longer validates is a
    :class:`ConfigError` (fail closed)."""
    if not item:
        return None
    try:
        return SafetyProfile.model_validate({k: item[k] for k in _ITEM_FIELDS if item.get(k) is not None})
    except ValidationError as err:
        raise ConfigError(f"the stored safety profile of tenant {tenant} is invalid: {err.errors()[0]['msg']}")


def put_profile(
    client,
    table: str,
    tenant: str,
    frame_thresholds: dict[str, float] | None = None,
    *,
    backend: str | None = None,
    max_frames: int | None = None,
    expected_version: int,
    updated_by: str | None = None,
    clock: Clock,
) -> SafetyProfile:
    """Write version ``expected_version + 1`` of the tenant's profile (see the module contract)."""
    if expected_version < 0:
        raise ValidationFailed("expected_version must be >= 0")
    try:
        profile = SafetyProfile(tenant=tenant, frame_thresholds=frame_thresholds or {}, backend=backend,
                                max_frames=max_frames, version=expected_version + 1,
                                updated_at=iso(clock.now()), updated_by=updated_by)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "profile"
        raise ValidationFailed(f"invalid safety profile: {where}: {first['msg']}")
    item = {"pk": safety_profile_pk(tenant), "sk": SK, "type": "safety_profile", **profile.model_dump(mode="json")}
    if expected_version == 0:
        cond, values = "attribute_not_exists(pk)", None
    else:
        cond, values = "#v = :expected", {":expected": marshal_value(expected_version)}
    kwargs: dict[str, Any] = {"TableName": table, "Item": marshal(item), "ConditionExpression": cond}
    if values:
        kwargs.update(ExpressionAttributeNames={"#v": "version"}, ExpressionAttributeValues=values)
    try:
        client.put_item(**kwargs)
    except ClientError as err:
        if error_code(err) != "ConditionalCheckFailedException":
            reraise(err)
        current = get_profile(client, table, tenant)
        raise Conflict(f"safety profile of tenant {tenant} is at version {current.version if current else 0}, "
                       f"not {expected_version}", current_version=current.version if current else 0) from err
    return profile


def move_legacy_profiles(client, table: str) -> list[str]:
    """Move profiles stored at the old key (``TENANT#<t>`` / ``SAFETY``) to ``SAFETY#<t>`` / ``SAFETY``.

    Each move is one transaction: put the new item (only if the tenant has none there yet) and
    delete the old one; a tenant that already has a new-style profile keeps it and its old item
    stays for the operator to look at. An operator command (it scans the control table); returns
    the tenants moved.
    """
    from gpufleet.store.dynamo import paginate

    moved = []
    with translate_errors():
        legacy = list(paginate(
            client.scan, TableName=table, FilterExpression="sk = :s AND begins_with(pk, :t)",
            ExpressionAttributeValues={":s": {"S": SK}, ":t": {"S": TENANT_PREFIX}},
        ))
    for item in legacy:
        tenant = item["pk"][len(TENANT_PREFIX):]
        new = {**item, "pk": safety_profile_pk(tenant)}
        try:
            client.transact_write_items(TransactItems=[
                {"Put": {"TableName": table, "Item": marshal(new), "ConditionExpression": "attribute_not_exists(pk)"}},
                {"Delete": {"TableName": table, "Key": marshal({"pk": item["pk"], "sk": SK})}},
            ])
        except ClientError as err:
            if error_code(err) != "TransactionCanceledException":
                reraise(err)
            continue
        moved.append(tenant)
    return moved


def resolve_for_tenant(client, table: str, tenant: str, clock: Clock) -> FrozenSafety:
    """The tier-2 settings a job of ``tenant`` gets now (pure resolution over :func:`get_profile`)."""
    return resolve(get_profile(client, table, tenant), iso(clock.now()))


def freeze_on_job(client, jobs_table: str, job_id: str, safety: FrozenSafety) -> FrozenSafety:
    """Set the job's ``safety`` once; return what the job carries (this, or what an earlier call froze)."""
    try:
        client.update_item(
            TableName=jobs_table, Key=job_key(job_id), UpdateExpression="SET #s = :s",
            ConditionExpression="attribute_exists(pk) AND attribute_not_exists(#s) "
                                "AND (attribute_not_exists(#c) OR #c = :f)",
            ExpressionAttributeNames={"#s": "safety", "#c": "cancel_requested"},
            ExpressionAttributeValues={":s": marshal_value(safety.as_item()), ":f": {"BOOL": False}},
        )
        return safety
    except ClientError as err:
        if error_code(err) != "ConditionalCheckFailedException":
            reraise(err)
    job = current_item(client, jobs_table, job_id)
    if not job:
        raise NotFound(f"job {job_id} not found")
    if job.get("cancel_requested"):
        raise Cancelled(f"job {job_id} was cancelled")
    if job.get("safety"):
        return FrozenSafety.model_validate(job["safety"])
    raise Conflict(f"could not freeze the safety settings of job {job_id}")


class SafetyProfileStore(Protocol):
    """Tenant safety profiles, as CheckPrompt reads them."""

    def get(self, tenant: str) -> SafetyProfile | None: ...

    def resolve(self, tenant: str) -> FrozenSafety: ...


class DynamoSafetyProfiles:
    """:class:`SafetyProfileStore` in the control table (:func:`get_profile`, :func:`resolve_for_tenant`)."""

    def __init__(self, client, table: str, clock: Clock) -> None:
        self.client = client
        self.table = table
        self.clock = clock

    def get(self, tenant: str) -> SafetyProfile | None:
        return get_profile(self.client, self.table, tenant)

    def resolve(self, tenant: str) -> FrozenSafety:
        return resolve_for_tenant(self.client, self.table, tenant, self.clock)
