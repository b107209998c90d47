"""The server side of an on-prem run: the attempt item's task token and the reads the node API makes.

Contract:
- :meth:`RunStore.job` reads the job item (consistent); :meth:`RunStore.attempt` reads the attempt item
  (pk=JOB#id, sk=ATTEMPT#epoch; ``None`` when absent).
- :meth:`RunStore.record_dispatch` stores the Run state's task token (``run_token``) and
  ``dispatched_at`` on the attempt item, in one transaction with the job's epoch check
  (:class:`gpufleet.errors.StaleEpoch` when ``epoch`` is not current). The token lives only there:
  the node's queue message never carries it, and nodes cannot read job or attempt items; the node API
  reads it to answer the task for the node it has checked (:mod:`gpufleet.nodeapi.service`).
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.clock import Clock
from gpufleet.store.dynamo import marshal, translate_errors, unmarshal
from gpufleet.store.jobitem import JobItem
from gpufleet.tables import JOB_META, attempt_sk, job_pk


class RunStore(Protocol):
    def job(self, job_id: str) -> dict[str, Any] | None: ...

    def attempt(self, job_id: str, epoch: int) -> dict[str, Any] | None: ...

    def record_dispatch(self, job_id: str, epoch: int, token: str, now: float) -> None: ...


class DynamoRunStore:
    """:class:`RunStore` over the jobs table."""

    def __init__(self, client, table: str, clock: Clock) -> None:
        self.client = client
        self.table = table
        self.clock = clock

    def _get(self, pk: str, sk: str) -> dict[str, Any] | None:
        with translate_errors():
            resp = self.client.get_item(TableName=self.table, Key=marshal({"pk": pk, "sk": sk}), ConsistentRead=True)
        return unmarshal(resp.get("Item"))

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self._get(job_pk(job_id), JOB_META)

    def attempt(self, job_id: str, epoch: int) -> dict[str, Any] | None:
        return self._get(job_pk(job_id), attempt_sk(epoch))

    def record_dispatch(self, job_id: str, epoch: int, token: str, now: float) -> None:
        JobItem(self.table, job_id, epoch, client=self.client, clock=self.clock).record_attempt(
            {"run_token": token, "dispatched_at": now})
