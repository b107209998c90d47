"""RunOnPrem's dispatch: keep the task token server-side, send the node an envelope without it.

Contract: the RunOnPrem state invokes the ``dispatch_onprem`` Lambda with ``.waitForTaskToken`` and the
payload ``{"job_id", "token", "run"}`` (``run`` = PrepareRun's output). :func:`dispatch`
- checks the attempt item exists for the envelope's epoch and that the run's ``queue_url`` is the
  queue its placement names (a state that names another node's queue is refused: ``NotAllowed``);
- stores the token, ``dispatched_at`` and the spec's declared inputs (what the node API's per-attempt
  credentials may read) on the attempt item, fenced on the job's epoch
  (:meth:`gpufleet.store.runs.RunStore.record_dispatch`; a stale epoch raises ``StaleEpoch``);
- only then sends the envelope to the node's queue, without ``task_token``. A gang (``placement.members``)
  gets one envelope per member (:func:`gpufleet.envelope.member_envelopes`: its rank, the world size and
  the rendezvous, all of the attempt's epoch) on each member's own queue, and the attempt item starts the
  member states (:mod:`gpufleet.nodeapi.gangstate`). The state carries a pointer
  envelope (no spec); the node has no access to the job item, so the envelope sent is completed with
  the spec read from the job item here (:meth:`gpufleet.envelope.Envelope.with_spec`).
The state then waits until the node API answers the token for the node it checked (heartbeats keep it
alive, ``HeartbeatSeconds`` times out a silent node). Returns ``{"dispatched": true, "epoch"}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpufleet.clock import Clock
from gpufleet.envelope import Envelope, member_envelopes
from gpufleet.errors import NotAllowed, NotFound
from gpufleet.placement import Placement
from gpufleet.spec import JobSpec
from gpufleet.store.runs import RunStore


def dispatch(runs: RunStore, send: Callable[[str, str], Any], clock: Clock, event: dict[str, Any]) -> dict[str, Any]:
    run = event["run"]
    env = Envelope.model_validate(run["envelope"])
    job_id, epoch, token = str(event["job_id"]), env.epoch, str(event["token"])
    if env.job_id != job_id:
        raise NotAllowed(f"envelope names job {env.job_id}, the state {job_id}")
    attempt = runs.attempt(job_id, epoch)
    placement = Placement.parse((attempt or {}).get("placement"))
    if placement is None or not placement.queue_url or run.get("queue_url") != placement.queue_url:
        raise NotAllowed(f"attempt {epoch} of {job_id} is not placed on queue {run.get('queue_url')!r}")
    job = runs.job(job_id)
    if job is None or "spec" not in job:
        raise NotFound(f"job {job_id} not found")
    env = env.with_spec(JobSpec.model_validate(job["spec"]))
    members = member_envelopes(env.model_copy(update={"placement": placement}))  # the attempt item's, authoritative
    nodes = tuple(m.gang.node for _q, m in members if m.gang is not None)
    runs.record_dispatch(job_id, epoch, token, clock.now(), tuple(env.s3.inputs), members=nodes)
    for queue_url, member in members:
        send(queue_url, json.dumps(member.model_dump(mode="json", exclude={"task_token"}), sort_keys=True))
    return {"dispatched": True, "epoch": epoch, "members": len(members)}
