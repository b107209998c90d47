"""Quota escrow of a scheduler commit lane (control table, ``ESCROW#<lane>`` / ``ESCROW``).

Why: every placement charges every level of its owner's quota path (``acme``, ``acme/team``, ...), so with the
quota items in each placement transaction every transaction of a tenant touches its root item, and concurrent
transactions on one item cancel each other (``TransactionConflict``): commits could only go one at a time. A lane
instead takes the quota its placements need from the quota items up front, in a few transactions, into its own
escrow item; its placement transactions then draw on the escrow item, which no other lane touches; what is left is
given back at the end.

Invariant (per quota path ``P`` and GPU type ``t``, ``*`` included): the quota item's ``used_<t>`` = the charges
of the live attempts under ``P`` + the sum over lanes of their escrow ``e|P|t``. So a quota level's limit holds
at every moment, whatever runs concurrently:

- :func:`reserve`: per path, ``used_<t> += n`` conditioned on ``used_<t> <= limit - n`` (where the level has a
  limit), and the lane's ``e|P|t += n``, in one transaction (up to :data:`RESERVE_CHUNK` paths each); when a level
  is short, the chunk's limited levels are read and what they have left is reserved in one transaction (on the same
  conditions); if that too is cancelled (they moved meanwhile), one path at a time, each granted what is left,
  possibly nothing;
- a placement's transaction (``placements._shared_items`` with ``lane``): ``e|P|t -= m`` conditioned on
  ``e|P|t >= m``, for every level and type it charges — the quota items are not in it;
- :func:`give_back`: ``used_<t> -= n`` and ``e|P|t -= n`` (conditioned on ``e|P|t >= n``) in one transaction;
- the lifecycle's release lowers ``used_<t>`` by the attempt's charge, as before.

A lane that dies between reserving and giving back leaves its escrow counted as used (quota held, never
overdrawn); the next pass of that lane's shard gives it back first (:func:`read`). A lane is used by one pass at a
time: its name carries its shard (:meth:`gpufleet.scheduler.shards.PassShard.lanes`), whose lease the pass holds.

``TransactionConflict`` (another transaction on a quota item at that moment) is retried with jittered backoff up
to :data:`CONFLICT_RETRIES` times; AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.errors import TransientError
from gpufleet.scheduler.model import QuotaNode
from gpufleet.store.dynamo import cancellation_reasons, error_code, marshal, translate_errors, unmarshal
from gpufleet.store.quotas import usage_attr, usage_from_item
from gpufleet.tables import DIR_QUOTAS, DIRECTORY_ATTR, ESCROW_SK, QUOTA_SK, TableNames, escrow_pk, quota_pk

#: quota path → GPU type (``*`` = all types) → milli
Amounts = dict[str, dict[str, int]]

#: quota paths per reserve / give-back transaction (each path's quota item, plus the lane's escrow item once)
RESERVE_CHUNK = 90
#: (path, GPU type) counters per escrow update: its update and condition expressions stay within DynamoDB's 4 KB
#: per expression (``#e149 >= :m149 AND `` is 20 characters)
MAX_COUNTERS = 150
#: how many times a transaction cancelled only by ``TransactionConflict`` is tried again
CONFLICT_RETRIES = 8
_SEP = "|"


def escrow_attr(path: str, gpu_type: str) -> str:
    """The escrow item's counter of ``gpu_type`` under quota path ``path``."""
    return f"e{_SEP}{path}{_SEP}{gpu_type}"


def amounts_from_item(item: dict[str, Any] | None) -> Amounts:
    """The non-zero counters of an escrow item."""
    out: Amounts = {}
    for k, v in (item or {}).items():
        if k.startswith("e" + _SEP) and int(v):
            _, path, t = k.split(_SEP, 2)
            out.setdefault(path, {})[t] = int(v)
    return out


def limit_of(quotas: dict[str, QuotaNode], path: str, gpu_type: str) -> int | None:
    """The limit a placement transaction checks for ``gpu_type`` at ``path`` (None: no limit), as ``_shared_items``."""
    q = quotas.get(path)
    return q.limit(gpu_type) if q is not None else None


def is_conflict(err: ClientError) -> bool:
    """A cancellation caused only by concurrent transactions on the same items (worth trying again as is)."""
    code = error_code(err)
    if code == "TransactionConflictException":
        return True
    if code != "TransactionCanceledException":
        return False
    reasons = [r for r in cancellation_reasons(err) if r not in ("None", "")]
    return bool(reasons) and all(r == "TransactionConflict" for r in reasons)


def retry_conflicts(call: Callable[[], Any], *, retries: int = CONFLICT_RETRIES, base_s: float = 0.02,
                    sleep: Callable[[float], None] = time.sleep) -> Any:
    """``call()``, tried again with full-jitter backoff while it fails only by ``TransactionConflict``."""
    for attempt in range(retries + 1):
        try:
            return call()
        except ClientError as err:
            if not is_conflict(err) or attempt == retries:
                raise
            sleep(random.uniform(0, base_s * 2 ** attempt))
    raise AssertionError("unreachable")


def _quota_update(names: TableNames, path: str, per_type: dict[str, int], quotas: dict[str, QuotaNode] | None) -> dict:
    """``used_<t> += n`` on a quota item (listed in the directory), conditioned on each limit when ``quotas``."""
    nm, vals, adds, conds = {"#d": DIRECTORY_ATTR}, {":dir": {"S": DIR_QUOTAS}}, [], []
    for i, (t, n) in enumerate(sorted(per_type.items())):
        nm[f"#u{i}"] = usage_attr(t)
        vals[f":n{i}"] = {"N": str(n)}
        adds.append(f"#u{i} :n{i}")
        lim = limit_of(quotas, path, t) if quotas is not None else None
        if lim is not None:
            vals[f":c{i}"] = {"N": str(lim - n)}
            conds.append(f"(attribute_not_exists(#u{i}) OR #u{i} <= :c{i})")
    u = {"TableName": names.control, "Key": marshal({"pk": quota_pk(path), "sk": QUOTA_SK}),
         "UpdateExpression": "SET #d = :dir ADD " + ", ".join(adds), "ExpressionAttributeNames": nm,
         "ExpressionAttributeValues": vals}
    if conds:
        u["ConditionExpression"] = " AND ".join(conds)
    return {"Update": u}


def escrow_update(names: TableNames, lane: str, amounts: Amounts, *, sign: int, checked: bool) -> dict:
    """``e|P|t += sign·n`` on the lane's escrow item; ``checked``: each only if ``e|P|t >= n`` (never negative)."""
    nm, vals, adds, conds = {}, {}, [], []
    i = 0
    for path, per_type in sorted(amounts.items()):
        for t, n in sorted(per_type.items()):
            nm[f"#e{i}"] = escrow_attr(path, t)
            vals[f":e{i}"] = {"N": str(sign * n)}
            adds.append(f"#e{i} :e{i}")
            if checked:
                vals[f":m{i}"] = {"N": str(n)}
                conds.append(f"#e{i} >= :m{i}")
            i += 1
    u = {"TableName": names.control, "Key": marshal({"pk": escrow_pk(lane), "sk": ESCROW_SK}),
         "UpdateExpression": "ADD " + ", ".join(adds), "ExpressionAttributeNames": nm,
         "ExpressionAttributeValues": vals}
    if conds:
        u["ConditionExpression"] = " AND ".join(conds)
    return {"Update": u}


def _nonzero(amounts: Amounts) -> Amounts:
    return {p: {t: n for t, n in pt.items() if n > 0} for p, pt in amounts.items() if any(n > 0 for n in pt.values())}


def chunks(amounts: Amounts) -> list[Amounts]:
    """``amounts`` cut, in path order, into transactions of at most :data:`RESERVE_CHUNK` paths and
    :data:`MAX_COUNTERS` counters."""
    out: list[Amounts] = []
    cur: Amounts = {}
    counters = 0
    for path in sorted(amounts):
        n = len(amounts[path])
        if cur and (len(cur) >= RESERVE_CHUNK or counters + n > MAX_COUNTERS):
            out.append(cur)
            cur, counters = {}, 0
        cur[path] = amounts[path]
        counters += n
    if cur:
        out.append(cur)
    return out


def read(client, names: TableNames, lane: str) -> Amounts:
    """What the lane's escrow holds (left by a pass that died before giving it back)."""
    with translate_errors():
        got = client.get_item(TableName=names.control, Key=marshal({"pk": escrow_pk(lane), "sk": ESCROW_SK}),
                              ConsistentRead=True)
    return amounts_from_item(unmarshal(got.get("Item")))


def _used(client, names: TableNames, path: str) -> dict[str, int]:
    with translate_errors():
        got = client.get_item(TableName=names.control, Key=marshal({"pk": quota_pk(path), "sk": QUOTA_SK}),
                              ConsistentRead=True)
    return usage_from_item(unmarshal(got.get("Item")) or {})


def _transact(client, items: list[dict]) -> bool:
    """True when the transaction landed; False when a condition failed. Conflicts are retried; other errors raise."""
    try:
        retry_conflicts(lambda: client.transact_write_items(TransactItems=items))
        return True
    except ClientError as err:
        if error_code(err) == "TransactionCanceledException" and "ConditionalCheckFailed" in cancellation_reasons(err):
            return False
        if is_conflict(err):
            return False
        with translate_errors(TransientError, "quota escrow transaction"):
            raise


def reserve(client, names: TableNames, lane: str, needs: Amounts, quotas: dict[str, QuotaNode]) -> Amounts:
    """Take ``needs`` from the quota items into the lane's escrow, as far as the limits allow; what was granted
    (equal to ``needs`` unless a level is short)."""
    granted: Amounts = {}
    for chunk in chunks(_nonzero(needs)):
        if _reserve_chunk(client, names, lane, chunk, quotas):
            granted.update(chunk)
            continue
        # a level is short: read the limited levels once and reserve what they have left, in one transaction
        left = _nonzero({path: _left(client, names, quotas, path, per_type) if _limited(quotas, path, per_type)
                         else dict(per_type) for path, per_type in chunk.items()})
        if left and _reserve_chunk(client, names, lane, left, quotas):
            granted.update(left)
            continue
        for path, per_type in sorted(chunk.items()):  # moved meanwhile: one path at a time, each gets what is left
            if _transact(client, [_quota_update(names, path, per_type, quotas),
                                  escrow_update(names, lane, {path: per_type}, sign=1, checked=False)]):
                granted[path] = dict(per_type)
                continue
            rest = {t: n for t, n in _left(client, names, quotas, path, per_type).items() if n > 0}
            if rest and _transact(client, [_quota_update(names, path, rest, quotas),
                                           escrow_update(names, lane, {path: rest}, sign=1, checked=False)]):
                granted[path] = rest
    return granted


def _reserve_chunk(client, names: TableNames, lane: str, chunk: Amounts, quotas: dict[str, QuotaNode]) -> bool:
    items = [_quota_update(names, p, pt, quotas) for p, pt in sorted(chunk.items())]
    return _transact(client, items + [escrow_update(names, lane, chunk, sign=1, checked=False)])


def _limited(quotas: dict[str, QuotaNode], path: str, per_type: dict[str, int]) -> bool:
    return any(limit_of(quotas, path, t) is not None for t in per_type)


def _left(client, names: TableNames, quotas: dict[str, QuotaNode], path: str, per_type: dict[str, int]) -> dict[str, int]:
    """Of ``per_type``, what ``path``'s limits leave now (read consistently), each at most what was asked."""
    used = _used(client, names, path)
    return {t: max(0, min(n, lim - used.get(t, 0))) if (lim := limit_of(quotas, path, t)) is not None else n
            for t, n in per_type.items()}


def give_back(client, names: TableNames, lane: str, amounts: Amounts) -> None:
    """Return ``amounts`` of the lane's escrow to the quota items. Raises :class:`TransientError` when it could not
    (the escrow keeps it, counted as used, until the lane's next pass gives it back)."""
    for chunk in chunks(_nonzero(amounts)):
        items = [_quota_update(names, p, {t: -n for t, n in pt.items()}, None) for p, pt in sorted(chunk.items())]
        if not _transact(client, items + [escrow_update(names, lane, chunk, sign=-1, checked=True)]):
            raise TransientError(f"escrow of lane {lane}: give-back refused (the escrow holds less than {chunk})")
