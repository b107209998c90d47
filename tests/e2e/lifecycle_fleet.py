"""The fleet around the deployed state machine in the lifecycle e2e tests.

:class:`Fleet` plays, per the contracts in docs/contracts.md:
- the scheduler pass: picks PENDING jobs with a placement token (gsi3), issues the attempt's epoch,
  moves the job to SCHEDULED with its placement, completes the token; tracks GPU usage and the
  lifecycle's quota releases (``release(job_id, epoch)``);
- on-prem agents: one thread per node queue; each message is an envelope with a task token;
  heartbeats with SendTaskHeartbeat, fenced progress/checkpoint/generated writes, SendTaskSuccess/Failure;
- the cloud container and the finalize stage: run by the local Batch runner from the envelope in
  the container command, exiting with :class:`gpufleet.envelope.ExitCode` codes.

Each job's :class:`Plan` scripts where its attempts go and how its workers behave, and records what
happened (inference runs, finalize runs, resume points, the late writes of a fenced-off worker).
These stand in for the scheduler pass, agent and runtime until they land; the seams are
:meth:`Fleet.place`, :meth:`Fleet.run_generate` and :meth:`Fleet.run_finalize`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.envelope import Envelope, ExitCode
from gpufleet.errors import GpufleetError, StaleEpoch
from gpufleet.lifecycle import jobio, ledger, steps
from gpufleet.lifecycle.billing import Charge, Outcome
from gpufleet.status import JobStatus
from gpufleet.store import jobs
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.fencing import fenced_update, issue_epoch

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
        self.usage: dict[str, float] = {}
        self.releases: list[tuple[str, int]] = []
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

    def release(self, job_id: str, epoch: int) -> None:
        """The quota release the lifecycle calls (scheduler store contract)."""
        with self._lock:
            self.releases.append((job_id, epoch))
            placement = next((p for p in self.plans.get(job_id, Plan([])).placements if p["epoch"] == epoch), None)
            if placement:
                self.usage[job_id] = self.usage.get(job_id, 0.0) - placement["gpu_milli"] / 1000

    # ------------------------------------------------------------------ scheduler pass

    def _scheduler_loop(self) -> None:
        while not self._stop.is_set():
            resp = self.ddb.query(
                TableName=self.table, IndexName="gsi3",
                KeyConditionExpression="gsi3pk = :p", ExpressionAttributeValues={":p": {"S": "PENDING"}},
            )
            for raw in resp.get("Items", []):
                job = unmarshal(raw)
                if job.get("placement_token") and job["job_id"] in self.plans:
                    try:
                        self.place(job)
                    except (GpufleetError, ClientError) as err:  # lost a race with the job: next pass
                        self.errors.append(f"place {job['job_id']}: {err}")
            time.sleep(0.2)

    def place(self, job: dict[str, Any]) -> None:
        plan = self.plans[job["job_id"]]
        i = min(len(plan.placements), len(plan.targets) - 1)
        target, where = plan.targets[i]
        observed = int(job.get("current_epoch", 0))
        epoch = observed + 1
        placement: dict[str, Any] = {
            "epoch": epoch, "attempt": len(plan.placements) + 1, "target": target,
            "gpu_indices": [0], "gpu_milli": 1000, "price_per_gpu_hour": plan.price,
        }
        if target == "onprem":
            placement.update(pool="onprem-a", node=where, queue_url=self.stack.node_queues[where])
        else:
            placement.update(pool=where, node=None, job_queue=f"gpufleet-{where}", job_definition="gpufleet-gpu")
        issue_epoch(self.ddb, self.table, job["job_id"], observed, {"placement": placement})
        jobs.transition(self.ddb, self.table, job["job_id"], [JobStatus.PENDING], JobStatus.SCHEDULED,
                        remove=("placement_token",), detail={"epoch": epoch})
        with self._lock:
            plan.placements.append(placement)
            self.usage[job["job_id"]] = self.usage.get(job["job_id"], 0.0) + 1.0
        self.sfn.send_task_success(taskToken=job["placement_token"], output=json.dumps(placement))

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
