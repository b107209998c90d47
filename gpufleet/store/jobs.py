"""Job repository (jobs table): create, read, list, status transitions, event timeline, cancel.

Contract:
- :func:`create_job` writes the job (QUEUED), its ``created`` event and any
  extra transaction items (the idempotency completion) in ONE
  ``TransactWriteItems``; the job put is conditioned on ``attribute_not_exists``.
- :func:`get_job` is tenant-scoped: another tenant's job is :class:`NotFound`,
  exactly like an unknown id. :meth:`JobStore.get_record` is the same read, typed
  (:class:`gpufleet.jobrecord.JobRecord`: the spec a :class:`JobSpec`, the placement a
  :class:`Placement`); :meth:`JobStore.get` keeps the raw item for callers that need its plumbing.
- :func:`list_jobs` lists a tenant's (or one user's) jobs newest first, by
  ``created_at#job_id`` on gsi1/gsi2, with status / created_after (inclusive) /
  created_before (exclusive) filters. The cursor is the position of the last
  item examined, HMAC-signed together with the query's scope, so pages have no
  duplicates or gaps while newer jobs arrive, and a forged cursor is a
  :class:`BadRequest`.
- Every status change is a conditional write along
  :data:`gpufleet.status.TRANSITIONS` (:func:`transition`, or
  :func:`transition_update` inside a caller's own transaction). It also keeps
  the sparse indexes right: gsi3 (scheduler's PENDING queue) only while PENDING,
  gsi4 (soft quota) only while in :data:`gpufleet.status.ACTIVE_QUEUE`. The
  event is appended in the same transaction.
- :func:`request_cancel` sets ``cancel_requested`` with a conditional write;
  repeating it returns the same job without a second write; a terminal job
  that was never cancel-requested raises :class:`InvalidTransition` (409) with
  ``current_status``.
"""

from __future__ import annotations

import decimal
import itertools
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from botocore.exceptions import ClientError

from gpufleet.clock import Clock, iso
from gpufleet.errors import (
    BadRequest,
    Conflict,
    IdempotencyInFlight,
    InvalidTransition,
    NotFound,
    ValidationFailed,
)
from gpufleet.jobrecord import JobRecord
from gpufleet.spec import JobSpec
from gpufleet.status import ACTIVE_QUEUE, JobStatus, check_reopen, check_transition
from gpufleet.store import cursor as cursor_codec
from gpufleet.store import fencing
from gpufleet.store.dynamo import (
    cancellation_reasons,
    error_code,
    marshal,
    marshal_value,
    marshal_values,
    paginate,
    reraise,
    set_clause,
    translate_errors,
    unmarshal,
)
from gpufleet.store.fencing import current_item, epoch_condition, job_key, stale
from gpufleet.store.guard import Guard
from gpufleet.tables import (
    JOB_META,
    TableNames,
    active_pk,
    active_sk,
    attempt_sk,
    event_sk,
    job_pk,
    list_sk,
    pending_partition,
    pending_sk,
    tenant_list_pk,
    user_list_pk,
)

if TYPE_CHECKING:
    from gpufleet.safety.profile import FrozenSafety

#: Attributes that are storage plumbing, not part of the job as callers see it.
INTERNAL_ATTRS = frozenset(
    {
        "pk",
        "sk",
        "gsi1pk",
        "gsi1sk",
        "gsi2pk",
        "gsi2sk",
        "gsi3pk",
        "gsi3sk",
        "gsi4pk",
        "gsi4sk",
        "pending_sort",
        "active_part",
        "active_sort",
        "type",
    }
)
#: The attributes of a job item as :func:`build_job` makes it (the API's ``PutItem``; infra.grants binds that put to
#: these, :data:`SUBMIT_ATTRIBUTES` and the timeline event's).
JOB_ITEM_ATTRIBUTES = ("pk", "sk", "type", "job_id", "tenant", "team", "user", "owner_path", "status", "spec", "priority",
                       "created_at", "updated_at", "current_epoch", "attempt_count", "preemptions", "system_failures",
                       "cancel_requested", "gsi1pk", "gsi1sk", "gsi2pk", "gsi2sk", "pending_sort", "active_part",
                       "active_sort", "gsi4pk", "gsi4sk")
#: What a submit may add to the job item (:func:`create_job`'s ``attrs``): a retry's ``retry_of``, a job array
#: element's ``array_id``/``array_index``, the job's W3C ``traceparent``, the content hash its model runs
#: (``model_hash``, gpufleet.store.model_catalog).
SUBMIT_ATTRIBUTES = ("retry_of", "array_id", "array_index", "traceparent", "model_hash")
#: What every status move (:func:`transition_update`) names on the job item besides its ``extra``, ``remove``,
#: epoch fence and guard: the key, ``status``, ``updated_at`` and the sparse indexes' keys (set or removed).
TRANSITION_ATTRIBUTES = ("pk", "sk", "status", "updated_at", "gsi3pk", "gsi3sk", "gsi4pk", "gsi4sk")
#: What a move to PENDING copies into gsi3's sort key (read, but IAM counts every name of the update expression).
TO_PENDING_ATTRIBUTES = ("pending_sort",)
#: What a move into :data:`gpufleet.status.ACTIVE_QUEUE` copies into gsi4's keys (read, named as above).
TO_ACTIVE_ATTRIBUTES = ("active_part", "active_sort")
#: What :func:`request_cancel` names: its flag and time, conditioned on the status it read.
CANCEL_REQUEST_ATTRIBUTES = ("pk", "sk", "status", "cancel_requested", "cancel_requested_at", "updated_at")
MAX_LIST_LIMIT = 100
#: Upper bound of items examined per list call (status filters); the cursor resumes after them.
MAX_EXAMINED = 1000
MAX_EVENTS = 1000
_EVENT_COUNTER = itertools.count()



def public(item: dict[str, Any]) -> dict[str, Any]:
    """The job without key/index plumbing."""
    return {k: v for k, v in item.items() if k not in INTERNAL_ATTRS}


# ---------------------------------------------------------------- building items (pure)


def build_job(job_id: str, tenant: str, team: str, user: str, spec: dict[str, Any], now: float) -> dict[str, Any]:
    """The job item as stored at submission (QUEUED), with its list and soft-quota index keys.

    ``spec`` is stored as given (the API stores ``JobSpec.model_dump(mode="json", exclude_none=True)``);
    it must validate as a :class:`JobSpec`, whose ``priority`` (default included) the item copies."""
    created = iso(now)
    priority = JobSpec.model_validate(spec).priority
    return {
        "pk": job_pk(job_id),
        "sk": JOB_META,
        "type": "job",
        "job_id": job_id,
        "tenant": tenant,
        "team": team,
        "user": user,
        "owner_path": f"{tenant}/{team}/{user}",
        "status": JobStatus.QUEUED.value,
        "spec": spec,
        "priority": priority,
        "created_at": created,
        "updated_at": created,
        "current_epoch": 0,
        "attempt_count": 0,
        "preemptions": 0,
        "system_failures": 0,
        "cancel_requested": False,
        "gsi1pk": tenant_list_pk(tenant),
        "gsi1sk": list_sk(created, job_id),
        "gsi2pk": user_list_pk(tenant, user),
        "gsi2sk": list_sk(created, job_id),
        # Precomputed sort keys the sparse indexes copy in when the job enters their status set.
        "pending_sort": pending_sk(priority, created, job_id),
        "active_part": active_pk(tenant, team),
        "active_sort": active_sk(user, created, job_id),
        "gsi4pk": active_pk(tenant, team),
        "gsi4sk": active_sk(user, created, job_id),
    }


def build_event(job_id: str, kind: str, now: float, detail: dict[str, Any] | None = None) -> dict[str, Any]:
    """An event item. The sequence part orders events within a millisecond (microseconds, then a
    per-process counter); events written by different processes in the same microsecond may tie-break
    either way."""
    ts = iso(now)
    seq = (int(now * 1_000_000) % 1000) * 1000 + next(_EVENT_COUNTER) % 1000
    return {
        "pk": job_pk(job_id),
        "sk": event_sk(ts, seq),
        "type": "event",
        "job_id": job_id,
        "ts": ts,
        "kind": kind,
        "detail": detail or {},
    }


def _event_put(table: str, event: dict[str, Any]) -> dict[str, Any]:
    return {
        "Put": {
            "TableName": table,
            "Item": marshal(event),
            "ConditionExpression": "attribute_not_exists(pk)",
        }
    }


def transition_update(
    table: str,
    job_id: str,
    from_statuses: Iterable[JobStatus | str],
    to_status: JobStatus | str,
    now: float,
    extra: dict[str, Any] | None = None,
    remove: Sequence[str] = (),
    *,
    epoch: int | None = None,
    guard: Guard | None = None,
    operator: bool = False,
) -> dict[str, Any]:
    """The ``TransactWriteItems`` Update for a status change (use inside your own transaction).

    Validates every ``from → to`` against the transition table (raises
    :class:`InvalidTransition` otherwise), conditions the write on the current
    status being one of ``from_statuses``, sets ``extra`` attributes, removes
    ``remove`` attributes, and maintains gsi3 / gsi4 membership.

    The one fenced transition: ``epoch`` ANDs in ``current_epoch == epoch`` (``0`` also
    matches a job that has never had an epoch), and ``guard`` (a
    :class:`~gpufleet.store.guard.Guard`) is ANDed in as well. ``operator`` checks the move against
    the operator recovery table (:data:`gpufleet.status.REOPEN`) instead of the workflow's.
    """
    to = JobStatus(to_status)
    froms = [JobStatus(s) for s in from_statuses]
    if not froms:
        raise ValueError("from_statuses must not be empty")
    for f in froms:
        (check_reopen if operator else check_transition)(f, to)
    names: dict[str, str] = {"#st": "status", "#ua": "updated_at"}
    values: dict[str, Any] = {":to": marshal_value(to.value), ":now": marshal_value(iso(now))}
    sets = ["#st = :to", "#ua = :now"]
    removes = list(remove)
    if to is JobStatus.PENDING:
        values[":pp"] = marshal_value(pending_partition(job_id))
        sets += ["gsi3pk = :pp", "gsi3sk = pending_sort"]
    else:
        removes += ["gsi3pk", "gsi3sk"]
    if to in ACTIVE_QUEUE:
        sets += ["gsi4pk = active_part", "gsi4sk = active_sort"]
    else:
        removes += ["gsi4pk", "gsi4sk"]
    sets += set_clause(extra or {}, names, values)
    for i, f in enumerate(froms):
        values[f":f{i}"] = marshal_value(f.value)
    cond = "attribute_exists(pk) AND #st IN (" + ", ".join(f":f{i}" for i in range(len(froms))) + ")"
    if epoch is not None:
        fence, fence_names, fence_values = epoch_condition(int(epoch), missing_is_zero=True)
        names.update(fence_names)
        values.update(fence_values)
        cond += f" AND {fence}"
    if guard is not None:
        extra, guard_names, guard_values = guard.expression()
        if extra:
            cond += f" AND ({extra})"
            names.update(guard_names)
            values.update(marshal_values(guard_values))
    expr = "SET " + ", ".join(sets)
    if removes:
        rnames = []
        for i, r in enumerate(dict.fromkeys(removes)):
            names[f"#r{i}"] = r
            rnames.append(f"#r{i}")
        expr += " REMOVE " + ", ".join(rnames)
    return {
        "Update": {
            "TableName": table,
            "Key": job_key(job_id),
            "UpdateExpression": expr,
            "ConditionExpression": cond,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


# ---------------------------------------------------------------- reads


def get_job(client, table: str, job_id: str, tenant: str | None = None, *, consistent: bool = True) -> dict[str, Any]:
    """The job item (with plumbing attributes). ``tenant`` given → another tenant's job is NotFound too."""
    with translate_errors():
        got = client.get_item(TableName=table, Key=job_key(job_id), ConsistentRead=consistent)
    item = unmarshal(got.get("Item"))
    if item is None or (tenant is not None and item.get("tenant") != tenant):
        raise NotFound(f"job {job_id} not found")
    return item


def get_attempt(client, table: str, job_id: str, epoch: int) -> dict[str, Any] | None:
    """The attempt item of ``epoch`` (written when the attempt was placed), or ``None``."""
    with translate_errors():
        got = client.get_item(
            TableName=table, Key=marshal({"pk": job_pk(job_id), "sk": attempt_sk(epoch)}), ConsistentRead=True
        )
    return unmarshal(got.get("Item"))


def list_events(client, table: str, job_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
    """The job's timeline, oldest first (at most :data:`MAX_EVENTS`). Tenant-scoped like :func:`get_job`."""
    get_job(client, table, job_id, tenant)
    with translate_errors():
        return [
            {"ts": it["ts"], "type": it["kind"], "detail": it.get("detail") or {}}
            for it in paginate(
                client.query,
                limit=MAX_EVENTS,
                TableName=table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
                ExpressionAttributeValues={":pk": marshal_value(job_pk(job_id)), ":p": marshal_value("EVENT#")},
                ConsistentRead=True,
            )
        ]


def list_deliveries(client, table: str, job_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
    """The job's webhook delivery log (``DELIVERY#`` items), oldest first, without key attributes."""
    get_job(client, table, job_id, tenant)
    with translate_errors():
        return [
            {k: v for k, v in it.items() if k not in ("pk", "sk")}
            for it in paginate(
                client.query,
                TableName=table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
                ExpressionAttributeValues={":pk": marshal_value(job_pk(job_id)), ":p": marshal_value("DELIVERY#")},
            )
        ]


def iso_bound(value: datetime | float | str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return iso(value.timestamp())
    if isinstance(value, (int, float)):
        return iso(float(value))
    return value


def list_jobs(
    client,
    table: str,
    *,
    tenant: str,
    secret: bytes,
    user: str | None = None,
    statuses: Sequence[JobStatus | str] | None = None,
    created_after: datetime | float | str | None = None,
    created_before: datetime | float | str | None = None,
    limit: int = 20,
    cursor: str | None = None,
    array_id: str | None = None,
    labels: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of jobs, newest first, and the cursor of the next page (``None`` at the end).
    ``array_id`` / ``labels`` (every pair must match the spec's labels) filter like ``statuses``."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValueError(f"limit must be 1..{MAX_LIST_LIMIT}")
    status_values = sorted({JobStatus(s).value for s in statuses or ()})
    lo, hi = iso_bound(created_after), iso_bound(created_before)
    keep = item_filter(status_values, array_id, labels)
    if user is None:
        index, hk, rk, pk_value = "gsi1", "gsi1pk", "gsi1sk", tenant_list_pk(tenant)
    else:
        index, hk, rk, pk_value = "gsi2", "gsi2pk", "gsi2sk", user_list_pk(tenant, user)
    scope = {"t": tenant, "u": user, "s": status_values, "a": lo, "b": hi,
             **({"r": array_id} if array_id else {}), **({"l": sorted((labels or {}).items())} if labels else {})}
    filtered = bool(status_values or array_id or labels)
    names = {"#hk": hk}
    values: dict[str, Any] = {":hk": marshal_value(pk_value)}
    kce = "#hk = :hk"
    # created_at#job_id sorts after the bare created_at: ">= lo" includes lo, "<= hi" excludes hi.
    if lo or hi:
        names["#rk"] = rk
    if lo and hi:
        kce += " AND #rk BETWEEN :lo AND :hi"
        values.update({":lo": marshal_value(lo), ":hi": marshal_value(hi)})
    elif lo:
        kce += " AND #rk >= :lo"
        values[":lo"] = marshal_value(lo)
    elif hi:
        kce += " AND #rk <= :hi"
        values[":hi"] = marshal_value(hi)
    kwargs: dict[str, Any] = {
        "TableName": table,
        "IndexName": index,
        "KeyConditionExpression": kce,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
        "ScanIndexForward": False,
        # One extra item tells whether another page exists without a trailing empty page.
        "Limit": limit + 1 if not filtered else min(MAX_LIST_LIMIT, 4 * limit),
    }
    if cursor:
        pos = cursor_codec.decode(cursor, scope, secret)
        try:
            kwargs["ExclusiveStartKey"] = {
                hk: {"S": pos["hk"]},
                rk: {"S": pos["rk"]},
                "pk": {"S": pos["pk"]},
                "sk": {"S": JOB_META},
            }
        except (KeyError, TypeError) as err:
            raise BadRequest("cursor is not valid", param="cursor") from err

    def position(it: dict[str, Any]) -> dict[str, str]:
        return {"hk": it[hk], "rk": it[rk], "pk": it["pk"]}

    out: list[dict[str, Any]] = []
    examined = 0
    while True:
        with translate_errors():
            resp = client.query(**kwargs)
        items = [unmarshal(i) for i in resp.get("Items", [])]
        lek = resp.get("LastEvaluatedKey")
        for idx, it in enumerate(items):
            examined += 1
            if not keep(it):
                continue
            out.append(public(it))
            if len(out) >= limit:
                more = idx < len(items) - 1 or lek is not None
                return out, (cursor_codec.encode(position(it), scope, secret) if more else None)
        if not lek:
            return out, None
        if examined >= MAX_EXAMINED:
            pos = {"hk": lek[hk]["S"], "rk": lek[rk]["S"], "pk": lek["pk"]["S"]}
            return out, cursor_codec.encode(pos, scope, secret)
        kwargs["ExclusiveStartKey"] = lek


def item_filter(statuses: Sequence[str], array_id: str | None, labels: dict[str, str] | None):
    """The predicate of a list's filters on a job item (statuses: any of; labels: all of)."""
    wanted = set(statuses)

    def keep(it: dict[str, Any]) -> bool:
        if wanted and it.get("status") not in wanted:
            return False
        if array_id and it.get("array_id") != array_id:
            return False
        have = (it.get("spec") or {}).get("labels") or {}
        return all(have.get(k) == v for k, v in (labels or {}).items())

    return keep


def count_active(
    client, table: str, tenant: str, team: str, user: str, *, cap_user: int | None = None, cap_team: int | None = None
) -> tuple[int, int]:
    """(the user's, the team's) jobs in ACTIVE_QUEUE statuses, from the sparse gsi4 (soft quota).

    A cap stops counting once it is reached (the count is then ``cap``), so a
    check against a limit reads at most ``limit`` index entries.
    """

    def count(kce: str, values: dict[str, Any], cap: int | None) -> int:
        total = 0
        kwargs: dict[str, Any] = {
            "TableName": table,
            "IndexName": "gsi4",
            "KeyConditionExpression": kce,
            "ExpressionAttributeValues": values,
            "Select": "COUNT",
        }
        while True:
            if cap is not None:
                kwargs["Limit"] = max(1, cap - total)
            with translate_errors():
                resp = client.query(**kwargs)
            total += int(resp.get("Count", 0))
            if not resp.get("LastEvaluatedKey") or (cap is not None and total >= cap):
                return total if cap is None else min(total, cap)
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    pk = marshal_value(active_pk(tenant, team))
    user_n = count("gsi4pk = :pk AND begins_with(gsi4sk, :u)", {":pk": pk, ":u": marshal_value(f"{user}#")}, cap_user)
    team_n = count("gsi4pk = :pk", {":pk": pk}, cap_team)
    return user_n, team_n


# ---------------------------------------------------------------- writes


#: Most jobs one :func:`create_jobs` writes: two items each (job, ``created`` event) plus the
#: idempotency completion stay within DynamoDB's 100 items per transaction.
MAX_JOBS_PER_TRANSACTION = 48


def create_job(
    client,
    tables: TableNames,
    *,
    tenant: str,
    team: str,
    user: str,
    spec: dict[str, Any],
    job_id: str | None = None,
    clock: Clock,
    extra_items: Sequence[dict[str, Any]] | Callable[[dict[str, Any]], Sequence[dict[str, Any]]] = (),
    attrs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a new QUEUED job, its ``created`` event and ``extra_items`` in one transaction.

    ``attrs`` are extra attributes of the job item (``retry_of``; ``array_id``/``array_index``).
    ``extra_items`` may be a callable given the job item (so a caller can
    store a response rendered from it, e.g. the idempotency completion).
    Returns the stored item. Raises :class:`Conflict` if the id exists and
    :class:`IdempotencyInFlight` if an extra item's condition failed.
    """
    from gpufleet.ids import new_job_id

    job_id = job_id or new_job_id(int(clock.now() * 1000))

    def extras(items: list[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        return list(extra_items(items[0]) if callable(extra_items) else extra_items)

    return create_jobs(client, tables, tenant=tenant, team=team, user=user, jobs=[(job_id, spec, attrs or {})],
                       clock=clock, extra_items=extras)[0]


def create_jobs(
    client,
    tables: TableNames,
    *,
    tenant: str,
    team: str,
    user: str,
    jobs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]],
    clock: Clock,
    extra_items: Callable[[list[dict[str, Any]]], Sequence[dict[str, Any]]] | Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Write several new QUEUED jobs (``(job_id, spec, attrs)``, at most :data:`MAX_JOBS_PER_TRANSACTION`),
    their ``created`` events and ``extra_items`` (a callable is given the job items) in ONE transaction:
    all land or none (a job array). Errors as :func:`create_job`."""
    if not 1 <= len(jobs) <= MAX_JOBS_PER_TRANSACTION:
        raise ValueError(f"1..{MAX_JOBS_PER_TRANSACTION} jobs per transaction")
    now = clock.now()
    items = [{**build_job(job_id, tenant, team, user, spec, now), **attrs} for job_id, spec, attrs in jobs]
    extras = list(extra_items(items) if callable(extra_items) else extra_items)
    tx: list[dict[str, Any]] = []
    for item, (job_id, _spec, attrs) in zip(items, jobs, strict=True):
        event = build_event(job_id, "created", now, {"status": JobStatus.QUEUED.value, **attrs})
        try:
            stored = marshal(item)
        except decimal.DecimalException as err:
            raise ValidationFailed(
                "a number in the spec is outside what can be stored (magnitude 1e-130 to 1e125, 38 digits)"
            ) from err
        tx += [
            {"Put": {"TableName": tables.jobs, "Item": stored, "ConditionExpression": "attribute_not_exists(pk)"}},
            _event_put(tables.jobs, event),
        ]
    tx += extras
    try:
        client.transact_write_items(TransactItems=tx)
    except ClientError as err:
        if error_code(err) != "TransactionCanceledException":
            reraise(err)
        reasons = cancellation_reasons(err)
        if any(r == "ConditionalCheckFailed" for r in reasons[: 2 * len(jobs)]):
            raise Conflict(f"job {jobs[0][0]} already exists") from err
        raise IdempotencyInFlight("the request lost its claim on the Idempotency-Key; retry") from err
    return items


def list_attempts(client, table: str, job_id: str) -> list[dict[str, Any]]:
    """The job's attempt items (one per epoch the scheduler placed), oldest first."""
    with translate_errors():
        return list(paginate(
            client.query,
            TableName=table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
            ExpressionAttributeValues={":pk": marshal_value(job_pk(job_id)), ":p": marshal_value("ATTEMPT#")},
            ConsistentRead=True,
        ))


def _raise_for_failed_transition(
    client, table: str, job_id: str, to: JobStatus, epoch: int | None, err: Exception
) -> None:
    """Say why a conditional status change did not land: stale epoch, wrong status, or the extra condition.
    Reads only the job's status and epoch (the node API, whose role may not read whole job items, moves
    its attempts SCHEDULED -> RUNNING through here)."""
    item = current_item(client, table, job_id, fields=("status", "current_epoch"))
    if item is None:
        raise NotFound(f"job {job_id} not found") from err
    if epoch is not None:
        current = int(item.get("current_epoch", 0))
        if current != epoch:
            raise stale(job_id, epoch, current) from err
    raise InvalidTransition(
        f"cannot move job {job_id} from {item.get('status')} to {to.value}", current_status=item.get("status")
    ) from err


def transition(
    client,
    table: str,
    job_id: str,
    from_statuses: Iterable[JobStatus | str],
    to_status: JobStatus | str,
    extra: dict[str, Any] | None = None,
    *,
    clock: Clock,
    detail: dict[str, Any] | None = None,
    remove: Sequence[str] = (),
    epoch: int | None = None,
    guard: Guard | None = None,
    read_back: bool = True,
    operator: bool = False,
) -> dict[str, Any]:
    """Move the job to ``to_status`` if its status is one of ``from_statuses``; append a ``status`` event.
    ``read_back`` False: return ``{}`` instead of reading the job after the write.

    The one status transition of the code base, fenced or not: ``epoch`` conditions the
    write on ``current_epoch == epoch`` (and is recorded in the event), ``guard``
    is ANDed in (see :func:`transition_update`). Returns the job after the write. Raises
    :class:`StaleEpoch` when ``epoch`` is not current, :class:`InvalidTransition` (with
    ``current_status``) when the status or the guard fails or the move is not in the
    table, :class:`NotFound` when the job does not exist.
    """
    now = clock.now()
    froms = [JobStatus(s) for s in from_statuses]
    to = JobStatus(to_status)
    upd = transition_update(
        table, job_id, froms, to, now, extra, remove,
        epoch=epoch, guard=guard, operator=operator,
    )
    fence = {"epoch": epoch} if epoch is not None else {}
    event = build_event(
        job_id, "status", now, {"to": to.value, "from": [f.value for f in froms], **fence, **(detail or {})}
    )
    try:
        client.transact_write_items(TransactItems=[upd, _event_put(table, event)])
    except ClientError as err:
        if error_code(err) != "TransactionCanceledException":
            reraise(err)
        _raise_for_failed_transition(client, table, job_id, to, epoch, err)
    return get_job(client, table, job_id) if read_back else {}


def append_event(
    client,
    table: str,
    job_id: str,
    kind: str,
    detail: dict[str, Any] | None = None,
    *,
    clock: Clock,
) -> dict[str, Any]:
    """Append an event to the job's timeline (no status change). Returns the event."""
    event = build_event(job_id, kind, clock.now(), detail)
    with translate_errors():
        client.put_item(TableName=table, Item=marshal(event), ConditionExpression="attribute_not_exists(pk)")
    return {"ts": event["ts"], "type": kind, "detail": event["detail"]}


def request_cancel(
    client,
    table: str,
    job_id: str,
    tenant: str | None = None,
    *,
    clock: Clock,
    requested_by: str | None = None,
) -> dict[str, Any]:
    """Mark the job ``cancel_requested`` (conditional write + event); idempotent. Returns the job."""
    for _ in range(5):
        item = get_job(client, table, job_id, tenant)
        if item.get("cancel_requested"):
            return item
        status = JobStatus(item["status"])
        if status.is_terminal():
            raise InvalidTransition(f"job {job_id} is already {status.value}", current_status=status.value)
        now = clock.now()
        upd = {
            "Update": {
                "TableName": table,
                "Key": job_key(job_id),
                "UpdateExpression": "SET cancel_requested = :t, cancel_requested_at = :now, updated_at = :now",
                "ConditionExpression": "#st = :st AND (attribute_not_exists(cancel_requested) OR cancel_requested = :f)",
                "ExpressionAttributeNames": {"#st": "status"},
                "ExpressionAttributeValues": {
                    ":t": {"BOOL": True},
                    ":f": {"BOOL": False},
                    ":now": marshal_value(iso(now)),
                    ":st": marshal_value(status.value),
                },
            }
        }
        event = build_event(job_id, "cancel_requested", now, {"status": status.value, "by": requested_by})
        try:
            client.transact_write_items(TransactItems=[upd, _event_put(table, event)])
        except ClientError as err:
            if error_code(err) != "TransactionCanceledException":
                reraise(err)
            continue  # status moved or someone else cancelled: look again
        return get_job(client, table, job_id)
    raise Conflict(f"job {job_id} kept changing while cancelling; retry")


# ---------------------------------------------------------------- the store object


class JobStore(Protocol):
    """The job item and its timeline, as the lifecycle and the API use them (see the module contract)."""

    def create(
        self, *, tenant: str, team: str, user: str, spec: dict[str, Any], job_id: str | None = None,
        extra_items: Sequence[dict[str, Any]] | Callable[[dict[str, Any]], Sequence[dict[str, Any]]] = (),
        attrs: dict[str, Any] | None = None,
    ) -> dict[str, Any]: ...

    def get(self, job_id: str, tenant: str | None = None, *, consistent: bool = True) -> dict[str, Any]: ...

    def get_record(self, job_id: str, tenant: str | None = None) -> JobRecord: ...

    def get_attempt(self, job_id: str, epoch: int) -> dict[str, Any] | None: ...

    def attempts(self, job_id: str) -> list[dict[str, Any]]: ...

    def create_many(
        self, *, tenant: str, team: str, user: str, jobs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]],
        extra_items: Any = (),
    ) -> list[dict[str, Any]]:
        """Several jobs (a job array) in one all-or-nothing write (:func:`create_jobs`)."""
        ...

    def events(self, job_id: str, tenant: str | None = None) -> list[dict[str, Any]]: ...

    def deliveries(self, job_id: str, tenant: str | None = None) -> list[dict[str, Any]]: ...

    def list(
        self, *, tenant: str, secret: bytes, user: str | None = None, statuses: Sequence[JobStatus | str] | None = None,
        created_after: datetime | float | str | None = None, created_before: datetime | float | str | None = None,
        limit: int = 20, cursor: str | None = None, array_id: str | None = None, labels: dict[str, str] | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the tenant's (or one user's) jobs, newest first, and the next page's signed cursor."""
        ...

    def count_active(
        self, tenant: str, team: str, user: str, *, cap_user: int | None = None, cap_team: int | None = None
    ) -> tuple[int, int]:
        """(the user's, the team's) jobs QUEUED/PENDING/SCHEDULED, each count stopping at its cap."""
        ...

    def transition(
        self, job_id: str, from_statuses: Iterable[JobStatus | str], to_status: JobStatus | str,
        extra: dict[str, Any] | None = None, *, detail: dict[str, Any] | None = None, remove: Sequence[str] = (),
        epoch: int | None = None, guard: Guard | None = None, operator: bool = False,
    ) -> dict[str, Any]: ...

    def append_event(self, job_id: str, kind: str, detail: dict[str, Any] | None = None) -> dict[str, Any]: ...

    def request_cancel(
        self, job_id: str, tenant: str | None = None, *, requested_by: str | None = None
    ) -> dict[str, Any]: ...

    def fenced_update(
        self, job_id: str, epoch: int, set_attrs: dict[str, Any], *,
        guard: Guard | None = None,
    ) -> dict[str, Any]: ...

    def issue_epoch(self, job_id: str, observed_epoch: int, extra: dict[str, Any] | None = None) -> int: ...

    def freeze_safety(self, job_id: str, safety: FrozenSafety) -> FrozenSafety: ...


class DynamoJobStore:
    """:class:`JobStore` on the jobs table (the module's functions, bound to a client, table and clock)."""

    def __init__(self, client, tables: TableNames, clock: Clock) -> None:
        self.client = client
        self.tables = tables
        self.table = tables.jobs
        self.clock = clock

    def create(self, *, tenant, team, user, spec, job_id=None, extra_items=(), attrs=None):
        return create_job(self.client, self.tables, tenant=tenant, team=team, user=user, spec=spec,
                          job_id=job_id, clock=self.clock, extra_items=extra_items, attrs=attrs)

    def get(self, job_id, tenant=None, *, consistent=True):
        return get_job(self.client, self.table, job_id, tenant, consistent=consistent)

    def get_record(self, job_id, tenant=None):
        return JobRecord.from_item(get_job(self.client, self.table, job_id, tenant))

    def get_attempt(self, job_id, epoch):
        return get_attempt(self.client, self.table, job_id, epoch)

    def attempts(self, job_id):
        return list_attempts(self.client, self.table, job_id)

    def create_many(self, *, tenant, team, user, jobs, extra_items=()):
        return create_jobs(self.client, self.tables, tenant=tenant, team=team, user=user, jobs=jobs,
                           clock=self.clock, extra_items=extra_items)

    def events(self, job_id, tenant=None):
        return list_events(self.client, self.table, job_id, tenant)

    def deliveries(self, job_id, tenant=None):
        return list_deliveries(self.client, self.table, job_id, tenant)

    def list(self, *, tenant, secret, user=None, statuses=None, created_after=None, created_before=None,
             limit=20, cursor=None, array_id=None, labels=None):
        return list_jobs(self.client, self.table, tenant=tenant, secret=secret, user=user, statuses=statuses,
                         created_after=created_after, created_before=created_before, limit=limit, cursor=cursor,
                         array_id=array_id, labels=labels)

    def count_active(self, tenant, team, user, *, cap_user=None, cap_team=None):
        return count_active(self.client, self.table, tenant, team, user, cap_user=cap_user, cap_team=cap_team)

    def transition(self, job_id, from_statuses, to_status, extra=None, *, detail=None, remove=(), epoch=None,
                   guard=None, operator=False):
        return transition(self.client, self.table, job_id, from_statuses, to_status, extra, clock=self.clock,
                          detail=detail, remove=remove, epoch=epoch, guard=guard, operator=operator)

    def append_event(self, job_id, kind, detail=None):
        return append_event(self.client, self.table, job_id, kind, detail, clock=self.clock)

    def request_cancel(self, job_id, tenant=None, *, requested_by=None):
        return request_cancel(self.client, self.table, job_id, tenant, clock=self.clock, requested_by=requested_by)

    def fenced_update(self, job_id, epoch, set_attrs, *, guard=None):
        return fencing.fenced_update(self.client, self.table, job_id, epoch, set_attrs,
                                     guard=guard)

    def issue_epoch(self, job_id, observed_epoch, extra=None):
        return fencing.issue_epoch(self.client, self.table, job_id, observed_epoch, extra)

    def freeze_safety(self, job_id, safety):
        from gpufleet.store import safety_profiles  # the safety package is heavy; only CheckPrompt needs it

        return safety_profiles.freeze_on_job(self.client, self.table, job_id, safety)
