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
  reads it to answer the task for the node it has checked (:mod:`gpufleet.nodeapi.service`). For a gang
  (``members`` given) it also starts the member states (:mod:`gpufleet.nodeapi.gangstate`): every member
  ``dispatched``, the counters 0.
- :meth:`RunStore.record_cloud_dispatch` is RunCloud's: it stores the sha256 of the attempt's supervisor token
  (:data:`SUPERVISOR_TOKEN_ATTR`, never the token), ``dispatched_at`` and the declared ``inputs`` on the attempt
  item with the same epoch check (:class:`gpufleet.errors.StaleEpoch`). :meth:`RunStore.claim_supervisor_token`
  is the exchange's one conditional update: it sets :data:`SUPERVISOR_CLAIMED_ATTR` only when the attempt holds
  that hash and was never claimed; ``False`` otherwise (:mod:`gpufleet.nodeapi.supervisor`).
- The gang moves (:meth:`DynamoRunStore.gang_ready`, :meth:`~DynamoRunStore.gang_succeeded`,
  :meth:`~DynamoRunStore.gang_fail`) are single conditional updates of the attempt item: a member moves
  only from the state before (so it counts once) and never after ``gang_failed`` is set; a refused move
  answers ``None``/``False``. :meth:`~DynamoRunStore.gang_beat` records a member's heartbeat time.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.clock import Clock
from gpufleet.errors import Conflict
from gpufleet.store.dynamo import marshal, translate_errors, unmarshal
from gpufleet.store.jobitem import JobItem
from gpufleet.tables import JOB_META, attempt_sk, job_pk

#: what the node API reads of a job item: the epoch it checks and what a node may see
NODE_JOB_FIELDS = ("job_id", "tenant", "status", "current_epoch", "cancel_requested", "preempt_requested", "progress",
                   "checkpoint", "generated")
#: what the node API reads of an attempt item: the placement it checks, the token, the dispatch time and inputs
NODE_ATTEMPT_FIELDS = ("placement", "run_token", "dispatched_at", "inputs", "gang", "gang_ready", "gang_succeeded",
                       "gang_beats", "gang_gpu_seconds", "gang_failed")

#: the attempt item's sha256 of its cloud supervisor's one-time token, and the time it was exchanged
SUPERVISOR_TOKEN_ATTR = "supervisor_token_sha256"
SUPERVISOR_CLAIMED_ATTR = "supervisor_token_claimed_at"
#: what the supervisor-token exchange reads of an attempt item
SUPERVISOR_ATTEMPT_FIELDS = ("placement", "inputs", SUPERVISOR_TOKEN_ATTR, SUPERVISOR_CLAIMED_ATTR)


class RunStore(Protocol):
    def job(self, job_id: str, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None: ...

    def attempt(self, job_id: str, epoch: int, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None: ...

    def record_dispatch(self, job_id: str, epoch: int, token: str, now: float,
                        inputs: tuple[str, ...] = (), members: tuple[str, ...] = ()) -> None: ...

    def record_cloud_dispatch(self, job_id: str, epoch: int, token_sha256: str, now: float,
                              inputs: tuple[str, ...] = ()) -> None: ...

    def claim_supervisor_token(self, job_id: str, epoch: int, token_sha256: str, now: float) -> bool: ...

    def gang_ready(self, job_id: str, epoch: int, node: str, now: float) -> int | None: ...

    def gang_beat(self, job_id: str, epoch: int, node: str, now: float) -> None: ...

    def gang_succeeded(self, job_id: str, epoch: int, node: str, gpu_seconds: float) -> tuple[int, float] | None: ...

    def gang_fail(self, job_id: str, epoch: int, node: str, reason: str) -> bool: ...


def dispatch_attributes(token: str, now: float, inputs: tuple[str, ...] = (),
                        members: tuple[str, ...] = ()) -> dict[str, Any]:
    """What :meth:`RunStore.record_dispatch` sets on the attempt item (a gang's member states start ``dispatched``)."""
    attrs: dict[str, Any] = {"run_token": token, "dispatched_at": now, "inputs": list(inputs)}
    if members:
        attrs.update({"gang": {m: "dispatched" for m in members}, "gang_beats": {}, "gang_ready": 0,
                      "gang_succeeded": 0, "gang_gpu_seconds": 0})
    return attrs


def cloud_dispatch_attributes(token_sha256: str, now: float, inputs: tuple[str, ...] = ()) -> dict[str, Any]:
    """What :meth:`RunStore.record_cloud_dispatch` sets on the attempt item."""
    return {SUPERVISOR_TOKEN_ATTR: token_sha256, "dispatched_at": now, "inputs": list(inputs)}


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
                        inputs: tuple[str, ...] = (), members: tuple[str, ...] = ()) -> None:
        attrs = dispatch_attributes(token, now, inputs, members)
        JobItem(self.table, job_id, epoch, client=self.client, clock=self.clock).record_attempt(attrs)

    def record_cloud_dispatch(self, job_id: str, epoch: int, token_sha256: str, now: float,
                              inputs: tuple[str, ...] = ()) -> None:
        attrs = cloud_dispatch_attributes(token_sha256, now, inputs)
        JobItem(self.table, job_id, epoch, client=self.client, clock=self.clock).record_attempt(attrs)

    def claim_supervisor_token(self, job_id: str, epoch: int, token_sha256: str, now: float) -> bool:
        return self._gang_update(job_id, epoch, "SET #c = :now", "#h = :h AND attribute_not_exists(#c)",
                                 {"#c": SUPERVISOR_CLAIMED_ATTR, "#h": SUPERVISOR_TOKEN_ATTR},
                                 {":now": now, ":h": token_sha256}) is not None

    def _gang_update(self, job_id: str, epoch: int, expr: str, cond: str, names: dict[str, str],
                     values: dict[str, Any]) -> dict[str, Any] | None:
        """One conditional update of the attempt item; its updated values, or ``None`` when refused."""
        try:
            with translate_errors():
                resp = self.client.update_item(
                    TableName=self.table, Key=marshal({"pk": job_pk(job_id), "sk": attempt_sk(epoch)}),
                    UpdateExpression=expr, ConditionExpression=f"attribute_exists(pk) AND {cond}",
                    ExpressionAttributeNames=names, ExpressionAttributeValues=marshal(values),
                    ReturnValues="UPDATED_NEW")
        except Conflict:
            return None
        return unmarshal(resp.get("Attributes")) or {}

    def gang_ready(self, job_id: str, epoch: int, node: str, now: float) -> int | None:
        """``node`` moves dispatched → ready (and beats); the number ready after, or ``None`` if refused."""
        out = self._gang_update(
            job_id, epoch, "SET #g.#n = :ready, #b.#n = :now ADD #r :one",
            "#g.#n = :dispatched AND attribute_not_exists(#f)",
            {"#g": "gang", "#n": node, "#b": "gang_beats", "#r": "gang_ready", "#f": "gang_failed"},
            {":ready": "ready", ":dispatched": "dispatched", ":now": now, ":one": 1})
        return None if out is None else int(out.get("gang_ready", 0))

    def gang_beat(self, job_id: str, epoch: int, node: str, now: float) -> None:
        """Record ``node``'s heartbeat (a member of the gang only)."""
        self._gang_update(job_id, epoch, "SET #b.#n = :now", "attribute_exists(#g.#n)",
                          {"#g": "gang", "#n": node, "#b": "gang_beats"}, {":now": now})

    def gang_succeeded(self, job_id: str, epoch: int, node: str, gpu_seconds: float) -> tuple[int, float] | None:
        """``node`` moves ready → succeeded, adding its GPU-seconds: ``(members succeeded, GPU-seconds so far)``
        after the move, or ``None`` if refused (not ready, already counted, or the gang failed)."""
        out = self._gang_update(
            job_id, epoch, "SET #g.#n = :succeeded ADD #s :one, #gs :gs",
            "#g.#n = :ready AND attribute_not_exists(#f)",
            {"#g": "gang", "#n": node, "#s": "gang_succeeded", "#gs": "gang_gpu_seconds", "#f": "gang_failed"},
            {":succeeded": "succeeded", ":ready": "ready", ":one": 1, ":gs": round(float(gpu_seconds), 3)})
        return None if out is None else (int(out.get("gang_succeeded", 0)), float(out.get("gang_gpu_seconds", 0)))

    def gang_fail(self, job_id: str, epoch: int, node: str, reason: str) -> bool:
        """Mark the gang failed (first failure wins); ``False`` when it already had failed."""
        return self._gang_update(job_id, epoch, "SET #f = :f", "attribute_not_exists(#f)", {"#f": "gang_failed"},
                                 {":f": {"node": node, "reason": reason[:1000]}}) is not None
