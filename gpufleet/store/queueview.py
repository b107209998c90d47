"""The scheduler's last queue view (control table, ``QUEUEVIEW#scheduler`` / ``QUEUE``; one item).

Contract: :meth:`QueueViewStore.put` overwrites the item with a pass's
:class:`~gpufleet.scheduler.queueview.QueueView` (positions as a map job id → ``[position,
estimated_start]``); :meth:`QueueViewStore.get` reads it back (``None`` before the first pass). The
scheduler writes it after each pass, the API reads it for PENDING jobs. AWS errors become
:mod:`gpufleet.errors` exceptions (:func:`gpufleet.store.dynamo.translate_errors`).
"""

from __future__ import annotations

from typing import Protocol

from gpufleet.scheduler.queueview import QueueView
from gpufleet.store.dynamo import marshal, translate_errors, unmarshal
from gpufleet.tables import QUEUE_VIEW_PK, QUEUE_VIEW_SK


class QueueViewStore(Protocol):
    def put(self, view: QueueView) -> None: ...

    def get(self) -> QueueView | None: ...


def view_item(view: QueueView) -> dict:
    """The queue view's item (positions as ``[position, estimated_start]``, ``-1`` for no estimate)."""
    return {"pk": QUEUE_VIEW_PK, "sk": QUEUE_VIEW_SK, "at": view.at, "pending": view.pending,
            "placed": view.placed, "pass_interval_s": view.pass_interval_s,
            "jobs": {jid: [pos, est if est is not None else -1] for jid, (pos, est) in view.jobs.items()}}


def view_from_item(item: dict | None) -> QueueView | None:
    """The :class:`QueueView` of a stored item (``None`` for none)."""
    if not item:
        return None
    jobs = {jid: (int(v[0]), float(v[1]) if float(v[1]) >= 0 else None) for jid, v in (item.get("jobs") or {}).items()}
    return QueueView(at=float(item["at"]), pending=int(item.get("pending", 0)), placed=int(item.get("placed", 0)),
                     pass_interval_s=float(item.get("pass_interval_s", 0)), jobs=jobs)


class DynamoQueueViewStore:
    """``sk``: the item's sort key — ``QUEUE``, or ``QUEUE#<i>of<n>`` for shard i of n sharded passes (each writes
    its own; the API reads ``QUEUE`` only, so with sharded passes PENDING jobs show no queue position yet)."""

    def __init__(self, client, table: str, sk: str = QUEUE_VIEW_SK) -> None:
        self.client = client
        self.table = table
        self.sk = sk

    def put(self, view: QueueView) -> None:
        with translate_errors():
            self.client.put_item(TableName=self.table, Item=marshal({**view_item(view), "sk": self.sk}))

    def get(self) -> QueueView | None:
        with translate_errors():
            got = self.client.get_item(TableName=self.table, Key=marshal({"pk": QUEUE_VIEW_PK, "sk": self.sk}))
        return view_from_item(unmarshal(got.get("Item")))
