"""Scripted workers for benchmarks/control_plane_cost.py (not used by any test).

The control plane's request count does not depend on what a worker computes, so the cost benchmark
drives the lifecycle with these scripted workers on in-process moto (their own requests are counted
apart as "worker"). The e2e suite runs the real agent and runtime instead (tests/e2e/).

:class:`Fleet` plays, per the contracts in docs/contracts.md:
- around the REAL scheduler pass (:func:`gpufleet.scheduler.passes.run_pass`, default pools of
  gpufleet/pools.py): nodes are NODE# items; before each pass the plan's target for the attempt is
  made the only capacity (its node's heartbeat fresh, the others' expired, or only its cloud pool
  offered), so the real commit issues the epoch, the placement, the allocations and the quota usage,
  and the lifecycle's quota release is the real ``gpufleet.store.placements.release``;
- on-prem agents: one thread per node queue; each message is an envelope with a task token;
  heartbeats with SendTaskHeartbeat, fenced progress/checkpoint/generated writes, SendTaskSuccess/Failure;
- the cloud container and the finalize stage: run by the local Batch runner from the envelope in
  the container command, exiting with :class:`gpufleet.envelope.ExitCode` codes.

Each job's :class:`Plan` scripts where its attempts go and how its workers behave, and records what
happened (inference runs, finalize runs, resume points, the late writes of a fenced-off worker).
The workers are stand-ins for the agent and runtime so that faults (silence, crashes, preemption,
user errors, finalize failures) can be injected per attempt; the seams are :meth:`Fleet.run_generate`
and :meth:`Fleet.run_finalize` (tests/e2e/test_cli_stack.py runs the real agent and runtime).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.clock import SystemClock, iso
from gpufleet.envelope import Envelope, ExitCode
from gpufleet.errors import GpufleetError, StaleEpoch
from gpufleet.lifecycle import jobio, ledger, steps
from gpufleet.lifecycle.billing import Charge, Outcome
from gpufleet.pools import Pool, load_pools
from gpufleet.scheduler.passes import run_pass
from gpufleet.status import JobStatus
from gpufleet.store import jobs
from gpufleet.store.fencing import fenced_update
from gpufleet.store.nodes import put_node
from gpufleet.store.scheduling import pass_stores
from gpufleet.store.snapshot import _query_pending

ONPREM_POOL = "onprem-a"

TOTAL_STEPS = 4


@dataclass
class Plan:
    #: per attempt: ("onprem", node_id) or ("cloud", "gpu-spot" | "gpu-ondemand")
    targets: list[tuple[str, str]]
    #: per attempt: ok | silent | crash | preempt | user_error | until_cancel
    behaviours: list[str] = field(default_factory=lambda: ["ok"])
    #: per finalize run: ok | fail
    finalize: list[str] = field(default_factory=lambda: ["ok"])
    blocked: bool = False
    price: float = 3.6
    # what happened
    placements: list[dict[str, Any]] = field(default_factory=list)
    inference_runs: int = 0
    finalize_runs: int = 0
    resumed_from: list[int] = field(default_factory=list)
    late_writes: dict[str, str] = field(default_factory=dict)
    told_cancel: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Fleet:
    def __init__(self, stack) -> None:
        self.stack = stack
        self.ddb = stack.c("dynamodb")
        self.sfn = stack.c("stepfunctions")
        self.sqs = stack.c("sqs")
        self.s3 = stack.c("s3")
        self.table = stack.tables.jobs
        self.plans: dict[str, Plan] = {}
        self.pools = load_pools({})
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle of the fleet

    def start(self) -> None:
        self._spawn(self._scheduler_loop)
        for node, url in self.stack.node_queues.items():
            self._spawn(self._agent_loop, node, url)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    # ------------------------------------------------------------------ the real scheduler pass

    def _scheduler_loop(self) -> None:
        """Run the real pass (``gpufleet.scheduler.passes.run_pass``) for each planned PENDING job; the
        plan's target for the attempt is made the only capacity the pass sees (see :meth:`steer`).
        The pass is polled, not triggered by JobPending (moto's EventBridge cannot deliver to Lambda)."""
        while not self._stop.is_set():
            for job in _query_pending(self.ddb, self.table, None):
                if job.get("placement_token") and job["job_id"] in self.plans:
                    try:
                        self.place(job)
                    except (GpufleetError, ClientError) as err:  # lost a race with the job: next pass
                        self.errors.append(f"place {job['job_id']}: {err}")
            time.sleep(0.2)

    def steer(self, plan: Plan) -> tuple[Pool, ...]:
        """Make the plan's next target the only capacity: its node's heartbeat is fresh and the others'
        expired (an on-prem target), or only its cloud pool is offered. Returns the pools for the pass."""
        target, where = plan.targets[min(len(plan.placements), len(plan.targets) - 1)]
        now = time.time()
        for node, url in self.stack.node_queues.items():
            live = target == "onprem" and node == where
            put_node(self.ddb, self.stack.tables.control, node_item(node, url, now, live))
        wanted = ONPREM_POOL if target == "onprem" else where
        return tuple(p for p in self.pools if p.name == wanted)

    def place(self, job: dict[str, Any]) -> None:
        plan = self.plans[job["job_id"]]
        with self._lock:
            report = run_pass(pass_stores(self.ddb, self.stack.tables, sfn=self.sfn), pools=self.steer(plan),
                              clock=SystemClock())
            if report.lost_reasons:
                self.errors.extend(report.lost_reasons)
            after = jobs.get_job(self.ddb, self.table, job["job_id"])
            epoch = int(after.get("current_epoch", 0))
            if epoch > int(job.get("current_epoch", 0)) and after.get("placement"):
                plan.placements.append(after["placement"])

    # ------------------------------------------------------------------ on-prem agent

    def _agent_loop(self, node: str, url: str) -> None:
        while not self._stop.is_set():
            msgs = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=0).get("Messages", [])
            if not msgs:
                time.sleep(0.2)
                continue
            msg = msgs[0]
            self.sqs.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
            env = Envelope.model_validate_json(msg["Body"])
            self._spawn(self._agent_run, env)

    def _agent_run(self, env: Envelope) -> None:
        """One on-prem attempt: a heartbeat thread (as the agent has) runs beside the work until the
        work ends or goes silent."""
        token = env.task_token
        beating = threading.Event()
        beating.set()

        def beat() -> None:
            interval = max(0.2, env.heartbeat_seconds / 4)
            while beating.is_set() and not self._stop.is_set():
                try:
                    self.sfn.send_task_heartbeat(taskToken=token)
                except ClientError:  # the task timed out or ended: nothing left to keep alive
                    return
                time.sleep(interval)

        self._spawn(beat)
        code, out = self.run_generate(env, beating.clear)
        beating.clear()
        if code is ExitCode.SUCCEEDED:
            self.sfn.send_task_success(taskToken=token, output=json.dumps(out))
        elif code is not ExitCode.FENCED:
            self.sfn.send_task_failure(taskToken=token, error=code.name, cause=json.dumps(out))

    # ------------------------------------------------------------------ Batch runner (cloud + finalize)

    def batch_runner(self, job) -> tuple[int, str]:
        """Run a Batch job (the harness's ``LocalJob`` or a moto job) as the container runtime would."""
        command = list(getattr(job, "command", None) or job.container_overrides.get("command") or [])
        env = Envelope.model_validate_json(command[command.index("--envelope-json") + 1])
        if env.stage == "finalize":
            return int(self.run_finalize(env)), ""
        code, out = self.run_generate(env, lambda: None)  # Batch has no task heartbeat
        return int(code), str(out.get("detail", ""))

    # ------------------------------------------------------------------ the runtime contract

    def _job(self, job_id: str) -> dict[str, Any]:
        return jobs.get_job(self.ddb, self.table, job_id)

    def run_generate(self, env: Envelope, go_quiet) -> tuple[ExitCode, dict[str, Any]]:
        """The generate stage. ``go_quiet()`` stops this worker's heartbeats (the "silent" behaviour)."""
        plan = self.plans[env.job_id]
        behaviour = plan.behaviours[min(env.attempt, len(plan.behaviours)) - 1]
        started = time.time()
        node = env.placement.node if env.placement else None
        try:
            jobio.fenced_transition(self.ddb, self.table, env.job_id, env.epoch, [JobStatus.SCHEDULED],
                                    JobStatus.RUNNING, {"running_since": started})
            ckpt = self._job(env.job_id).get("checkpoint") or {}
            start = int(ckpt.get("step", 0))
            plan.resumed_from.append(start)
            for step in range(start, TOTAL_STEPS):
                if behaviour == "crash":
                    return ExitCode.SYSTEM_ERROR, {"epoch": env.epoch, "node": node, "detail": "segfault in kernel"}
                if behaviour == "user_error":
                    return ExitCode.USER_ERROR, {"epoch": env.epoch, "node": node, "detail": "bad input"}
                fenced_update(self.ddb, self.table, env.job_id, env.epoch,
                              {"progress": {"step": step + 1, "total": TOTAL_STEPS}})
                if step + 1 == 2:
                    key = f"{env.s3.checkpoint_prefix}ckpt-{step + 1:04d}.bin"
                    data = f"state@{step + 1}".encode()
                    self.s3.put_object(Bucket=env.s3.bucket_checkpoints, Key=key, Body=data)
                    fenced_update(self.ddb, self.table, env.job_id, env.epoch, {"checkpoint": {
                        "key": key, "sha256": hashlib.sha256(data).hexdigest(), "step": step + 1}})
                    if behaviour == "preempt":
                        return ExitCode.PREEMPTED, {"epoch": env.epoch, "node": node, "detail": "spot reclaim"}
                    if behaviour == "silent":
                        go_quiet()
                        return self._go_silent(env, plan)
                if behaviour == "until_cancel":
                    while not self._job(env.job_id).get("cancel_requested"):
                        time.sleep(0.2)
                    plan.told_cancel = True
                    return ExitCode.CANCELLED, {"epoch": env.epoch, "node": node, "detail": "cancelled",
                                                "wall_seconds": time.time() - started}
                time.sleep(0.05)
            key = f"{env.s3.output_prefix}generated-e{env.epoch}.pt"
            self.s3.put_object(Bucket=env.s3.bucket_outputs, Key=key, Body=b"latents")
            generated = {"key": key, "sha256": hashlib.sha256(b"latents").hexdigest()}
            fenced_update(self.ddb, self.table, env.job_id, env.epoch, {"generated": generated})
            with self._lock:
                plan.inference_runs += 1
            return ExitCode.SUCCEEDED, {"epoch": env.epoch, "gpu_seconds": 2.0, "generated": generated}
        except StaleEpoch:
            return ExitCode.FENCED, {"epoch": env.epoch, "node": node, "detail": "fenced"}

    def _go_silent(self, env: Envelope, plan: Plan) -> tuple[ExitCode, dict[str, Any]]:
        """Stop heartbeating until a newer attempt exists, then try the writes a late worker would."""
        deadline = time.time() + 30
        while time.time() < deadline and int(self._job(env.job_id).get("current_epoch", 0)) <= env.epoch + 1:
            time.sleep(0.1)
        attempts = {
            "progress": lambda: fenced_update(self.ddb, self.table, env.job_id, env.epoch,
                                              {"progress": {"step": 3, "total": TOTAL_STEPS}}),
            "publish": lambda: steps.publish(_deps(), {"job_id": env.job_id}, epoch=env.epoch),
            "billing": lambda: ledger.record(
                self.ddb, self.table, self.stack.tables.ledger, self._job(env.job_id),
                env.epoch, Charge(True, 2.0, __import__("decimal").Decimal("0.002"), None, Outcome.SUCCEEDED),
                pool="onprem-a", price=3.6, at="2026-01-01T00:00:00.000Z"),
        }
        for name, write in attempts.items():
            try:
                write()
                plan.late_writes[name] = "accepted"
            except StaleEpoch:
                plan.late_writes[name] = "StaleEpoch"
            except GpufleetError as err:
                plan.late_writes[name] = type(err).__name__
        return ExitCode.FENCED, {}

    def run_finalize(self, env: Envelope) -> ExitCode:
        plan = self.plans[env.job_id]
        with self._lock:
            plan.finalize_runs += 1
            behaviour = plan.finalize[min(plan.finalize_runs, len(plan.finalize)) - 1]
        if behaviour == "fail":
            return ExitCode.SYSTEM_ERROR
        if plan.blocked:
            fenced_update(self.ddb, self.table, env.job_id, env.epoch,
                          {"moderation": {"blocked": True, "reason": "frame classifier: unsafe"}})
            return ExitCode.SUCCEEDED
        video, manifest = f"{env.s3.output_prefix}video.mp4", f"{env.s3.output_prefix}manifest.c2pa"
        self.s3.put_object(Bucket=env.s3.bucket_outputs, Key=video, Body=b"mp4")
        self.s3.put_object(Bucket=env.s3.bucket_outputs, Key=manifest, Body=b"c2pa")
        fenced_update(self.ddb, self.table, env.job_id, env.epoch, {"output": {
            "video_key": video, "manifest_key": manifest, "watermark_payload": "0" * 12}})
        return ExitCode.SUCCEEDED


def _deps():
    from lambdas.tasks._deps import deps

    return deps()


def node_item(node_id: str, queue_url: str, now: float, live: bool) -> dict[str, Any]:
    """A node item as the agent writes it (docs/contracts.md, "Node item"): one A100; ``live`` = fresh
    heartbeat, else expired (the scheduler ignores it)."""
    return {
        "node_id": node_id, "pool": ONPREM_POOL, "queue_url": queue_url, "gpu_type": "A100",
        "gpus": [{"index": 0, "memory_gb": 80, "milli_free": 1000}], "cpu_milli_free": 32000,
        "memory_mib_free": 256000, "labels": {}, "cached_models": [], "datasets": [],
        "heartbeat_at": iso(now), "expires_at": int(now + 60) if live else int(now - 60), "draining": False,
        "accelerator": "nvml", "running_jobs": 0,
    }
