"""In-memory :class:`~gpufleet.store.queueview.QueueViewStore`: the scheduler's one queue view item, built and
read back by the DynamoDB store's own functions (:func:`~gpufleet.store.queueview.view_item`,
:func:`~gpufleet.store.queueview.view_from_item`) after the marshalling round trip."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.scheduler.queueview import QueueView
from gpufleet.store.fakes.jobs import stored
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.queueview import view_from_item, view_item
from gpufleet.tables import QUEUE_VIEW_PK, QUEUE_VIEW_SK


@dataclass
class MemoryQueueViewStore:
    db: MemoryDatabase
    table: str = "control"
    sk: str = QUEUE_VIEW_SK

    def put(self, view: QueueView) -> None:
        self.db.put(self.table, stored({**view_item(view), "sk": self.sk}))

    def get(self) -> QueueView | None:
        return view_from_item(self.db.get(self.table, (QUEUE_VIEW_PK, self.sk)))
