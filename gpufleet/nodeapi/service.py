"""The node API's operations: every call a node makes about a job, checked server-side first.

Contract (``node`` is always the caller's identity from :func:`gpufleet.nodeapi.identity.node_of`):
- Every attempt operation of a node first checks that the node is registered still
  (:class:`gpufleet.nodeapi.registered.RegisteredNodes`: an operator's deregistration refuses it, 403, within
  ``registration_ttl_s``), then reads the job and the attempt item and applies
  :func:`gpufleet.nodeapi.assignment.check_assignment` (403 not this node's attempt, 409 stale epoch);
  a refused call changes nothing. The writes then go through the fenced job-item adapter
  (:class:`gpufleet.store.jobitem.JobItem`), so a race with a new epoch is still refused by the store.
- The job and attempt items are read projected (:data:`gpufleet.store.runs.NODE_JOB_FIELDS`,
  :data:`~gpufleet.store.runs.NODE_ATTEMPT_FIELDS`): the node API never reads the spec or the placement
  token, and its role allows no other read. Worker writes return only what they set (``UPDATED_NEW``).
- ``view``/``beat``/``progress`` return :data:`VIEW_FIELDS` of the job item only (never the spec, the
  placement token or anything else of the job): the checked read with the write's new values.
- ``task_heartbeat``, ``complete`` and ``fail`` answer the Run state with the task token stored on the
  attempt item at dispatch (:mod:`gpufleet.nodeapi.dispatch`); a token the workflow no longer waits on
  is :class:`gpufleet.errors.TaskGone` (410). The node supplies only its measured GPU-seconds (capped
  at the time since dispatch times the placement's GPUs), the exit-code name and a detail; the epoch,
  the node and the ``generated`` pointer of the report come from the server.
- Gangs (the placement has ``members``; :mod:`gpufleet.nodeapi.gangstate`): each member's node acts on its
  own member only. Its first heartbeat marks it ready (the start barrier); every heartbeat records its
  time and answers ``gang: {"rank", "world_size", "ready", "released"}`` — the agent starts the member's
  process only once ``released``. A heartbeat that finds the barrier timed out or a started member silent
  fails the gang: the task fails (``SYSTEM_ERROR``, cause names the reason) and the caller gets 410, as
  does every other member at its next heartbeat, so every member stops and the lifecycle retries the gang
  as a unit with a new epoch. ``complete`` counts the member; the last member's ``complete`` answers the
  task with the sum of the members' GPU-seconds (each capped by its own GPUs); earlier ones answer
  ``{"reported": "MEMBER_SUCCEEDED"}``. ``fail`` of any member marks the gang failed and fails the task.
- A gang's timeline (``GET /v1/jobs/{id}/events``): ``gang_started`` when its barrier opens (written by the
  heartbeat whose ready move completed the gang: ``{"epoch", "members": [{"node", "rank", "gpus"}]}``) and
  ``gang_ended`` when the last member succeeds (``{"epoch", "outcome": "SUCCEEDED", "gpu_seconds"}``) or the
  gang first fails (``{"epoch", "outcome": "FAILED", "node", "reason"}``); each once per attempt, since each
  follows the one conditional move that made it true. A gang whose every agent dies reaches no node API: its
  attempt ends by the Run state's heartbeat timeout and the timeline records only ``attempt_failed``.
- ``credentials`` vends the attempt's object credentials (:func:`gpufleet.nodeapi.scope.session_policy`);
  the readable inputs are those RunOnPrem's dispatch recorded on the attempt item that are the job's tenant's
  (:class:`gpufleet.ownership.InputOwnership`, the rule the API applies at submission): one that is not is
  left out of the session and logged (an ``inputs_withheld`` event line), so a spec that reached an attempt unchecked still
  reads nobody else's objects. The same holds for a cloud supervisor's session. Both sessions may also read the
  deployment's published models (``model_s3_root``, read only), platform content no tenant owns.
- Cloud supervisors (:mod:`gpufleet.nodeapi.supervisor`): ``exchange_supervisor_token`` trades an attempt's one-time
  token for the supervisor's session (the token's hash must be on the attempt item and unclaimed; the claim is one
  conditional write; then the epoch must be current); every refusal is the same 403, nothing changed. A supervisor
  principal (``sup:<epoch>:<job>``) passes the attempt check only for its own job and epoch while that epoch is
  current (:func:`~gpufleet.nodeapi.supervisor.check_supervisor`) and its ``credentials`` renew its own session.
- ``node_heartbeat`` writes the node's liveness item from its operator registration with the report
  clamped into it (:func:`gpufleet.nodeapi.liveness.node_item`); an unregistered node is refused (403), and so
  is a heartbeat that read the registration just before an operator deregistered the node (the write names
  the registration it comes from and a deregistration's tombstone refuses it: :mod:`gpufleet.store.nodes`).
  The report's ``metrics`` (what the agent measured, clamped by :func:`~gpufleet.nodeapi.liveness.node_metrics`)
  are emitted as EMF (``NodeGpuBusy``, ``NodeCacheHits``, ``NodeCacheMisses`` under the registered ``Pool``) and
  one ``node_metrics`` log line naming the node, on the node API function's log stream: the agent's
  measurements reach CloudWatch through the call it already makes, its role unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.clock import Clock
from gpufleet.envelope import ExitCode
from gpufleet.errors import NotAllowed, NotRegistered, StaleEpoch, TaskGone, TransientError, ValidationFailed
from gpufleet.metrics import catalog as M
from gpufleet.metrics.emf import Metrics
from gpufleet.nodeapi import supervisor
from gpufleet.nodeapi.assignment import attempt_nodes, check_assignment, checked_key
from gpufleet.nodeapi.gangstate import SUCCEEDED, GangState, culprits, members_view, verdict
from gpufleet.nodeapi.liveness import LivenessReport, became_usable, freed_capacity, node_item, node_metrics
from gpufleet.nodeapi.registered import REGISTRATION_TTL_S, RegisteredNodes
from gpufleet.nodeapi.scope import session_policy
from gpufleet.ownership import InputOwnership
from gpufleet.phases import parse as parse_phases
from gpufleet.placement import Placement
from gpufleet.store.credentials import CredentialVendor
from gpufleet.store.nodes import NodeStore
from gpufleet.store.runs import NODE_ATTEMPT_FIELDS, NODE_JOB_FIELDS, SUPERVISOR_ATTEMPT_FIELDS, RunStore
from gpufleet.store.workflow import EventBus, RunTokens

#: what a node may see of its job
VIEW_FIELDS = ("job_id", "status", "current_epoch", "cancel_requested", "preempt_requested", "progress",
               "checkpoint", "generated")
#: runtime events a node may add to its job's timeline
NODE_EVENTS = frozenset({"resumed"})
#: failure names a node may report (the runtime contract's exit codes, success aside)
FAILURE_NAMES = frozenset(c.name for c in ExitCode if c is not ExitCode.SUCCEEDED)


class WorkerItem(Protocol):
    """The fenced job-item writes of one attempt (:class:`gpufleet.store.jobitem.JobItem`)."""

    def set_progress(self, step: int, total: int) -> dict[str, Any]: ...

    def heartbeat(self) -> dict[str, Any]: ...

    def mark_running(self) -> bool: ...

    def set_checkpoint(self, key: str, sha256: str, step: int) -> None: ...

    def set_generated(self, ref: dict[str, Any]) -> None: ...

    def add_event(self, kind: str, detail: dict[str, Any]) -> None: ...

    def record_attempt(self, attrs: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Buckets:
    checkpoints: str
    outputs: str
    logs: str


@dataclass
class NodeServiceDeps:
    runs: RunStore
    nodes: NodeStore
    tokens: RunTokens
    worker_item: Callable[[str, int], WorkerItem]  # (job_id, epoch) -> the fenced writes of that attempt
    clock: Clock
    buckets: Buckets
    credentials: CredentialVendor | None = None
    max_node_ttl_s: int = 300
    partition: str = "aws"
    gang_barrier_timeout_s: float = 300.0
    gang_silence_s: float = 90.0
    metrics: Metrics = field(default_factory=Metrics)
    #: the cloud supervisor role's vendor and the node API's ARN (``arn:<p>:execute-api:<region>:<acct>:<api id>``)
    supervisor_credentials: CredentialVendor | None = None
    node_api_arn: str = ""
    #: whose an input is; None: the deployment default (``tenants/<t>/`` in the outputs bucket)
    ownership: InputOwnership | None = None
    #: the bus that hears ``NodeReady`` (a scheduler pass now); None: the timer's pass sees the node
    events: EventBus | None = None
    #: how long a node's registration, once read, is trusted by the attempt routes (:mod:`.registered`)
    registration_ttl_s: float = REGISTRATION_TTL_S
    #: the deployment's published models (``s3://bucket/prefix/``): every attempt session may read them; "": none
    model_s3_root: str = ""


def view(item: dict[str, Any]) -> dict[str, Any]:
    out = {k: item[k] for k in VIEW_FIELDS if k in item}
    req = out.get("preempt_requested")
    if isinstance(req, dict):  # the epoch it stops and when: never the job it makes room for (maybe another tenant's)
        out["preempt_requested"] = {k: req[k] for k in ("epoch", "at") if k in req}
    return out


class NodeService:
    def __init__(self, deps: NodeServiceDeps) -> None:
        self.d = deps
        self.registered = RegisteredNodes(deps.nodes, deps.clock, deps.registration_ttl_s)

    # ------------------------------------------------------------------ the check
    def _checked(self, node: str, job_id: str, epoch: int) -> tuple[dict[str, Any], dict[str, Any]]:
        if supervisor.bound_attempt(node) is None:  # a node: registered still (a deregistered one learns nothing)
            self.registered.check(node)
        job = self.d.runs.job(job_id, NODE_JOB_FIELDS)
        attempt = self.d.runs.attempt(job_id, epoch, NODE_ATTEMPT_FIELDS) if job is not None else None
        current = int((job or {}).get("current_epoch", -1))
        if supervisor.bound_attempt(node) is not None:
            supervisor.check_supervisor(node, job_id, epoch, current_epoch=current, attempt_exists=attempt is not None)
        else:
            check_assignment(node, epoch, current_epoch=current, nodes=attempt_nodes(attempt))
        assert job is not None and attempt is not None
        return job, attempt

    def _token(self, attempt: dict[str, Any]) -> str:
        token = attempt.get("run_token")
        if not token:
            raise TaskGone("the attempt has no running task")
        return str(token)

    # ------------------------------------------------------------------ agent
    def view(self, node: str, job_id: str, epoch: int) -> dict[str, Any]:
        return view(self._checked(node, job_id, epoch)[0])

    def task_heartbeat(self, node: str, job_id: str, epoch: int) -> dict[str, Any]:
        job, attempt = self._checked(node, job_id, epoch)
        token = self._token(attempt)
        g = GangState.of(attempt)
        extra: dict[str, Any] = {}
        if g is not None:
            extra = {"gang": self._gang_beat(g, node, job_id, epoch, token)}
        if not self.d.tokens.heartbeat(token):
            raise TaskGone("the workflow no longer waits on this attempt")
        return {**view(job), **extra}

    def _gang_beat(self, g: GangState, node: str, job_id: str, epoch: int, token: str) -> dict[str, Any]:
        """A gang member's heartbeat: ready at the barrier, its time recorded, the gang's verdict applied."""
        now = self.d.clock.now()
        states = dict(g.states)
        ready = self.d.runs.gang_ready(job_id, epoch, node, now) if g.state(node) == "dispatched" else None
        if ready is not None:
            states[node] = "ready"
            if ready == len(g.nodes):  # this move opened the barrier: the gang starts
                self._gang_event(job_id, epoch, "gang_started", {"members": [
                    {k: m[k] for k in ("node", "rank", "gpus")} for m in members_view(g)]})
        else:
            self.d.runs.gang_beat(job_id, epoch, node, now)
        g = GangState(g.nodes, states, {**g.beats, node: now}, g.dispatched_at, g.failed, g.gpus)
        reason = verdict(g, now, silence_s=self.d.gang_silence_s, barrier_timeout_s=self.d.gang_barrier_timeout_s)
        if reason is not None:
            blamed = culprits(g, now, silence_s=self.d.gang_silence_s) or [node]
            self._fail_gang(blamed[0], job_id, epoch, token, "SYSTEM_ERROR", reason)
            raise TaskGone(f"the gang failed: {reason}")
        return {"rank": g.rank(node), "world_size": len(g.nodes), "released": g.released,
                "ready": sum(1 for n in g.nodes if g.state(n) != "dispatched")}

    def _gang_event(self, job_id: str, epoch: int, kind: str, detail: dict[str, Any]) -> None:
        """Add a gang event to the job's timeline (fenced on ``epoch``; a stale attempt's is dropped)."""
        try:
            self.d.worker_item(job_id, epoch).add_event(kind, detail)
        except StaleEpoch:
            pass

    def _fail_gang(self, node: str, job_id: str, epoch: int, token: str, error: str, detail: str) -> dict[str, Any]:
        reason = f"{node}: {error}: {detail}"[:1000]
        if self.d.runs.gang_fail(job_id, epoch, node, reason):  # the first failure ends the gang
            self._gang_event(job_id, epoch, "gang_ended", {"outcome": "FAILED", "node": node, "reason": reason})
        cause = {"epoch": epoch, "node": node, "detail": str(detail)[:4000], "gang": True}
        if not self.d.tokens.fail(token, error, cause):
            raise TaskGone("the workflow no longer waits on this attempt")
        return {"reported": error, "cause": cause}

    def _gpu_seconds(self, attempt: dict[str, Any], reported: float, node: str | None = None) -> float:
        reported = max(0.0, float(reported))
        started = attempt.get("dispatched_at")
        if started is None:
            return reported
        p = Placement.parse(attempt.get("placement"))
        indices = p.gpu_indices if p is not None else []
        if p is not None and p.members and node is not None:  # a gang member: its own GPUs
            indices = next((m.gpu_indices for m in p.members if m.node == node), [])
        gpus = max(1.0, (p.gpu_milli / 1000.0) * max(1, len(indices))) if p is not None else 1.0
        return round(min(reported, max(0.0, self.d.clock.now() - float(started)) * gpus), 3)

    def complete(self, node: str, job_id: str, epoch: int, gpu_seconds: float) -> dict[str, Any]:
        job, attempt = self._checked(node, job_id, epoch)
        token = self._token(attempt)
        g = GangState.of(attempt)
        mine = self._gpu_seconds(attempt, gpu_seconds, node)
        if g is not None:
            moved = self.d.runs.gang_succeeded(job_id, epoch, node, mine)
            if moved is None:  # already counted (a retried report), not started, or the gang failed
                now_attempt = self.d.runs.attempt(job_id, epoch, NODE_ATTEMPT_FIELDS) or {}
                g = GangState.of(now_attempt) or g
                if g.failed:
                    raise TaskGone("the gang failed")
                if not all(g.state(n) == SUCCEEDED for n in g.nodes):
                    return {"reported": "MEMBER_SUCCEEDED"}
                done, total = len(g.nodes), float(now_attempt.get("gang_gpu_seconds", 0))
            else:
                done, total = moved
                if done == len(g.nodes):  # this member's move completed the gang
                    self._gang_event(job_id, epoch, "gang_ended",
                                     {"outcome": "SUCCEEDED", "gpu_seconds": round(total, 3)})
            if done < len(g.nodes):
                return {"reported": "MEMBER_SUCCEEDED"}
            mine = round(total, 3)
        output = {"epoch": epoch, "gpu_seconds": mine, "generated": job.get("generated") or {}}
        if not self.d.tokens.succeed(token, output):
            raise TaskGone("the workflow no longer waits on this attempt")
        return {"reported": "SUCCEEDED", "output": output}

    def fail(self, node: str, job_id: str, epoch: int, error: str, detail: str = "") -> dict[str, Any]:
        if error not in FAILURE_NAMES:
            raise ValidationFailed(f"error must be one of {sorted(FAILURE_NAMES)}", field="error")
        _job, attempt = self._checked(node, job_id, epoch)
        if GangState.of(attempt) is not None:
            return self._fail_gang(node, job_id, epoch, self._token(attempt), error, str(detail))
        cause = {"epoch": epoch, "node": node, "detail": str(detail)[:4000]}
        if not self.d.tokens.fail(self._token(attempt), error, cause):
            raise TaskGone("the workflow no longer waits on this attempt")
        return {"reported": error, "cause": cause}

    # ------------------------------------------------------------------ runtime (fenced writes)
    def _item(self, node: str, job_id: str, epoch: int) -> WorkerItem:
        return self._checked_item(node, job_id, epoch)[1]

    def _checked_item(self, node: str, job_id: str, epoch: int) -> tuple[dict[str, Any], WorkerItem]:
        job, _attempt = self._checked(node, job_id, epoch)
        return job, self.d.worker_item(job_id, epoch)

    def progress(self, node: str, job_id: str, epoch: int, step: int, total: int) -> dict[str, Any]:
        job, item = self._checked_item(node, job_id, epoch)
        return view({**job, **item.set_progress(int(step), int(total))})

    def beat(self, node: str, job_id: str, epoch: int) -> dict[str, Any]:
        job, item = self._checked_item(node, job_id, epoch)
        return view({**job, **item.heartbeat()})

    def mark_running(self, node: str, job_id: str, epoch: int) -> dict[str, Any]:
        return {"moved": self._item(node, job_id, epoch).mark_running()}

    def checkpoint(self, node: str, job_id: str, epoch: int, key: str, sha256: str, step: int) -> dict[str, Any]:
        key = checked_key(job_id, key, "key")
        self._item(node, job_id, epoch).set_checkpoint(key, str(sha256), int(step))
        return {"checkpoint": {"key": key, "sha256": sha256, "step": int(step)}}

    def generated(self, node: str, job_id: str, epoch: int, key: str, sha256: str,
                  files: int | None = None) -> dict[str, Any]:
        ref: dict[str, Any] = {"key": checked_key(job_id, key, "key"), "sha256": str(sha256)}
        if files is not None:
            ref["files"] = int(files)
        self._item(node, job_id, epoch).set_generated(ref)
        return {"generated": ref}

    def staging(self, node: str, job_id: str, epoch: int, staging: dict[str, Any]) -> dict[str, Any]:
        self._item(node, job_id, epoch).record_attempt({"staging": staging})
        return {"staging": staging}

    def phases(self, node: str, job_id: str, epoch: int, phases: dict[str, Any]) -> dict[str, Any]:
        """The attempt's phase timings (:func:`gpufleet.phases.parse`: a malformed record is a 400)."""
        try:
            record = parse_phases(phases)
        except ValueError as err:
            raise ValidationFailed(str(err), field="phases") from err
        self._item(node, job_id, epoch).record_attempt({"phases": record})
        return {"phases": record}

    def event(self, node: str, job_id: str, epoch: int, kind: str, detail: dict[str, Any]) -> dict[str, Any]:
        if kind not in NODE_EVENTS:
            raise ValidationFailed(f"kind must be one of {sorted(NODE_EVENTS)}", field="kind")
        self._item(node, job_id, epoch).add_event(kind, dict(detail))
        return {"kind": kind}

    def credentials(self, node: str, job_id: str, epoch: int) -> dict[str, Any]:
        _job, attempt = self._checked(node, job_id, epoch)
        if supervisor.bound_attempt(node) is not None:
            return self._supervisor_session(job_id, epoch, _job, attempt)
        if self.d.credentials is None:
            raise NotAllowed("this node API vends no credentials")
        inputs = self._owned_inputs(job_id, _job, attempt)
        b = self.d.buckets
        policy = session_policy(job_id, checkpoints=b.checkpoints, outputs=b.outputs, logs=b.logs, inputs=inputs,
                                partition=self.d.partition, models=self.d.model_s3_root)
        return self.d.credentials.vend(session_name=f"{node}@{job_id}"[:64], policy=policy)

    # ------------------------------------------------------------------ cloud supervisors
    def exchange_supervisor_token(self, job_id: str, epoch: int, token: str) -> dict[str, Any]:
        """A cloud attempt's one-time token → its supervisor's session (see module and
        :mod:`gpufleet.nodeapi.supervisor`)."""
        if self.d.supervisor_credentials is None:
            raise NotAllowed("this node API vends no supervisor credentials")
        job = self.d.runs.job(job_id, NODE_JOB_FIELDS)
        attempt = self.d.runs.attempt(job_id, epoch, SUPERVISOR_ATTEMPT_FIELDS) if job is not None else None
        if job is None or not supervisor.claimable(attempt, token):
            raise supervisor.refuse()
        current = int(job.get("current_epoch", -1))
        if int(epoch) != current:
            raise StaleEpoch(f"epoch {epoch} is stale (current {current})", current_epoch=current)
        if not self.d.runs.claim_supervisor_token(job_id, epoch, supervisor.token_sha256(token), self.d.clock.now()):
            raise supervisor.refuse()  # claimed meanwhile
        return self._supervisor_session(job_id, epoch, job, attempt or {})

    def _owned_inputs(self, job_id: str, job: dict[str, Any], attempt: dict[str, Any]) -> list[str]:
        """The attempt's recorded inputs that are its job's tenant's; the others are withheld (module contract)."""
        rule = self.d.ownership or InputOwnership.of({self.d.buckets.outputs})
        tenant = str(job.get("tenant") or "")
        recorded = [str(u) for u in attempt.get("inputs") or []]
        owned = [u for u in recorded if rule.owned(u, tenant)]
        if len(owned) < len(recorded):  # an operator's signal: a spec got past admission (or the rule changed)
            self.d.metrics.log("inputs_withheld", {"job_id": job_id, "tenant": tenant,
                                                   "withheld": [u for u in recorded if u not in owned]})
        return owned

    def _supervisor_session(self, job_id: str, epoch: int, job: dict[str, Any],
                            attempt: dict[str, Any]) -> dict[str, Any]:
        if self.d.supervisor_credentials is None:
            raise NotAllowed("this node API vends no supervisor credentials")
        b = self.d.buckets
        policy = supervisor.session_policy(job_id, epoch, checkpoints=b.checkpoints, outputs=b.outputs, logs=b.logs,
                                           api_arn=self.d.node_api_arn,
                                           inputs=self._owned_inputs(job_id, job, attempt),
                                           partition=self.d.partition, models=self.d.model_s3_root)
        creds = self.d.supervisor_credentials.vend(session_name=supervisor.session_name(job_id, epoch), policy=policy)
        return {**creds, "job_id": job_id, "epoch": int(epoch)}

    # ------------------------------------------------------------------ the node itself
    def node_heartbeat(self, node: str, report: LivenessReport) -> dict[str, Any]:
        reg = self.d.nodes.registration(node)
        if reg is None:
            raise NotRegistered(f"node {node!r} is not registered")
        now = self.d.clock.now()
        item = node_item(reg, report, now=now, max_ttl_s=self.d.max_node_ttl_s)
        previous = self.d.nodes.put(item, registered_at=reg.registered_at)
        if self.d.events is not None and (became_usable(previous, item, now) or freed_capacity(previous, item, now)):
            self._announce_ready(node, reg.pool)
        if report.metrics is not None:
            self._emit_node_metrics(node, reg.pool, node_metrics(reg, report.metrics))
        return item

    def _announce_ready(self, node: str, pool: str) -> None:
        """``NodeReady`` on the bus: the scheduler places the jobs waiting for this node's capacity now. Best effort:
        the timer's pass sees the node too, so a failed put is logged, not raised (the heartbeat landed)."""
        try:
            self.d.events.put("NodeReady", {"node_id": node, "pool": pool})
        except TransientError as err:
            self.d.metrics.log("node_ready_not_sent", {"node": node, "pool": pool, "error": str(err)[:300]})

    def _emit_node_metrics(self, node: str, pool: str, got: dict[str, Any]) -> None:
        m, dims = self.d.metrics, {M.POOL: pool}
        if got["gpu_busy"]:
            m.put(M.NODE_GPU_BUSY, list(got["gpu_busy"].values()), dims)
        m.put(M.NODE_CACHE_HITS, got["cache_hits"], dims)
        m.put(M.NODE_CACHE_MISSES, got["cache_misses"], dims)
        m.log("node_metrics", {"node": node, "pool": pool, **got})

    def registration(self, node: str) -> dict[str, Any]:
        reg = self.d.nodes.registration(node)
        if reg is None:
            raise NotRegistered(f"node {node!r} is not registered")
        return reg.model_dump(mode="json")
