"""``GET /v1/admin/diagnose``: where the GPU time of a window went, per cause, for operators.

Contract (docs/api.md "Diagnose"):
- Operators only (403 otherwise, :func:`gpufleet.api.recovery.require_operator`).
- The window is ``[since, until)``: ``until`` defaults to now, ``since`` to one hour before ``until``; both must
  carry a timezone, ``since`` must be earlier and the window at most :data:`MAX_WINDOW_S` long (400 otherwise).
- The inputs come from the store's :class:`~gpufleet.store.diagnosis.DiagnosisReader` (nodes of ``pool`` when
  given); :func:`gpufleet.diagnose.attribution.attribute` gives every GPU-second one cause; the report is its
  ranked table, per-pool seconds and, with ``lanes``, one lane per GPU (what ``gpufleet diagnose --html`` draws);
  with ``fleet``, each node's state now (ready, draining, lost), GPUs and models
  (:func:`gpufleet.diagnose.fleet.fleet_view` of the liveness items the reader read, ``node_items``).
"""

from __future__ import annotations

from datetime import datetime

from gpufleet.api.models import DiagnosisReport
from gpufleet.api.recovery import require_operator
from gpufleet.api.service import Deps
from gpufleet.diagnose.attribution import attribute
from gpufleet.diagnose.fleet import fleet_view
from gpufleet.errors import BadRequest
from gpufleet.store.diagnosis import DynamoDiagnosisReader
from gpufleet.store.principals import Principal

DEFAULT_WINDOW_S = 3600.0
MAX_WINDOW_S = 7 * 86400.0


def _at(name: str, value: datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise BadRequest(f"{name} must include a timezone (e.g. 2026-01-01T00:00:00Z)", param=name)
    return value.timestamp()


def diagnose(deps: Deps, who: Principal, *, since: datetime | None = None, until: datetime | None = None,
             pool: str | None = None, lanes: bool = False, fleet: bool = False) -> DiagnosisReport:
    """``GET /v1/admin/diagnose`` (module contract)."""
    require_operator(who, "diagnosing GPU time")
    hi = _at("until", until)
    hi = deps.clock.now() if hi is None else hi
    lo = _at("since", since)
    lo = hi - DEFAULT_WINDOW_S if lo is None else lo
    if lo >= hi:
        raise BadRequest("since must be earlier than until", param="since")
    if hi - lo > MAX_WINDOW_S:
        raise BadRequest(f"the window may be at most {MAX_WINDOW_S / 86400:.0f} days long", param="since")
    reader = deps.diagnosis or DynamoDiagnosisReader(deps.ddb, deps.settings.tables)
    attr = attribute(reader.window(lo, hi, pool))
    truncated = bool(getattr(reader, "truncated", False))
    report = {**attr.as_dict(lanes=lanes), "truncated": truncated}
    if fleet:
        report["fleet"] = fleet_view(getattr(reader, "node_items", []), deps.clock.now())
    return DiagnosisReport.model_validate(report)
