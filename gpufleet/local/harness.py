"""The local execution harness: the real synthesized template, deployed into moto and executed.

Contract (used by tests/functional/local, tests/e2e and the dev stack):

    with LocalStack(context={...}, batch_executor=...) as stack:   # start() + deploy()
        stack.outputs.state_machine_arn, stack.outputs.jobs_table, ...
        stack.client("stepfunctions").start_execution(...)
        stack.register_node("node-1")          # the deployed registration Lambda
        stack.export_env()                     # GPUFLEET_* of the deployed stack in os.environ
        stack.lambda_runner.count("publish")   # invocations, per function key
        stack.batch_runner.records             # Batch jobs the local runner ran

- :meth:`deploy` also provisions development C2PA credentials into the template's signing secret
  (:meth:`provision_signing_key`) and the development watermark key into the template's watermark secret
  (:meth:`provision_watermark_keys`), so local finalize jobs sign and watermark through the production path.

- ``mode="inprocess"`` (default) runs moto with ``mock_aws`` in this process;
  ``mode="server"`` starts a ``ThreadedMotoServer`` on 127.0.0.1 (a free port,
  or ``port``), sets ``MOTO_PORT`` so the state machine's own calls reach it,
  and hands out clients with that endpoint; other processes (agents, the
  runtime in a subprocess) use :attr:`endpoint_url`.
- Both modes apply :mod:`gpufleet.local.moto_patches` (restored on stop):
  Lambdas run in-process from their deployed asset (:class:`LambdaRunner`),
  Batch jobs run through :class:`BatchRunner` on ``batch_executor`` (default:
  :class:`SubprocessExecutor`, server mode only; an :class:`ExecutorFactory` is called at start).
- ``context`` is merged over :data:`gpufleet.local.synth.LOCAL_CONTEXT`
  (test-sized timeouts); the assembly is synthesized once and cached.
- In server mode, :attr:`gate` (:class:`gpufleet.local.foreground.ForegroundGate`) puts foreground work
  first: requests of :meth:`foreground_client` clients, and whatever runs inside ``gate.foreground()``,
  go before the Lambda runner's invocations and any other moto request (which wait for their
  background turn). The dev stack's gateway opens a foreground section per API request.
- While started, the prompt checks of the in-process CheckPrompt invocations are batched: an invocation
  waiting for its batch releases the runner's lock (:mod:`gpufleet.prompt_batch`); a check made while no
  invocation waits for that lock is decided at once (:meth:`LambdaRunner.queued`).
- :meth:`stop` aborts running executions (their threads end), then undoes everything :meth:`start`
  did (patches, env, moto state). With ``abort_on_stop=False`` (the dev stack, whose process ends right
  after) running executions are left as they are: their daemon threads end with the process, and waking
  a few hundred of them at once to unwind only delays the exit (23 s for 300 at load ≈ 20).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpufleet import prompt_batch
from gpufleet.errors import ConfigError
from gpufleet.local import moto_patches
from gpufleet.local.batch_runner import BatchRunner, Executor, ExecutorFactory, SubprocessExecutor
from gpufleet.local.deploy import Deployment, deploy
from gpufleet.local.foreground import ForegroundGate, tag_client
from gpufleet.local.lambda_runner import LambdaRunner
from gpufleet.local.synth import synthesize
from gpufleet.store.clients import client as make_client

ACCOUNT = "123456789012"
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
#: functions the Lambda runner runs in worker processes of their own in server mode (gpufleet.local.lambda_worker):
#: the warm finalize, and the scheduler pass (every timer tick and JobPending/CapacityFreed event: run under the
#: runner's lock, its reads held up every job's task Lambdas behind it, docs/benchmarks.md)
ISOLATED_FUNCTIONS = ("finalize", "scheduler")


@dataclass(frozen=True)
class StackOutputs:
    """The deployed stack's outputs by name (see ``infra.stack.OUTPUT_KEYS``)."""

    raw: Mapping[str, str]

    def __getitem__(self, key: str) -> str:
        return self.raw[key]

    @property
    def jobs_table(self) -> str:
        return self.raw["JobsTable"]

    @property
    def control_table(self) -> str:
        return self.raw["ControlTable"]

    @property
    def ledger_table(self) -> str:
        return self.raw["LedgerTable"]

    @property
    def outputs_bucket(self) -> str:
        return self.raw["OutputsBucket"]

    @property
    def checkpoints_bucket(self) -> str:
        return self.raw["CheckpointsBucket"]

    @property
    def logs_bucket(self) -> str:
        return self.raw["LogsBucket"]

    @property
    def models_root(self) -> str:
        """``s3://<models bucket>/models/``: the published models (``GPUFLEET_MODEL_S3_ROOT``)."""
        return self.raw["ModelsRoot"]

    @property
    def state_machine_arn(self) -> str:
        return self.raw["StateMachineArn"]

    @property
    def rest_api_id(self) -> str:
        return self.raw["RestApiId"]

    @property
    def webhook_queue_url(self) -> str:
        return self.raw["WebhookQueueUrl"]

    @property
    def webhook_dlq_url(self) -> str:
        return self.raw["WebhookDlqUrl"]

    @property
    def event_bus(self) -> str:
        return self.raw["EventBusName"]

    @property
    def job_queues(self) -> dict[str, str]:
        return {"spot": self.raw["GpuSpotQueue"], "ondemand": self.raw["GpuOnDemandQueue"], "cpu": self.raw["CpuQueue"]}

    @property
    def job_definitions(self) -> dict[str, str]:
        return {"gpu": self.raw["GpuJobDefinition"], "cpu": self.raw["CpuJobDefinition"]}

    @property
    def signing_secret_arn(self) -> str:
        return self.raw["SigningSecretArn"]

    @property
    def watermark_secret_arn(self) -> str:
        return self.raw["WatermarkSecretArn"]

    def control_plane_env(self) -> dict[str, str]:
        """What the deployed control-plane functions see (tables, buckets, queues, bus, state machine)."""
        return {
            **self.runtime_env(),
            "GPUFLEET_STATE_MACHINE_ARN": self.state_machine_arn,
            "GPUFLEET_WEBHOOK_QUEUE_URL": self.webhook_queue_url,
            "GPUFLEET_EVENT_BUS": self.event_bus,
        }

    def runtime_env(self) -> dict[str, str]:
        """The variables a worker (agent, runtime, CLI) needs to find the tables and buckets."""
        return {
            "GPUFLEET_JOBS_TABLE": self.jobs_table,
            "GPUFLEET_CONTROL_TABLE": self.control_table,
            "GPUFLEET_LEDGER_TABLE": self.ledger_table,
            "GPUFLEET_OUTPUTS_BUCKET": self.outputs_bucket,
            "GPUFLEET_CHECKPOINTS_BUCKET": self.checkpoints_bucket,
            "GPUFLEET_LOGS_BUCKET": self.logs_bucket,
        }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalStack:
    def __init__(
        self,
        *,
        mode: Literal["inprocess", "server"] = "inprocess",
        context: Mapping[str, Any] | None = None,
        batch_executor: Executor | ExecutorFactory | None = None,
        region: str = "us-east-1",
        port: int | None = None,
        assembly_dir: Path | None = None,
        abort_on_stop: bool = True,
    ) -> None:
        if mode not in ("inprocess", "server"):
            raise ConfigError(f"unknown harness mode {mode!r}")
        if mode == "inprocess" and batch_executor is None:
            batch_executor = _unavailable_executor
        self.mode = mode
        self.context = dict(context or {})
        self.region = region
        self.account = ACCOUNT
        self._port = port
        self.abort_on_stop = abort_on_stop
        self._assembly_dir = assembly_dir
        self._executor = batch_executor
        self._stack = ExitStack()
        self._server: Any = None
        self.endpoint_url: str | None = None
        self.deployment: Deployment | None = None
        self.lambda_runner: LambdaRunner | None = None
        self.batch_runner: BatchRunner | None = None
        #: foreground (API requests) before background work; server mode only (see the module docstring)
        self.gate: ForegroundGate | None = None
        self._clients: dict[tuple[str, str | None, bool], Any] = {}
        self._clients_lock = threading.Lock()
        self._function_names: tuple[Deployment, dict[str, str]] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> LocalStack:
        """Start moto (with the patches) and make this process's AWS calls go to it."""
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _start(self) -> None:
        from moto.core.config import default_user_config

        self._set_env({**_CREDENTIALS, "AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region})
        if self.mode == "inprocess":
            from moto import mock_aws

            self._stack.enter_context(mock_aws(config=moto_patches.MOTO_CONFIG))
        else:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
            port = self._port or _free_port()
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            self._server.start()
            self._stack.callback(self._server.stop)
            self.endpoint_url = f"http://127.0.0.1:{port}"
            saved = json.loads(json.dumps(default_user_config))
            for key, value in moto_patches.MOTO_CONFIG.items():
                default_user_config.setdefault(key, {}).update(value)
            self._stack.callback(lambda: (default_user_config.clear(), default_user_config.update(saved)))
            self._set_env({"MOTO_PORT": str(port)})
            self.gate = ForegroundGate()
            self._stack.enter_context(moto_patches.patch_foreground_gate(self.gate))
            self._stack.callback(self.gate.close)
        # The scheduler pass writes its wait reasons from worker threads; here each such write delivers the jobs
        # stream to its consumer Lambda on the writing thread, which would wait for the runner's lock held by the
        # pass's own invocation (on AWS the stream consumer runs apart from the writer). One at a time here.
        # FinalizeLambda (seconds of moderation and encoding) runs in worker processes of its own in server mode, as
        # its own execution environments would, not in this process under the runner's lock.
        # FinalizeLambda's moderation model runs on one CPU thread here (GPUFLEET_TORCH_THREADS, read only by the
        # runtime's settings, i.e. by FinalizeLambda among the functions): its environment shares this machine's
        # cores with the moto server, the API and the scheduler pass, where on AWS it has vCPUs of its own. A warm
        # 9-frame finalize took 0.54 CPU s (0.58 s) so against 0.67-0.74 CPU s (0.69-0.77 s) with onnxruntime's
        # default threads (docs/benchmarks.md, issue 19's demo latency).
        self.lambda_runner = LambdaRunner({}, region=self.region, endpoint_url=self.endpoint_url,
                                          extra_env={"GPUFLEET_SCHEDULER_WRITE_PARALLELISM": "1",
                                                     "GPUFLEET_TORCH_THREADS": "1"},
                                          isolated=ISOLATED_FUNCTIONS, gate=self.gate)
        self._stack.callback(self.lambda_runner.workers.close)
        executor = self._executor() if isinstance(self._executor, ExecutorFactory) else self._executor
        # Batch jobs' host volumes (the GPU definitions' host cache) live on this "instance": the runtime's state dir
        host_root = Path(_runtime_state_dir()) / "batch-host"
        self.batch_runner = BatchRunner(executor or SubprocessExecutor(), base_env=self._worker_env(),
                                        host_root=host_root)
        self._stack.enter_context(moto_patches.patched(self.lambda_runner, self.batch_runner))
        # CheckPrompt invocations queued together share one encoder batch (gpufleet.prompt_batch)
        self._stack.enter_context(prompt_batch.yielding(self.lambda_runner.released,
                                                          self.lambda_runner.queued))
        if self.abort_on_stop:
            self._stack.callback(self.abort_executions)  # runs first on stop, while moto is still up

    def abort_executions(self) -> int:
        """End every running execution (also those parked on a task token, which moto's StopExecution
        leaves waiting) so no worker thread outlives the stack; returns how many were ended. moto then
        reports them ABORTED or FAILED."""
        import datetime

        from moto.stepfunctions.parser.api import ExecutionStatus
        from moto.stepfunctions.parser.models import stepfunctions_parser_backends

        backend = stepfunctions_parser_backends[self.account][self.region]
        aborted = 0
        for execution in backend._get_executions(ExecutionStatus.RUNNING):
            execution.stop(datetime.datetime.now(datetime.UTC), "Harness.Stopped", "the local stack stopped")
            worker = execution.exec_worker
            pool = getattr(getattr(getattr(worker, "env", None), "callback_pool_manager", None), "_pool", {})
            for endpoint in list(pool.values()):
                endpoint.interrupt_all()
            aborted += 1
        if aborted and self.lambda_runner is not None:
            self.lambda_runner.wait_idle()  # let an in-flight task Lambda finish while its tables still exist
        return aborted

    def deploy(self) -> Deployment:
        """Synthesize (cached) and deploy the stack; the Lambda runner learns the deployed assets."""
        if self.lambda_runner is None:
            raise ConfigError("start() the harness before deploy()")
        assembly = self._assembly_dir or synthesize(self.context)
        self.deployment = deploy(assembly, self.client, account=self.account, region=self.region)
        self.lambda_runner._assets.update(self.deployment.assets)
        self.batch_runner.base_env.update(self.outputs.runtime_env())
        self.provision_signing_key()
        self.provision_watermark_keys()
        return self.deployment

    def provision_signing_key(self) -> None:
        """Store development C2PA credentials in the deployed signing secret, as an operator stores the real
        key: the finalize stage then reads them through ``GPUFLEET_SIGNING_SECRET_ID`` (the production path).
        They are :func:`gpufleet.provenance.keys.dev_credentials` of the runtime's state dir
        (``GPUFLEET_STATE_DIR``, else its default), so that dir's ``trust_anchor.pem`` verifies the videos."""
        from gpufleet.provenance.keys import credentials_to_secret, dev_credentials
        from gpufleet.store.secrets import put_secret_string

        state_dir = _runtime_state_dir()
        put_secret_string(self.client("secretsmanager"), self.outputs.signing_secret_arn,
                          credentials_to_secret(dev_credentials(state_dir)))

    def provision_watermark_keys(self) -> None:
        """Store the development watermark key (:func:`gpufleet.provenance.keys.dev_watermark_keys` of the runtime's
        state dir, as :meth:`provision_signing_key`) in the deployed watermark secret: both finalize paths embed with
        it through ``GPUFLEET_WATERMARK_SECRET_ID`` and the API's lookup detects with it (the production path),
        and the dev stack's profile (``watermark_keys``) verifies with the same key file."""
        from gpufleet.provenance.keys import dev_watermark_keys, watermark_keys_to_secret
        from gpufleet.store.secrets import put_secret_string

        state_dir = _runtime_state_dir()
        put_secret_string(self.client("secretsmanager"), self.outputs.watermark_secret_arn,
                          watermark_keys_to_secret(dev_watermark_keys(state_dir)))

    def export_env(self) -> dict[str, str]:
        """Set the control-plane variables in this process (restored on stop), for code under test that
        builds its settings from the environment outside a Lambda invocation; returns them."""
        env = self.outputs.control_plane_env()
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
        self._set_env(env)
        return env

    def stop(self) -> None:
        self._stack.close()
        self.deployment = None
        with self._clients_lock:
            self._clients.clear()  # made under this run's moto; a restarted stack makes its own

    def __enter__(self) -> LocalStack:
        self.start()
        try:
            self.deploy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- access --------------------------------------------------------------------------------
    @property
    def outputs(self) -> StackOutputs:
        if self.deployment is None:
            raise ConfigError("the stack is not deployed")
        return StackOutputs(self.deployment.outputs)

    def client(self, service: str):
        """A boto3 client for the local stack (the server endpoint in server mode), made once per service while
        the stack runs (a client is thread-safe to use; making one costs more than most calls)."""
        return self._client(service, foreground=False)

    def foreground_client(self, service: str):
        """As :meth:`client`, but every request it sends is foreground (:attr:`gate`; in process mode the same
        as :meth:`client`)."""
        return self._client(service, foreground=self.gate is not None)

    def _client(self, service: str, *, foreground: bool):
        key = (service, self.endpoint_url, foreground)
        with self._clients_lock:
            if key not in self._clients:
                made = make_client(service, region=self.region, endpoint_url=self.endpoint_url,
                                   credentials=_client_creds())
                self._clients[key] = tag_client(made) if foreground else made
            return self._clients[key]

    def function_name(self, key: str) -> str:
        """Physical name of the deployed function whose ``GPUFLEET_FUNCTION`` is ``key`` (the template is read
        once per deployment: the scheduler timer asks on every pass)."""
        deployment = self.deployment
        if deployment is None:
            raise ConfigError("the stack is not deployed")
        if self._function_names is None or self._function_names[0] is not deployment:
            template = json.loads((deployment.assembly_dir / f"{deployment.stack_name}.template.json").read_text())
            names = {}
            for lid, res in template["Resources"].items():
                env = res.get("Properties", {}).get("Environment", {}).get("Variables", {})
                name = env.get("GPUFLEET_FUNCTION")
                if res["Type"] == "AWS::Lambda::Function" and isinstance(name, str) and lid in deployment.resources:
                    names[name] = deployment.resources[lid]
            self._function_names = (deployment, names)
        try:
            return self._function_names[1][key]
        except KeyError:
            raise ConfigError(f"no deployed function {key!r}") from None

    def initialize(self, key: str) -> bool:
        """Run the init phase of the deployed function whose ``GPUFLEET_FUNCTION`` is ``key`` now, ahead of its first
        event (:meth:`gpufleet.local.lambda_runner.LambdaRunner.initialize`); False when it has none to run here."""
        from moto.awslambda.models import lambda_backends

        fn = lambda_backends[self.account][self.region].get_function(self.function_name(key))
        return self.lambda_runner.initialize(fn)

    def invoke(self, key: str, event: Mapping[str, Any], *, foreground: bool = False) -> Any:
        """Invoke a deployed function synchronously; a function error raises :class:`FunctionError`.
        ``foreground``: as a foreground request (:meth:`foreground_client`)."""
        lam = self.foreground_client("lambda") if foreground else self.client("lambda")
        resp = lam.invoke(FunctionName=self.function_name(key), Payload=json.dumps(event).encode())
        body = json.loads(resp["Payload"].read() or b"null")
        if resp.get("FunctionError"):
            raise FunctionError(key, body)
        return body

    def register_node(self, node_id: str, *, pool: str = "onprem-a", gpus: int = 1, **binding: Any) -> dict[str, str]:
        """Register an on-prem node through the deployed registration function, as an operator does (a direct
        invoke): it is bound to ``pool`` with ``gpus`` devices (and ``binding``: site, labels, gpu_type, ...).
        Returns its queue and DLQ URLs and binding."""
        return self.invoke("register_node", {"node_id": node_id, "pool": pool, "gpus": gpus, **binding})

    # -- internals -----------------------------------------------------------------------------
    def _worker_env(self) -> dict[str, str]:
        env = {**_CREDENTIALS, "AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region}
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
        return env

    def _set_env(self, values: Mapping[str, str]) -> None:
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        self._stack.callback(restore)


class FunctionError(Exception):
    """A deployed function returned an error payload (``errorType``, ``errorMessage``)."""

    def __init__(self, key: str, body: Any) -> None:
        self.key = key
        self.body = body
        self.error_type = (body or {}).get("errorType") if isinstance(body, dict) else None
        super().__init__(f"{key}: {body}")


def _runtime_state_dir() -> str:
    """The state dir of the runtimes this stack starts (``GPUFLEET_STATE_DIR``, else the runtime's default)."""
    from gpufleet.runtime.settings import _default_state_dir

    return os.environ.get("GPUFLEET_STATE_DIR") or _default_state_dir()


def _client_creds() -> dict[str, str]:
    return {"aws_access_key_id": _CREDENTIALS["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": _CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}


def _unavailable_executor(job: Any) -> tuple[int, str | None]:
    """In-process moto cannot be reached from a subprocess: pass ``batch_executor`` to run Batch jobs."""
    raise ConfigError(
        f"Batch job {job.job_name}: no executor; in-process mode needs LocalStack(batch_executor=...), "
        "or use mode='server' for the subprocess executor"
    )
