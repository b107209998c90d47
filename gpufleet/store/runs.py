"""The server side of an on-prem run: the attempt item's task token and the reads the node API makes.

Contract:
- :meth:`RunStore.job` reads the job item (consistent); :meth:`RunStore.attempt` reads the attempt item
  (pk=JOB#id, sk=ATTEMPT#epoch; ``None`` when absent). ``fields`` given: only those top-level attributes
  (a projection; the node API reads :data:`NODE_JOB_FIELDS` / :data:`NODE_ATTEMPT_FIELDS`, never the
  spec or the placement token, and its role may read nothing else).
- :meth:`RunStore.record_dispatch` stores the Run state's task token (``run_token``), ``dispatched_at``
  and the spec's declared ``inputs`` (what the attempt's credentials may read) on the attempt item, in
  one transaction with the job's epoch check
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

#: what the node API reads of a job item: the epoch it checks and what a node may see
NODE_JOB_FIELDS = ("job_id", "status", "current_epoch", "cancel_requested", "preempt_requested", "progress",
                   "checkpoint", "generated")
#: what the node API reads of an attempt item: the placement it checks, the token, the dispatch time and inputs
NODE_ATTEMPT_FIELDS = ("placement", "run_token", "dispatched_at", "inputs")


class RunStore(Protocol):
    def job(self, job_id: str, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None: ...

    def attempt(self, job_id: str, epoch: int, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None: ...

    def record_dispatch(self, job_id: str, epoch: int, token: str, now: float,
                        inputs: tuple[str, ...] = ()) -> None: ...


class DynamoRunStore:
    """:class:`RunStore` over the jobs table."""

    def __init__(self, client, table: str, clock: Clock) -> None:
        self.client = client
        self.table = table
        self.clock = clock

    def _get(self, pk: str, sk: str, fields: tuple[str, ...] | None) -> dict[str, Any] | None:
        kw: dict[str, Any] = {}
        if fields is not None:  # the key too, so an existing item without any of the fields is not None
            names = ("pk", *fields)
            kw = {"ProjectionExpression": ", ".join(f"#f{i}" for i in range(len(names))),
                  "ExpressionAttributeNames": {f"#f{i}": n for i, n in enumerate(names)}}
        with translate_errors():
            resp = self.client.get_item(TableName=self.table, Key=marshal({"pk": pk, "sk": sk}), ConsistentRead=True,
                                        **kw)
        return unmarshal(resp.get("Item"))

    def job(self, job_id: str, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        return self._get(job_pk(job_id), JOB_META, fields)

    def attempt(self, job_id: str, epoch: int, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        return self._get(job_pk(job_id), attempt_sk(epoch), fields)

    def record_dispatch(self, job_id: str, epoch: int, token: str, now: float,
                        inputs: tuple[str, ...] = ()) -> None:
        JobItem(self.table, job_id, epoch, client=self.client, clock=self.clock).record_attempt(
            {"run_token": token, "dispatched_at": now, "inputs": list(inputs)})
