"""Record every AWS call each control-plane function makes, by running it on the deployed stack.

The synthesized template is deployed into in-process moto (:class:`gpufleet.local.harness.LocalStack`)
and driven through its entry points: jobs are submitted through the API handler (API Gateway proxy
events), the jobs stream starts workflows (outbox), the deployed state machine runs the task Lambdas,
the scheduler pass places jobs, Batch jobs run the real runtime in-process (tiny model on the CPU; an operator
published it to the stack's models root first, so every cloud generate attempt loads it as a published model, reading
``models/wan-tiny/`` of the models bucket with the GPU definition's role: the definition's ``GPUFLEET_MODEL_S3_ROOT``),
Notify queues webhooks that the sender delivers to a loopback receiver, a node registers through the
registration function. Scenarios (besides recovery, below): a job that succeeds on a cloud pool (with a webhook), one whose
prompt is refused (MarkRejected), one whose worker fails with a user error (ClassifyFailure), one
whose finalize stage fails on every try (MarkFinalizeFailed; its generate stage is not run), one whose
generated frames moderation blocks (finalize moves the raw output to ``quarantine/``; BLOCKED), one
cancelled while it waits for a placement, one cancelled while its Batch job runs, a cloud container job
(RunCloudContainer: the dispatch function registers the tools image's per-digest definition and submits the
multi-container job; the supervisor, the real runtime in this process, exchanges its token at the deployed node API
through a local gateway and answers the Run state; the tenant runs the tools image under rootless podman;
CollectOutputs and the file listing of ``/output``), the
API's reads, and an on-prem run: an operator registers a node through ``POST /v1/nodes``, the node
reports its capacity, the scheduler places a job on it, RunOnPrem's dispatch sends the node its
envelope, and the node runs the real runtime's generate stage through the deployed node API (its job
writes are node API calls) and completes the attempt, which finalize and publish then finish on the
cloud side; a second job placed there is cancelled through the API (its nudge on the node's signal queue, the
node's CANCELLED report); then a cloud supervisor's token exchange at the node API (``POST /v1/node/cloud/credentials``, the
token's hash put on that attempt as RunCloud's record would) and one attempt call with its session. Recovery and tenant tools: a job whose finalize fails every try is re-finalized by an
operator (``POST /v1/admin/jobs/{id}/refinalize``: the outbox starts run 1 at ResumeFinalize), the
operator inspects it and lists quarantined jobs; the tenant retries its failed job, submits a job
array that waits for an on-prem placement and cancels it by array id, and reads its costs; the operator
diagnoses the last hour's GPU time; a job not started by its deadline is expired by the scheduler pass. Webhook
endpoints: the tenant registers one (the loopback receiver) that every job's completion is fanned out to, and
reads, lists, disables and deletes another.

Every boto3 call is attributed to the function whose handler is running on that thread (a stack, so
a stream consumer invoked inside another function's write is its own caller); calls made by the
runtime inside a Batch job are attributed to the job definition it was submitted with
(``batch_job:<definition name>``, :func:`batch_principal`), whose job role it runs under on AWS: the GPU
definition's run attempts (generate) and the CPU definition's finalize stage (the re-finalized job's clip, over the
survey's FinalizeLambda bound; every other clip finalizes in FinalizeLambda, principal ``finalize``); a cloud container
job's supervisor (no job role: its calls use the session the node API vended) is ``cloud_supervisor``. Every CloudWatch EMF line written to stdout
(:mod:`gpufleet.metrics.emf`) is kept with the principal that wrote it (``Survey.emf``). :func:`survey` returns plain data (the
calls and the deployed physical ids), so the stack is gone once it returns.
"""

from __future__ import annotations

import copy
import io
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import botocore.client

from gpufleet.provenance.keys import watermark_keys_from_secret

#: principals of the calls the runtime makes inside a Batch job: one per job definition (its job role)
BATCH_RUN, BATCH_FINALIZE = "batch_job:gpufleet-gpu", "batch_job:gpufleet-cpu"
BATCH_KEYS = (BATCH_RUN, BATCH_FINALIZE)


def batch_principal(job_definition: str) -> str:
    """The principal of a Batch job's calls: its job definition (``batch_job:<name>``), whose role it runs under."""
    return f"batch_job:{job_definition}"


#: FinalizeRoute's bound in the survey's deployment: the scenarios' 5-frame clips (5 × 256 × 256 delivered pixels)
#: finalize in FinalizeLambda, the re-finalized job's 9-frame clip in the CPU Batch job, so both roles are surveyed
FINALIZE_LAMBDA_MAX_PIXELS = 6 * 256 * 256
#: the survey deploys the template tests' context (gpufleet.local.synth.LOCAL_CONTEXT, whose bound is the one above)
SURVEY_CONTEXT: dict[str, Any] = {}

ACCOUNT, REGION = "123456789012", "us-east-1"
ALICE = f"arn:aws:iam::{ACCOUNT}:user/alice"
OPERATOR = f"arn:aws:iam::{ACCOUNT}:role/platform-operator"
BLOCKED = "BLOCKED prompt"
JOB_TIMEOUT_S = 90.0
#: the value of a container job's env variable (tenant content that must stay out of state and overrides)
CONTAINER_ENV_VALUE = "survey-env-value-7f3a"
#: the prompts the scenarios submit
PROMPTS = ("a red fox running through snow", f"{BLOCKED} of a fox", "a fox, user-error", "a fox that waits",
           "a fox, hold", "a fox on a node", "a fox, skin-output")


@dataclass
class Survey:
    """Recorded calls by principal (function key or ``batch_job:<definition>``), and the deployment's physical ids."""

    calls: dict[str, list[tuple[str, str, dict]]] = field(default_factory=lambda: defaultdict(list))
    physical: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    emf: list[tuple[str, str]] = field(default_factory=list)  # (principal, EMF line)
    #: why the container scenario did not run (rootless podman unavailable), or None
    containers_unavailable: str | None = None
    #: job id → its execution's history (every state's input and output, every task's parameters), as JSON
    histories: dict[str, str] = field(default_factory=dict)
    #: the command (container overrides) of every Batch job the workflow submitted
    batch_commands: list[list[str]] = field(default_factory=list)
    #: the supervisor container's command of every cloud container job (RunCloudContainer's multi-container jobs)
    supervisor_commands: list[list[str]] = field(default_factory=list)
    #: the tenant container's environment of every such job (the spec's env and the contract variables)
    tenant_envs: list[dict[str, str]] = field(default_factory=list)
    #: what the tenants put in their specs (prompts, container env values): none may reach the two above
    tenant_content: list[str] = field(default_factory=list)


class Recorder:
    """Wraps ``BaseClient._make_api_call``: each call goes to the principal on top of the thread's stack."""

    def __init__(self, survey: Survey) -> None:
        self.survey = survey
        self._local = threading.local()
        self._lock = threading.Lock()

    def _stack(self) -> list[str]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    @contextmanager
    def acting_as(self, principal: str) -> Iterator[None]:
        self._stack().append(principal)
        try:
            yield
        finally:
            self._stack().pop()

    @contextmanager
    def installed(self) -> Iterator[None]:
        original = botocore.client.BaseClient._make_api_call
        recorder = self

        def recording(client, operation_name, api_params):
            stack = recorder._stack()
            if stack:
                service = client.meta.service_model.service_id.hyphenize()
                with recorder._lock:
                    recorder.survey.calls[stack[-1]].append((service, operation_name, copy.deepcopy(api_params)))
            return original(client, operation_name, api_params)

        # a handler's worker threads (the snapshot's partition queries, the pass's parallel writes) act as the
        # principal that submitted them: their calls are that function's calls
        original_submit = ThreadPoolExecutor.submit

        def submit(pool, fn, /, *args, **kwargs):
            acting = list(recorder._stack())
            if not acting:
                return original_submit(pool, fn, *args, **kwargs)

            def run(*a, **kw):
                recorder._local.stack = list(acting)
                try:
                    return fn(*a, **kw)
                finally:
                    recorder._local.stack = []

            return original_submit(pool, run, *args, **kwargs)

        botocore.client.BaseClient._make_api_call = recording
        ThreadPoolExecutor.submit = submit
        try:
            yield
        finally:
            botocore.client.BaseClient._make_api_call = original
            ThreadPoolExecutor.submit = original_submit


class _EmfTee(io.TextIOBase):
    """Stands in for ``sys.stdout``: forwards everything, and keeps each EMF line with the principal on top
    of the writing thread's stack (the function whose handler is running)."""

    def __init__(self, inner, recorder: Recorder) -> None:
        self.inner, self.recorder = inner, recorder

    def write(self, text: str) -> int:
        stack = self.recorder._stack()
        for line in text.splitlines():
            if line.startswith("{") and '"_aws"' in line:
                with self.recorder._lock:
                    self.recorder.survey.emf.append((stack[-1] if stack else "", line))
        return self.inner.write(text)

    def flush(self) -> None:
        self.inner.flush()


class _Receiver(BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        _Receiver.received.append(self.rfile.read(int(self.headers.get("content-length") or 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_a) -> None:
        pass


#: functions only the container scenario calls (skipped with it where podman cannot run)
CONTAINER_ONLY = frozenset({"collect_outputs", "dispatch_cloud"})
#: (function, action) that only the container scenario exercises (the API lists a container job's files)
CONTAINER_ONLY_CALLS = frozenset({("api", "s3:ListBucket")})


def _api_event(method: str, path: str, body: dict | None = None, headers: dict | None = None,
               arn: str = ALICE) -> dict:
    from gpufleet.devstack.gateway import build_event

    raw = b"" if body is None else json.dumps(body).encode()
    return build_event(method, path, {"Content-Type": "application/json", **(headers or {})}, raw, user_arn=arn)


class _Driver:
    #: Batch job names whose finalize may succeed (a re-finalize after the operator fixed the cause)
    finalize_ok: set[str]

    def __init__(self, stack, recorder: Recorder, cache: Path, tmp: Path, webhook_url: str) -> None:
        self.finalize_ok = set()
        self.stack, self.rec, self.cache, self.tmp, self.webhook_url = stack, recorder, cache, tmp, webhook_url
        self.holding = threading.Event()  # a "hold" job's Batch job is running (so a cancel must terminate it)
        self.sfn = stack.client("stepfunctions")
        self.ddb = stack.client("dynamodb")
        self.histories: dict[str, str] = {}
        self.batch_commands: list[list[str]] = []
        self.supervisor_commands: list[list[str]] = []
        self.tenant_envs: list[dict[str, str]] = []

    # -- the API ----------------------------------------------------------------------------
    def api(self, method: str, path: str, body: dict | None = None, headers: dict | None = None, *,
            arn: str = ALICE, function: str = "api") -> tuple[int, Any]:
        """A request to the API through ``function`` (API Gateway's integration for that route: infra/api.py)."""
        resp = self.stack.invoke(function, _api_event(method, path, body, headers, arn))
        text = resp.get("body") or "null"
        return resp["statusCode"], json.loads(text) if text.lstrip()[:1] in "[{n" else text

    def submit(self, prompt: str, key: str, *, webhook: bool = False, pool: str = "cloud-ondemand",
               frames: int = 5) -> str:
        spec: dict[str, Any] = {"workload": {"kind": "video.generate", "prompt": prompt, "frames": frames, "steps": 2,
                                             "width": 64, "height": 64, "seed": 1},
                                "pools": [pool]}
        if webhook:
            spec["webhook"] = {"url": self.webhook_url, "events": ["started", "progress", "completed"]}
        status, body = self.api("POST", "/v1/jobs", spec, {"Idempotency-Key": key})
        assert status == 202, body
        return body["job_id"]

    # -- waiting -----------------------------------------------------------------------------
    def _execution(self, job_id: str, run: int = 0) -> dict | None:
        from gpufleet.lifecycle.recovery import execution_name

        arn = (self.stack.outputs.state_machine_arn.replace(":stateMachine:", ":execution:")
               + f":{execution_name(job_id, run)}")
        try:
            return self.sfn.describe_execution(executionArn=arn)
        except self.sfn.exceptions.ExecutionDoesNotExist:
            return None

    def job(self, job_id: str) -> dict:
        from gpufleet.store.dynamo import unmarshal
        from gpufleet.tables import JOB_META, job_pk

        item = self.ddb.get_item(TableName=self.stack.outputs.jobs_table,
                                 Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}}, ConsistentRead=True)
        return unmarshal(item.get("Item")) or {}

    def wait(self, what: str, predicate, timeout: float = JOB_TIMEOUT_S, *,
             schedule: bool | Callable[[], bool] = False) -> Any:
        """``predicate()`` once it is truthy; in between, a scheduler pass when ``schedule`` is True or says so."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if schedule is True or (callable(schedule) and schedule()):
                self.stack.invoke("scheduler", {})
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def finished(self, job_id: str, expect: str = "", *, schedule: bool = True, run: int = 0) -> str:
        def done():
            d = self._execution(job_id, run)
            return d if d and d["status"] != "RUNNING" else None

        # a pass only while the job waits for a placement (every 0.1 s through a whole run: ~130 passes)
        waiting = (lambda: self.job(job_id).get("status") in ("QUEUED", "PENDING")) if schedule else False
        desc = self.wait(f"the end of {job_id}", done, schedule=waiting)
        self.histories[job_id] = json.dumps(
            self.sfn.get_execution_history(executionArn=desc["executionArn"], maxResults=1000)["events"], default=str)
        job = self.job(job_id)
        if expect and job["status"] != expect:
            history = self.sfn.get_execution_history(executionArn=desc["executionArn"])["events"]
            failures = [e for e in history if "Failed" in e["type"] or "TimedOut" in e["type"]]
            raise AssertionError(f"{job_id}: {job['status']}, expected {expect}\n{json.dumps(job, default=str)}\n"
                                 + "failures:\n" + "\n".join(json.dumps(e, default=str)[:1500] for e in failures[:4])
                                 + "\nlast:\n" + "\n".join(json.dumps(e, default=str)[:600] for e in history[-12:]))
        return job["status"]

    def parked(self, job_id: str) -> None:
        self.wait(f"{job_id} waiting for a placement", lambda: self.job(job_id).get("placement_token"))

    # -- Batch jobs: the real runtime, in this process -------------------------------------------
    def execute(self, job) -> tuple[int, str | None]:
        import boto3

        from gpufleet.envelope import ExitCode
        from gpufleet.runtime.main import main
        from gpufleet.runtime.settings import RuntimeSettings

        self.batch_commands.append(list(job.command))
        envelope = json.loads(job.command[job.command.index("--envelope-json") + 1])
        oci = {}
        if envelope["stage"] == "container":  # the real container stage: rootless podman runs the tools image
            from gpufleet.local import oci_image

            oci = oci_image.prepare_local().settings
        # the command carries a pointer envelope (no spec): the scenario reads the prompt from the job item
        prompt = self.job(envelope["job_id"])["spec"]["workload"].get("prompt", "")
        if "user-error" in prompt and envelope["stage"] == "generate":
            return int(ExitCode.USER_ERROR), "the tenant's command failed"
        if "skin-output" in prompt and envelope["stage"] == "generate":  # the real finalize then blocks it
            self._skin_output(envelope["job_id"], int(envelope["epoch"]))
            return int(ExitCode.SUCCEEDED), None
        if "finalize-error" in prompt:  # generate "succeeds" without running; finalize fails every try
            if envelope["stage"] == "generate":
                return int(ExitCode.SUCCEEDED), None
            return int(ExitCode.SYSTEM_ERROR), "the finalize stage crashed"
        if "finalize-fail" in prompt and envelope["stage"] == "finalize" and job.job_name not in self.finalize_ok:
            return int(ExitCode.SYSTEM_ERROR), "the finalize host failed"
        if "hold" in prompt:
            self.holding.set()
            while not job.stop_requested():
                time.sleep(0.05)
            return int(ExitCode.CANCELLED), "terminated"
        # settings and clients read the environment (in-process invocations never change it)
        settings = RuntimeSettings(state_dir=str(self.tmp / job.job_id), cache_dir=str(self.cache),
                                   checkpoint_every_steps=1, checkpoint_every_seconds=0,
                                   checkpoint_overhead_budget=0, log_flush_s=0, log_chunk_lines=3,
                                   torch_threads=1, tiny_generate_side=32, progress_interval_s=0,
                                   # the finalize job definition names the template's signing secret
                                   signing_secret_id=job.environment.get("GPUFLEET_SIGNING_SECRET_ID"),
                                   # the GPU definitions name the deployment's published models
                                   model_s3_root=job.environment.get("GPUFLEET_MODEL_S3_ROOT"),
                                   watermark_secret_id=job.environment.get("GPUFLEET_WATERMARK_SECRET_ID"), **oci)
        s3, dynamodb = boto3.client("s3"), boto3.client("dynamodb")
        secretsmanager = boto3.client("secretsmanager")
        with self.rec.acting_as(batch_principal(job.job_definition)):
            code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=s3,
                        dynamodb=dynamodb, secretsmanager=secretsmanager, stdout=io.StringIO(), install_signals=False)
        return code, None


    def execute_task(self, job) -> tuple[int, str | None]:
        """A cloud container job's multi-container task (RunCloudContainer's Batch job): the local runner's ECS task
        emulation (gpufleet.local.ecs_task) with its supervisor as the real runtime in this process (its node API
        calls go through a local gateway to the deployed node API: the exchange unsigned, then only the session it
        vended) and the tenant under rootless podman once the ready file exists. Its own calls (the vended session's
        objects) are the supervisor's, not a control-plane function's."""
        from gpufleet.batchdef import SUPERVISOR_TOKEN_ENV
        from gpufleet.devstack.gateway import Gateway, moto_sessions
        from gpufleet.local import oci_image
        from gpufleet.local.ecs_task import EcsTaskExecutor
        from gpufleet.nodeapi.app import EXCHANGE_PATH
        from gpufleet.runtime.main import main
        from gpufleet.runtime.settings import RuntimeSettings

        local = oci_image.prepare_local()
        conf = self.stack.client("lambda").get_function_configuration(FunctionName=self.stack.function_name("node_api"))
        role = conf["Environment"]["Variables"]["GPUFLEET_SUPERVISOR_ROLE_ARN"]
        gateway = Gateway(lambda: lambda event, context: self.stack.invoke("node_api", event), [],
                          open_routes=[("POST", EXCHANGE_PATH)], resolve=moto_sessions([role], ACCOUNT)).start()
        ecs = EcsTaskExecutor(local.podman, local.jobs_dir, supervisor_env={})
        saved = os.environ.get("ECS_CONTAINER_METADATA_URI_V4")
        try:
            with ecs.task(job) as (by_name, work, meta, name):
                sup = by_name["supervisor"]
                self.supervisor_commands.append(list(sup["command"]))
                self.tenant_envs.append({e["name"]: str(e["value"]) for e in by_name["tenant"].get("environment", [])})
                env = {e["name"]: str(e["value"]) for e in sup.get("environment") or []}
                done = threading.Event()
                tenant = ecs.start_tenant(by_name["tenant"], work, meta, name, done.is_set)
                os.environ["ECS_CONTAINER_METADATA_URI_V4"] = meta.uri
                settings = RuntimeSettings(state_dir=str(self.tmp / job.job_id), container_sidecar="tenant",
                                           supervisor_token=env[SUPERVISOR_TOKEN_ENV], node_api_url=gateway.url,
                                           sidecar_job_dir=str(work), sidecar_poll_s=0.05)
                meta.set("supervisor", "RUNNING")
                with self.rec.acting_as("cloud_supervisor"):
                    try:
                        code = main(sup["command"][3:], settings=settings, stdout=io.StringIO(),
                                    install_signals=False)
                    finally:
                        done.set()
                meta.set("supervisor", "STOPPED", code)
                local.podman.stop(name, 2)
                tenant.join(timeout=30)
        finally:
            gateway.stop()
            if saved is None:
                os.environ.pop("ECS_CONTAINER_METADATA_URI_V4", None)
            else:
                os.environ["ECS_CONTAINER_METADATA_URI_V4"] = saved
        return code, None

    def _skin_output(self, job_id: str, epoch: int) -> None:
        """Persist skin-toned frames as the attempt's generated output (what the generate stage records), so
        the real finalize stage blocks them and quarantines the raw output."""
        import numpy as np

        from gpufleet.runtime.generate import pack_output
        from gpufleet.store.objectstore import sha256_hex

        frames = np.empty((5, 32, 32, 3), dtype=np.float32)
        frames[...] = np.array([224, 172, 140], dtype=np.float32) / 255.0
        data = pack_output(frames, {"model": "wan-tiny", "fps": 8})
        key = f"jobs/{job_id}/generated/e{epoch:04d}.npz"
        self.stack.client("s3").put_object(Bucket=self.stack.outputs.outputs_bucket, Key=key, Body=data)
        self.ddb.update_item(TableName=self.stack.outputs.jobs_table, Key={"pk": {"S": f"JOB#{job_id}"},
                                                                          "sk": {"S": "META"}},
                             UpdateExpression="SET generated = :g",
                             ExpressionAttributeValues={":g": {"M": {"key": {"S": key},
                                                                     "sha256": {"S": sha256_hex(data)}}}})


class _Node:
    """An on-prem node reaching the deployed node API as API Gateway would hand it its call: the caller is the
    agent role's session named after the node (the function's GPUFLEET_AGENT_ROLE_NAMES)."""

    def __init__(self, stack, node: str) -> None:
        from gpufleet.nodeapi.identity import agent_session_arn

        conf = stack.client("lambda").get_function_configuration(FunctionName=stack.function_name("node_api"))
        role = conf["Environment"]["Variables"]["GPUFLEET_AGENT_ROLE_NAMES"].split(",")[0]
        self.stack, self.node, self.arn = stack, node, agent_session_arn(ACCOUNT, role, node)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        from gpufleet.devstack.gateway import build_event
        from gpufleet.store.nodeapi import _error

        raw = b"" if body is None else json.dumps(body).encode()
        resp = self.stack.invoke("node_api", build_event(method, path, {"Content-Type": "application/json"}, raw,
                                                         user_arn=self.arn))
        out = json.loads(resp.get("body") or "null")
        if resp["statusCode"] >= 300:
            raise _error(resp["statusCode"], out)
        return out

    def attempt(self, job_id: str, epoch: int, op: str, body: dict | None = None) -> dict:
        return self.call("POST", f"/v1/node/jobs/{job_id}/attempts/{epoch}/{op}", body or {})


def _onprem_run(stack, drv: _Driver, cache: Path, tmp: Path) -> tuple[str, str]:
    """The on-prem scenario (module docstring); returns the final status of its job and of the cancelled one."""
    import boto3

    from gpufleet.clock import SystemClock
    from gpufleet.devstack.gateway import build_event
    from gpufleet.envelope import Envelope, ExitCode
    from gpufleet.errors import StaleEpoch, TaskGone
    from gpufleet.runtime import generate
    from gpufleet.runtime.context import StageContext
    from gpufleet.runtime.control import RunControl
    from gpufleet.runtime.reporter import JobItemReporter
    from gpufleet.runtime.settings import RuntimeSettings
    from gpufleet.store.nodeapi import NodeApiJobItem
    from gpufleet.store.objectstore import ObjectStore

    body = {"node_id": "node-8", "pool": "onprem-a", "site": "survey", "gpus": 1, "cpu_milli": 64000,
            "memory_mib": 262144}
    resp = stack.invoke("register_node", build_event("POST", "/v1/nodes", {"Content-Type": "application/json"},
                                                     json.dumps(body).encode(), user_arn=OPERATOR))
    assert resp["statusCode"] == 201, resp
    queue = json.loads(resp["body"])["queue_url"]
    node = _Node(stack, "node-8")
    node.call("POST", "/v1/node/heartbeat", {"free_milli": {"0": 1000}, "cpu_milli_free": 64000,
                                             "memory_mib_free": 262144, "ttl_s": 300,
                                             "metrics": {"gpu_busy": {"0": 0.5}, "cache_hits": 1, "cache_misses": 1}})
    job_id = drv.submit("a fox on a node", "onprem", pool="onprem-a")
    sqs = stack.client("sqs")

    def dispatched():
        """The dispatch, once it is there; a pass runs only while the job waits for one (a pass holds the
        in-process Lambda lock, and the Run task's HeartbeatSeconds — 3 s in the local template — runs from the
        dispatch on)."""
        got = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0).get("Messages")
        if not got and drv.job(job_id).get("status") == "PENDING":
            stack.invoke("scheduler", {})
        return got

    for _ in range(3):  # a loaded host can miss the first beat: the attempt is then fenced off and placed again
        (msg,) = drv.wait(f"{job_id} dispatched to node-8", dispatched)
        env = Envelope.model_validate_json(msg["Body"])
        assert env.task_token is None and "task_token" not in json.loads(msg["Body"])
        try:
            node.attempt(job_id, env.epoch, "heartbeat")
            break
        except StaleEpoch:
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"])
    else:
        raise AssertionError(f"{job_id}: no dispatch of node-8's was still current at its first heartbeat")
    node.attempt(job_id, env.epoch, "credentials")
    job, control = NodeApiJobItem(node, job_id, env.epoch), RunControl()
    settings = RuntimeSettings(state_dir=str(tmp / "onprem"), cache_dir=str(cache), checkpoint_every_steps=1,
                               checkpoint_every_seconds=0, checkpoint_overhead_budget=0, torch_threads=1,
                               tiny_generate_side=32, progress_interval_s=0, async_checkpoints=False,
                               node_id="node-8")
    ctx = StageContext(env, settings, ObjectStore(boto3.client("s3"), node_id="node-8"), job, control,
                       JobItemReporter(job, control, 0, clock=SystemClock()))
    stop = threading.Event()

    def beat() -> None:  # the agent's task heartbeat while the runtime works (HeartbeatSeconds is seconds here)
        while not stop.wait(0.5):
            node.attempt(job_id, env.epoch, "heartbeat")

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        assert generate.run(ctx) == ExitCode.SUCCEEDED
    finally:
        stop.set()
        beater.join(5)
    node.attempt(job_id, env.epoch, "complete", {"gpu_seconds": 1.0})
    try:  # answered once: a second report reaches Step Functions and is refused there
        node.attempt(job_id, env.epoch, "fail", {"error": "SYSTEM_ERROR", "detail": "late"})
    except TaskGone:
        pass
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"])
    status = drv.finished(job_id, "SUCCEEDED")
    _cloud_supervisor(stack, drv, job_id, env.epoch)
    return status, _onprem_cancel(stack, drv, node, queue, json.loads(resp["body"])["signals_url"])


def _onprem_cancel(stack, drv: _Driver, node: _Node, queue: str, signals: str) -> str:
    """A job placed on node-8 and cancelled through the API: its cancel nudges the node's signal queue
    (sqs:SendMessage by the API), the node's heartbeat reads the cancel and the node reports CANCELLED."""
    sqs = stack.client("sqs")
    job_id = drv.submit("a fox cancelled on a node", "onprem-cancel", pool="onprem-a")

    def dispatched():
        got = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0).get("Messages")
        if not got and drv.job(job_id).get("status") == "PENDING":
            stack.invoke("scheduler", {})
        return got

    (msg,) = drv.wait(f"{job_id} dispatched to node-8", dispatched)
    epoch = json.loads(msg["Body"])["epoch"]
    node.attempt(job_id, epoch, "heartbeat")
    status, _ = drv.api("DELETE", f"/v1/jobs/{job_id}")
    assert status == 202 or status == 200, status
    (nudge,) = sqs.receive_message(QueueUrl=signals, WaitTimeSeconds=0)["Messages"]
    assert json.loads(nudge["Body"]) == {"type": "cancel", "job_id": job_id, "epoch": epoch}, nudge["Body"]
    assert node.attempt(job_id, epoch, "heartbeat")["cancel_requested"] is True
    node.attempt(job_id, epoch, "fail", {"error": "CANCELLED", "detail": "cancelled by user"})
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=msg["ReceiptHandle"])
    return drv.finished(job_id, "CANCELLED", schedule=False)


def _cloud_supervisor(stack, drv: _Driver, job_id: str, epoch: int) -> None:
    """A cloud supervisor's token exchange and one attempt call with its session, on the on-prem job's (still
    current) attempt: the token's hash is put there as RunCloud's record would (the node API's calls recorded)."""
    from gpufleet.devstack.gateway import build_event
    from gpufleet.nodeapi import supervisor
    from gpufleet.tables import attempt_sk, job_pk

    token, digest = supervisor.mint()
    drv.ddb.update_item(TableName=stack.outputs.jobs_table,
                        Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": attempt_sk(epoch)}},
                        UpdateExpression="SET #h = :h", ExpressionAttributeNames={"#h": supervisor.TOKEN_ATTR},
                        ExpressionAttributeValues={":h": {"S": digest}})
    raw = json.dumps({"job_id": job_id, "epoch": epoch, "token": token}).encode()
    resp = stack.invoke("node_api", build_event("POST", "/v1/node/cloud/credentials",
                                                {"Content-Type": "application/json"}, raw, user_arn=None))
    assert resp["statusCode"] == 200, resp
    conf = stack.client("lambda").get_function_configuration(FunctionName=stack.function_name("node_api"))
    role = conf["Environment"]["Variables"]["GPUFLEET_SUPERVISOR_ROLE_ARN"].rsplit("/", 1)[-1]
    arn = f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{supervisor.session_name(job_id, epoch)}"
    resp = stack.invoke("node_api", build_event("POST", f"/v1/node/jobs/{job_id}/attempts/{epoch}/view",
                                                {"Content-Type": "application/json"}, b"{}", user_arn=arn))
    assert resp["statusCode"] == 200, resp


def _recovery(drv: _Driver, ok: str, failed: str) -> None:
    """Operator recovery and the tenant's tools (module docstring)."""
    # a clip over the survey's FinalizeLambda bound (FINALIZE_LAMBDA_MAX_PIXELS): finalized by the CPU Batch job
    refin = drv.submit("a fox, finalize-fail", "refinalize", frames=9)
    drv.finished(refin, "FAILED")
    epoch = drv.job(refin)["current_epoch"]
    drv.finalize_ok.add(f"{refin}-e{epoch}-finalize")
    status, body = drv.api("POST", f"/v1/admin/jobs/{refin}/refinalize", {"reason": "survey"}, arn=OPERATOR)
    assert status == 200, body
    drv.finished(refin, "SUCCEEDED", run=1, schedule=False)
    for path in (f"/v1/admin/jobs/{refin}", "/v1/admin/quarantine?tenant=t1"):
        status, body = drv.api("GET", path, arn=OPERATOR)
        assert status == 200, (path, body)
    status, body = drv.api("POST", f"/v1/admin/jobs/{ok}/release", arn=OPERATOR)
    assert status == 409, body  # not quarantined: the conditional move refuses
    status, body = drv.api("POST", f"/v1/jobs/{failed}/retry", None, {"Idempotency-Key": "retry"})
    assert status == 202 and body["retry_of"] == failed, body
    drv.finished(body["job_id"], "FAILED")
    spec = {"workload": {"kind": "video.generate", "prompt": "a red fox running through snow, take {index}", "frames": 5, "steps": 2, "width": 64,
                         "height": 64}, "pools": ["onprem-nowhere"]}  # no such pool: they wait, PENDING
    status, body = drv.api("POST", "/v1/job-arrays", {"spec": spec, "count": 2}, {"Idempotency-Key": "array"})
    assert status == 202, body
    for job_id in body["job_ids"]:
        drv.parked(job_id)
    drv.stack.invoke("scheduler", {})  # the pass writes its queue view; GET shows a PENDING job's place
    status, pending = drv.api("GET", f"/v1/jobs/{body['job_ids'][0]}")
    assert status == 200 and pending["queue"]["position"] >= 1, pending
    status, cancelled = drv.api("POST", "/v1/jobs/cancel", {"array_id": body["array_id"]})
    assert status == 200 and sorted(cancelled["cancelled"]) == sorted(body["job_ids"]), cancelled
    for job_id in body["job_ids"]:
        drv.finished(job_id, "CANCELLED", schedule=False)
    status, costs = drv.api("GET", "/v1/costs?by=pool")
    assert status == 200 and costs["total"]["charged_attempts"] >= 1, costs
    # the operator's diagnosis of the last hour: nodes, allocations, tenants, ledger, attempts and timelines
    status, diag = drv.api("GET", "/v1/admin/diagnose?lanes=true", arn=OPERATOR)
    assert status == 200 and diag["gpus"] >= 1, diag
    # a job not started by its deadline: the scheduler pass fails its placement token (EXPIRED)
    from datetime import UTC, datetime, timedelta

    late = {**spec, "workload": {**spec["workload"], "prompt": "a late fox"}, "pools": ["onprem-nowhere"],
            "deadline": (datetime.now(UTC) + timedelta(seconds=4)).isoformat()}  # no such pool: it waits
    status, body = drv.api("POST", "/v1/jobs", late, {"Idempotency-Key": "late"})
    assert status == 202, body
    drv.finished(body["job_id"], "EXPIRED")


#: a published model the administration scenario registers in the model catalog (the tiny model's folder)
SURVEY_MODEL = "wan-survey"


def _administer(stack) -> str:
    """The administration scenario: an operator onboards a tenant, team and user, sets a quota node and a safety
    profile, reports a job's prompt decision, adds a pool, rebinds, drains and undrains node-8, registers a published
    model and a local one in the model catalog and deregisters the local one, removes the pool definition, lists everything, registers node-9 and deregisters it (its heartbeat is refused after) and reads
    the audit log; a tenant's user is refused. Returns the audit actions, newest first."""
    from gpufleet.devstack.gateway import build_event
    from gpufleet.errors import NotAllowed

    def admin(method: str, path: str, body: dict | None = None, who: str = OPERATOR) -> tuple[int, Any]:
        raw = b"" if body is None else json.dumps(body).encode()
        resp = stack.invoke("admin_api", build_event(method, path, {"Content-Type": "application/json"}, raw,
                                                     user_arn=who))
        return resp["statusCode"], json.loads(resp.get("body") or "null")

    assert admin("GET", "/v1/admin/tenants", who=ALICE)[0] == 403
    steps = [("POST", "/v1/admin/tenants", {"tenant": "acme"}, 201),
             ("POST", "/v1/admin/tenants/acme/teams", {"team": "vision"}, 201),
             ("POST", "/v1/admin/tenants/acme/users", {"arn": f"arn:aws:iam::{ACCOUNT}:user/bob", "team": "vision",
                                                      "user": "bob"}, 201),
             ("PUT", "/v1/admin/quota?path=acme/vision", {"guarantee": {"*": 1000}}, 200),
             ("PUT", "/v1/admin/tenants/acme/safety-profile", {"frame_thresholds": {"exposed_skin": 0.5}}, 200),
             ("PUT", "/v1/admin/pools/lab-b", {"region": "site-b", "gpu_type": "L4", "max_gpus": 2}, 200),
             ("PUT", "/v1/admin/nodes/node-8/pool", {"pool": "lab-b"}, 200),
             ("PUT", "/v1/admin/nodes/node-8/pool", {"pool": "onprem-a"}, 200),
             ("POST", "/v1/admin/nodes/node-8/drain", None, 200),
             ("POST", "/v1/admin/nodes/node-8/undrain", None, 200),
             # the model catalog: a published model (the server reads its manifest), a model only on nodes' local
             # roots (its hash given; no manifest to read), listed, read and deregistered
             ("PUT", f"/v1/admin/models/{SURVEY_MODEL}", {}, 200),
             ("PUT", "/v1/admin/models/lab-model", {"content_hash": "ab" * 32}, 200),
             ("GET", "/v1/admin/models", None, 200), ("GET", f"/v1/admin/models/{SURVEY_MODEL}", None, 200),
             ("DELETE", "/v1/admin/models/lab-model", None, 200),
             ("DELETE", "/v1/admin/pools/lab-b", None, 200),
             ("GET", "/v1/admin/tenants", None, 200), ("GET", "/v1/admin/tenants/acme", None, 200),
             ("GET", "/v1/admin/tenants/acme/teams", None, 200), ("GET", "/v1/admin/tenants/acme/users", None, 200),
             ("GET", "/v1/admin/quota?path=acme/vision", None, 200),
             ("GET", "/v1/admin/tenants/acme/safety-profile", None, 200),
             ("PUT", "/v1/admin/safety-reports/job_01m8nmrydh0vmje86g7ncnjh9j",
              {"label": "unsafe", "category": "hate", "prompt": "p", "decision": {"allowed": True}}, 200),
             ("GET", "/v1/admin/safety-reports/job_01m8nmrydh0vmje86g7ncnjh9j", None, 200),
             ("GET", "/v1/admin/safety-reports", None, 200),
             ("GET", "/v1/admin/pools", None, 200), ("GET", "/v1/admin/nodes", None, 200),
             ("GET", "/v1/admin/nodes/node-8", None, 200),
             ("DELETE", "/v1/admin/nodes/node-9", None, 200), ("GET", "/v1/admin/nodes/node-9", None, 404)]
    # node-9: registered, heartbeating, then deregistered (the last steps above): its node API calls are refused
    resp = stack.invoke("register_node", build_event("POST", "/v1/nodes", {"Content-Type": "application/json"},
                                                     json.dumps({"node_id": "node-9", "pool": "onprem-a"}).encode(),
                                                     user_arn=OPERATOR))
    assert resp["statusCode"] == 201, resp
    node9 = _Node(stack, "node-9")
    node9.call("POST", "/v1/node/heartbeat", {"free_milli": {"0": 1000}, "ttl_s": 60})
    for method, path, body, expect in steps:
        status, out = admin(method, path, body)
        assert status == expect, (method, path, status, out)
    try:
        node9.call("POST", "/v1/node/heartbeat", {"free_milli": {"0": 1000}, "ttl_s": 60})
        raise AssertionError("a deregistered node's heartbeat was accepted")
    except NotAllowed:
        pass
    status, out = admin("GET", "/v1/admin/audit")
    assert status == 200, out
    return ",".join(r["action"] for r in out["items"])


def _prepare_world(stack, cache: Path) -> None:
    from gpufleet.clock import SystemClock
    from gpufleet.models.loader import publish_model
    from gpufleet.models.tiny_wan import TINY_MODEL_NAME
    from gpufleet.store.objectstore import ObjectStore
    from gpufleet.store.principals import put_principal
    from gpufleet.store.safety_profiles import put_profile

    out = stack.outputs
    # the operator publishes the tiny model (their own credentials: no principal of the survey's)
    publish_model(cache / "models" / TINY_MODEL_NAME, ObjectStore(stack.client("s3")), out.models_root,
                  TINY_MODEL_NAME)
    # ... and the same folder under a name of its own, which the administration scenario registers in the catalog
    publish_model(cache / "models" / TINY_MODEL_NAME, ObjectStore(stack.client("s3")), out.models_root, SURVEY_MODEL)
    ddb = stack.client("dynamodb")
    put_principal(ddb, out.control_table, ALICE, "t1", "vision", "alice")
    put_principal(ddb, out.control_table, OPERATOR, "ops", "platform", "operator", admin=True)
    put_profile(ddb, out.control_table, "t1", {"exposed_skin": 0.99}, expected_version=0, updated_by="survey",
                clock=SystemClock())


def _lookup(drv: _Driver, key, payload: str) -> str:
    import base64

    import numpy as np

    from gpufleet.provenance import robustness, watermark

    bits = [int(b) for b in np.unpackbits(np.frombuffer(bytes.fromhex(payload), dtype=np.uint8))]
    # not re-encoded: the survey needs the route's calls, whatever the job's (random) payload; after one
    # re-encode of this 3-frame 256 px clip about 1 payload in 16 does not decode (the watermark's own tests
    # cover robustness with fixed payloads)
    luma = watermark.mean_luma(watermark.embed(robustness.generated_clip(3, 256), bits, key))
    body = {"width": 256, "height": 256, "luma_b64": base64.b64encode(luma.tobytes()).decode()}
    # the route API Gateway sends to the lookup's own function; the API function, which holds no watermark key,
    # answers it 409 (and another route is a 404 on the lookup's function)
    status, found = drv.api("POST", "/v1/provenance/lookup", body, function="provenance_lookup")
    assert status == 200 and found["found"] and found["matches"], found
    assert drv.api("POST", "/v1/provenance/lookup", body)[0] == 409
    assert drv.api("GET", "/v1/jobs", function="provenance_lookup")[0] == 404
    return found["matches"][0]["job_id"]


def survey(cache: Path, tmp: Path, containers: bool = True) -> Survey:
    """Run the scenarios (module docstring) on a freshly deployed stack; return what each principal called."""
    from gpufleet.local.harness import LocalStack
    from gpufleet.local.lambda_runner import LambdaRunner
    from lambdas.tasks import _deps

    result = Survey()
    recorder = Recorder(result)
    original_call = LambdaRunner.__call__

    def attributed(self, fn, event):
        key = (fn.environment_vars or {}).get("GPUFLEET_FUNCTION", fn.function_name)
        with recorder.acting_as(key):
            return original_call(self, fn, event)

    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver_box: dict[str, _Driver] = {}
    # the prompt check's model is not part of the survey (no AWS calls): a stand-in refuses BLOCKED prompts
    _deps.override(prompt_check=lambda p: {"allowed": BLOCKED not in p, "reason": "blocked" if BLOCKED in p else None})
    LambdaRunner.__call__ = attributed
    # moto's EventBridge has no Lambda targets (it raises inside PutEvents, in process); the survey runs
    # the scheduler pass itself, so the rule's delivery is skipped
    from moto.events.models import Rule

    original_send = Rule.send_to_targets

    def send_to_targets(self, *args, **kwargs):
        try:
            return original_send(self, *args, **kwargs)
        except NotImplementedError:
            return None

    Rule.send_to_targets = send_to_targets
    import sys

    stdout = sys.stdout
    sys.stdout = _EmfTee(stdout, recorder)
    try:
        with recorder.installed(), LocalStack(batch_executor=lambda job: driver_box["d"].execute(job),
                                              context=SURVEY_CONTEXT) as stack:
            result.physical = dict(stack.deployment.resources)
            drv = driver_box["d"] = _Driver(stack, recorder, cache, tmp,
                                            f"http://127.0.0.1:{server.server_address[1]}/hook")
            stack.batch_runner.ecs_executor = drv.execute_task  # RunCloudContainer's multi-container jobs
            _prepare_world(stack, cache)
            stack.register_node("node-7")

            # a tenant webhook endpoint (the loopback receiver): Notify and the stream consumer fan events out to
            # it, the sender checks it is still enabled before each delivery
            status, body = drv.api("POST", "/v1/webhooks/endpoints", {"url": drv.webhook_url + "-endpoint"})
            assert status == 201, body
            ok = drv.submit("a red fox running through snow", "ok", webhook=True)
            assert drv.submit("a red fox running through snow", "ok", webhook=True) == ok  # an idempotent replay
            result.outcomes["succeeded"] = drv.finished(ok, "SUCCEEDED")
            # a generate job naming a model outside the model catalog is refused at submission (the API reads the
            # catalog entry's content hash: gpufleet.store.model_catalog)
            status, body = drv.api("POST", "/v1/jobs", {"workload": {"kind": "video.generate", "prompt": "a fox",
                                                                     "model": "wan-unregistered"}},
                                   {"Idempotency-Key": "unregistered-model"})
            result.outcomes["unregistered_model"] = f"{status} {body['errors'][0]['field']}"
            status, body = drv.api("GET", "/v1/models")  # the catalog a tenant may name models from
            result.outcomes["models_listed"] = f"{status} {body['models'][0]['name']}"
            rejected = drv.submit(f"{BLOCKED} of a fox", "rejected")
            result.outcomes["rejected"] = drv.finished(rejected, "REJECTED", schedule=False)
            failed = drv.submit("a fox, user-error", "failed")
            result.outcomes["failed"] = drv.finished(failed, "FAILED")
            result.outcomes["failed_execution"] = drv._execution(failed)["status"]
            result.outcomes["succeeded_execution"] = drv._execution(ok)["status"]
            # moderation blocks the generated frames: the raw output leaves jobs/ for quarantine/, the API has no link
            blocked = drv.submit("a fox, skin-output", "blocked-output")
            result.outcomes["blocked_output"] = drv.finished(blocked, "BLOCKED")
            raw = drv.job(blocked)["generated"]["key"]
            s3 = stack.client("s3")
            result.outcomes["blocked_raw_versions"] = str(len(s3.list_object_versions(
                Bucket=stack.outputs.outputs_bucket, Prefix=raw).get("Versions", [])))
            result.outcomes["blocked_quarantined"] = str(s3.head_object(
                Bucket=stack.outputs.outputs_bucket, Key=f"quarantine/{raw}")["ContentLength"] > 0)
            status, body = drv.api("GET", f"/v1/jobs/{blocked}/output")
            result.outcomes["blocked_output_route"] = f"{status} {'quarantine' in json.dumps(body)}"
            finalize_failed = drv.submit("a fox, finalize-error", "finalize-failed")
            result.outcomes["finalize_failed"] = drv.finished(finalize_failed, "FAILED")
            result.outcomes["finalize_failed_execution"] = drv._execution(finalize_failed)["status"]

            # no node of the on-prem pool has reported capacity: the job waits for a placement
            waiting = drv.submit("a fox that waits", "waiting", pool="onprem-a")
            drv.parked(waiting)
            drv.api("DELETE", f"/v1/jobs/{waiting}")
            result.outcomes["cancelled_pending"] = drv.finished(waiting, "CANCELLED", schedule=False)

            held = drv.submit("a fox, hold", "held")
            # its Batch job runs (so the API's cancel terminates it: batch:TerminateJob), however slow the machine
            drv.wait(f"{held}'s Batch job running", drv.holding.is_set, schedule=True)
            drv.api("DELETE", f"/v1/jobs/{held}")
            result.outcomes["cancelled_running"] = drv.finished(held, "CANCELLED", schedule=False)
            result.outcomes["onprem"], result.outcomes["onprem_cancelled"] = _onprem_run(stack, drv, cache, tmp)
            result.outcomes["admin"] = _administer(stack)

            # a container job (the workflow's container branch: CollectOutputs) and its file listing; it runs
            # the real container stage, so only where rootless podman can run (else CONTAINER_ONLY skip)
            if containers:
                from gpufleet.local import oci_image

                # cloud pools run images by digest (a tag-only image is refused for a cloud-only job)
                local = oci_image.prepare_local()
                spec = {"workload": {"kind": "container", "image": oci_image.pinned_ref(local.podman),
                                     "command": ["sh", "-c", 'echo 1 > "$GPUFLEET_OUTPUT_DIR/r.txt"'],
                                     "env": {"SURVEY_SETTING": CONTAINER_ENV_VALUE}},
                        "pools": ["cloud-ondemand"]}
                status, body = drv.api("POST", "/v1/jobs", spec, {"Idempotency-Key": "container"})
                assert status == 202, body
                container = body["job_id"]
                result.outcomes["container"] = drv.finished(container, "SUCCEEDED")
                status, body = drv.api("GET", f"/v1/jobs/{container}/output")
                assert status == 200 and [f["path"] for f in body["files"]] == ["r.txt"], body

            _recovery(drv, ok, failed)

            for path in ("/v1/jobs", f"/v1/jobs/{ok}", f"/v1/jobs/{ok}/events", f"/v1/jobs/{ok}/logs",
                         f"/v1/jobs/{ok}/output", f"/v1/jobs/{ok}/webhooks", "/v1/quota", "/v1/pools"):
                status, body = drv.api("GET", path)
                assert status == 200, (path, body)
            # provenance: a stripped copy carrying the SUCCEEDED job's payload (marked here with the deployment's
            # key, the one the stack provisioned in its watermark secret, which finalize embedded with and the API's
            # lookup reads) is matched back to it through the index Publish wrote (WM#<payload>)
            payload = drv.job(ok)["output"]["watermark_payload"]
            wm_key = watermark_keys_from_secret(stack.client("secretsmanager").get_secret_value(
                SecretId=stack.outputs.watermark_secret_arn)["SecretString"], "survey")[0]
            assert drv.job(ok)["output"]["watermark_key_id"] == wm_key.key_id  # finalize embedded with it
            result.outcomes["provenance_lookup"] = _lookup(drv, wm_key, payload)
            # the tenant's webhook signing secrets: fetched, then rotated with an overlap (both sign meanwhile)
            status, body = drv.api("GET", "/v1/webhooks/secrets")
            assert status == 200 and len(body["secrets"]) == 1, body
            status, body = drv.api("POST", "/v1/webhooks/secrets/rotate", {"overlap_seconds": 60})
            assert status == 200 and [s["current"] for s in body["secrets"]] == [True, False], body
            # a second endpoint: read, listed, disabled and deleted (the count item goes down with it)
            status, body = drv.api("POST", "/v1/webhooks/endpoints", {"url": drv.webhook_url, "events": ["started"]})
            assert status == 201, body
            spare = f"/v1/webhooks/endpoints/{body['id']}"
            assert drv.api("GET", spare)[0] == 200 and len(drv.api("GET", "/v1/webhooks/endpoints")[1]["endpoints"]) == 2
            assert drv.api("PATCH", spare, {"enabled": False})[0] == 200 and drv.api("DELETE", spare)[0] == 204
            _, log = drv.api("GET", f"/v1/jobs/{ok}/webhooks")
            result.outcomes["endpoint_deliveries"] = str(sum(1 for d in log["deliveries"] if d.get("endpoint_id")))
            result.outcomes["webhooks_received"] = str(len(_Receiver.received))
            result.histories, result.batch_commands = dict(drv.histories), list(drv.batch_commands)
            result.supervisor_commands, result.tenant_envs = list(drv.supervisor_commands), list(drv.tenant_envs)
            result.tenant_content = [*PROMPTS, CONTAINER_ENV_VALUE]
    finally:
        sys.stdout = stdout
        LambdaRunner.__call__ = original_call
        Rule.send_to_targets = original_send
        _deps.reset()
        server.shutdown()
    return result
