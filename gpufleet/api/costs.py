"""Cost reports from the billing ledger (``GET /v1/costs``).

Contract (docs/api.md "Costs"):
- :func:`report` reads the tenant's ledger entries recorded in ``[since, until)`` from the ledger's
  tenant index (:func:`gpufleet.store.ledger.tenant_entries`) and groups them ``by`` one of
  :data:`GROUPINGS`: ``tenant``, ``team`` (``tenant/team``), ``user`` (``tenant/team/user``), ``label``
  (the value of label ``label_key``; ``(none)`` without it) or ``pool``.
- Charged and waived attempts are summed apart: ``charged_usd`` is the exact decimal sum of the
  charged entries' ``amount_usd`` (so the report's totals equal the ledger to the cent and below);
  ``waived_usd`` is what the waived attempts' GPU time would have cost. A waiver whose attempt was
  later charged (a re-finalized job) counts as charged only.
- A tenant reads only its own costs; an operator may name another ``tenant``.
- :func:`to_csv` renders a report as CSV (one row per group, then ``total``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpufleet.api.models import CostGroup, CostReport
from gpufleet.api.service import Deps
from gpufleet.clock import iso
from gpufleet.errors import BadRequest, Unauthorized
from gpufleet.store import ledger
from gpufleet.store.principals import Principal

GROUPINGS = ("tenant", "team", "user", "label", "pool")
NONE = "(none)"


def _key(entry: dict[str, Any], by: str, label_key: str | None) -> str:
    owner = str(entry.get("owner_path") or entry.get("tenant") or "")
    parts = owner.split("/")
    if by == "tenant":
        return str(entry.get("tenant") or parts[0])
    if by == "team":
        return "/".join(parts[:2])
    if by == "user":
        return owner
    if by == "pool":
        return str(entry.get("pool") or NONE)
    return str((entry.get("labels") or {}).get(label_key or "", NONE))


class _Sum:
    def __init__(self, key: str) -> None:
        self.key = key
        self.charged, self.waived = Decimal(0), Decimal(0)
        self.charged_s, self.waived_s = 0.0, 0.0
        self.charged_n, self.waived_n = 0, 0

    def add(self, entry: dict[str, Any]) -> None:
        if entry.get("sk", "").startswith(ledger.WAIVER_PREFIX):
            self.waived += Decimal(str(entry.get("waived_usd") or "0"))
            self.waived_s += float(entry.get("gpu_seconds") or 0)
            self.waived_n += 1
        else:
            self.charged += Decimal(str(entry.get("amount_usd") or "0"))
            self.charged_s += float(entry.get("gpu_seconds") or 0)
            self.charged_n += 1

    def view(self) -> CostGroup:
        return CostGroup(key=self.key, charged_usd=str(self.charged), charged_gpu_seconds=self.charged_s,
                         charged_attempts=self.charged_n, waived_usd=str(self.waived),
                         waived_gpu_seconds=self.waived_s, waived_attempts=self.waived_n)


def summarize(entries: Iterable[dict[str, Any]], by: str, label_key: str | None = None) -> tuple[list[CostGroup], CostGroup]:
    """(groups sorted by key, total) of ledger entries (pure; module contract)."""
    rows = list(entries)
    charged = {(e.get("job_id"), int(e.get("epoch") or 0)) for e in rows
               if not str(e.get("sk", "")).startswith(ledger.WAIVER_PREFIX)}
    groups: dict[str, _Sum] = {}
    total = _Sum("total")
    for e in rows:
        if str(e.get("sk", "")).startswith(ledger.WAIVER_PREFIX) and (e.get("job_id"), int(e.get("epoch") or 0)) in charged:
            continue
        key = _key(e, by, label_key)
        groups.setdefault(key, _Sum(key)).add(e)
        total.add(e)
    return [groups[k].view() for k in sorted(groups)], total.view()


def _bound(name: str, value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise BadRequest(f"{name} must include a timezone (e.g. 2026-01-01T00:00:00Z)", param=name)
    return iso(value.timestamp())


def report(deps: Deps, who: Principal, *, by: str, since: datetime | None, until: datetime | None,
           label_key: str | None = None, tenant: str | None = None) -> CostReport:
    """``GET /v1/costs`` (module contract)."""
    if by not in GROUPINGS:
        raise BadRequest(f"by must be one of {', '.join(GROUPINGS)}", param="by")
    if by == "label" and not label_key:
        raise BadRequest("by=label needs label_key (the label whose values group the costs)", param="label_key")
    if tenant and tenant != who.tenant and not who.admin:
        raise Unauthorized("only an operator may read another tenant's costs")
    lo, hi = _bound("since", since), _bound("until", until)
    if lo and hi and lo >= hi:
        raise BadRequest("since must be earlier than until", param="since")
    tenant = tenant or who.tenant
    entries = ledger.tenant_entries(deps.ddb, deps.settings.tables.ledger, tenant, lo, hi)
    groups, total = summarize(entries, by, label_key)
    return CostReport(tenant=tenant, by=by, since=lo, until=hi, groups=groups, total=total)


CSV_FIELDS = ("key", "charged_usd", "charged_gpu_seconds", "charged_attempts", "waived_usd", "waived_gpu_seconds",
              "waived_attempts")


def to_csv(rep: CostReport) -> str:
    """The report as CSV: a header, one row per group, then the ``total`` row."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for g in [*rep.groups, rep.total]:
        d = g.model_dump()
        w.writerow([d[f] for f in CSV_FIELDS])
    return out.getvalue()
