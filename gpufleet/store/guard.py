"""Typed conditions of job-item writes, shared by every :class:`~gpufleet.store.jobs.JobStore`.

A caller says *what* a write requires (a status, no cancel request) as a :class:`Guard`; the
DynamoDB store turns it into a condition expression (:meth:`Guard.expression`), the in-memory
store evaluates it on the item (:meth:`Guard.holds`). No condition strings leave the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.status import JobStatus

#: the job item's attributes a guard conditions on besides ``status`` (IAM counts a condition's names among an
#: update's attributes: infra.grants binds the roles whose writes carry them)
CANCEL_REQUESTED = "cancel_requested"
WORKFLOW_RUN = "workflow_run"


@dataclass(frozen=True)
class Guard:
    """What a job write requires besides its status move and its epoch (typed, so every
    :class:`JobStore` — DynamoDB or in memory — evaluates the same condition)."""

    #: The job's status must be this one.
    status: JobStatus | None = None
    #: ``cancel_requested`` must be unset (or false).
    not_cancelled: bool = False
    #: ``workflow_run`` must be this (``0`` also matches a job without one): one operator's
    #: recovery action per observed run (gpufleet.lifecycle.recovery).
    workflow_run: int | None = None

    def holds(self, item: dict[str, Any]) -> bool:
        """The condition evaluated on an item (the in-memory stores' side)."""
        if self.status is not None and item.get("status") != self.status.value:
            return False
        if self.workflow_run is not None and int(item.get(WORKFLOW_RUN, 0)) != self.workflow_run:
            return False
        return not (self.not_cancelled and item.get(CANCEL_REQUESTED))

    def expression(self) -> tuple[str | None, dict[str, str], dict[str, Any]]:
        """The condition as DynamoDB expression parts: (expression or None, names, plain values);
        callers AND it in as ``(expression)``."""
        parts: list[str] = []
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        if self.status is not None:
            names["#g_st"] = "status"
            values[":g_st"] = self.status.value
            parts.append("#g_st = :g_st")
        if self.not_cancelled:
            names["#g_cr"] = CANCEL_REQUESTED
            values[":g_f"] = False
            parts.append("attribute_not_exists(#g_cr) OR #g_cr = :g_f")
        if self.workflow_run is not None:
            names["#g_wr"] = WORKFLOW_RUN
            values[":g_wr"] = int(self.workflow_run)
            parts.append("attribute_not_exists(#g_wr) OR #g_wr = :g_wr" if self.workflow_run == 0 else "#g_wr = :g_wr")
        if not parts:
            return None, names, values
        # callers wrap the whole expression in parentheses; DynamoDB rejects redundant ones
        expr = parts[0] if len(parts) == 1 else " AND ".join(f"({p})" if " OR " in p else p for p in parts)
        return expr, names, values
