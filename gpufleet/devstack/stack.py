"""The embedded local stack: everything ``gpufleet dev`` and ``gpufleet demo`` run, in order.

Contract:
- :meth:`DevStack.start` brings up, in order (each a :mod:`~gpufleet.devstack.components`
  component, stopped in reverse by :meth:`DevStack.stop`, also when a later one fails):

  1. development C2PA signing keys and trust anchor (``<state>/runtime/provenance/``), the watermark
     key, and a local RFC 3161 time-stamp authority (``GPUFLEET_TSA_URL`` for the runtime);
  2. a moto server on 127.0.0.1 with gpufleet's patches and the synthesized CDK template
     deployed into it (:class:`gpufleet.local.harness.LocalStack`, ``mode="server"``; the deploy stores
     the development signing credentials of step 1 in the template's C2PA signing secret, which the
     finalize job definition names, so local finalize jobs sign through the production path): the
     state machine executes, task Lambdas run in-process from their asset, Batch jobs (the
     cloud pool and the finalize stage) run ``python -m gpufleet.runtime`` locally; DynamoDB
     stream and SQS event-source mappings are delivered after the write by background threads
     (:class:`~gpufleet.local.moto_patches.AsyncStreamDelivery`,
     :class:`~gpufleet.local.queue_delivery.AsyncQueueDelivery`), as AWS's pollers do, and EventBridge
     rules' Lambda targets (``JobPending``/``CapacityFreed`` → a scheduler pass) after the put
     (:class:`~gpufleet.local.event_delivery.AsyncEventDelivery`; moto drops them);
  3. the cloud pool's local runner gets ``runtime_env`` (and ``GPUFLEET_IMDS_ENDPOINT`` when
     ``imds_endpoint`` is set) for every Batch job it runs;
  4. the developer's identity: its tenant and team (onboarded as the operator would, audited), an IAM
     principal for ``tenant/team/user`` and quota nodes, and the bootstrap operator (``user/operator``,
     admin) who onboards anyone else through the administration API;
  5. the SigV4-verifying gateway on 127.0.0.1, in :data:`API_PROCESSES` processes of its own sharing one port
     (:mod:`gpufleet.devstack.api_process`: it never shares this process's interpreter lock with the background
     work; while one answers a request, background steps here wait their turn), in front of the API handler and, for ``/v1/node/``,
     the node API handler, for ``/v1/admin/`` the administration API handler (each configured from
     its deployed function's environment), and for ``POST /v1/nodes`` the deployed registration
     function; it accepts the developer's and the operator's keys and every local principal's
     (``gpufleet dev --add-principal``, :mod:`gpufleet.devstack.principals`); then the cloud container jobs'
     tasks (:class:`CloudContainerTasks`: the local Batch runner's ``ecs_executor`` runs a cloud container job's
     supervisor as a process and its image by digest under rootless podman, and the dispatch function's node API
     URL is the gateway's);
  6. ``agents`` on-prem agent processes, one per node of :meth:`DevSettings.node_ids`, all in
     pool ``onprem-a`` (each bound to it by the deployed registration function, as an operator
     does, with its own log and directory, and its own access key, which the gateway maps to
     that node's agent session: the node API knows each agent as its node), running jobs on the
     local GPU or the CPU with ``runtime_env`` in each job's environment; all are launched, then
     each must report its node;
  7. the scheduler pass, invoked through the deployed scheduler function on a timer.

  First the interpreter's switch interval drops to :data:`SWITCH_INTERVAL_S` (restored on stop): the API's
  I/O-bound moto requests get the interpreter back sooner from CPU-bound background threads.
  Right after the deploy, the init phase of the in-process functions that have one (:data:`INIT_FUNCTIONS`:
  CheckPrompt's prompt filter) starts on a thread of its own (:class:`~gpufleet.devstack.components.FunctionInit`,
  an execution environment warmed ahead of its first event), and the stack waits for it before the timer: a ready stack's first jobs
  do not pay for it.

  Between the web console and the agents sits :class:`Quiesce`: on stop, once the timer and the agents
  have stopped, it closes the in-process Lambda runner (every later invocation is refused; executions
  parked on a task token are left parked and end with the process), so the rest stops at once instead
  of working through a backlog.

- Then it writes ``<state>/profile.json`` (endpoint, development credentials, trust anchor;
  mode 0600), ``<state>/profiles/operator.json`` (the operator's) and ``<state>/stack.json`` (:meth:`DevStack.manifest`: where everything is, every
  agent's node id, pid and log, the moto endpoint, region, credentials, table and bucket names and
  state machine ARN); :meth:`DevStack.stop` removes them and every local principal's key and profile. Logs go to ``<state>/logs/``;
  nothing is written outside the state directory (the CDK assembly cache under ``build/``
  aside). One stack per state directory (a lock file).
- Health: :meth:`DevStack.health_problem` names a failure that should end the stack (every agent
  exited, every scheduler pass failing); :meth:`DevStack.health_notices` reports, once each, an
  agent that exited while others still run (so a user or a test can kill or pause agents by pid).
- While running, this process's file descriptors 1 and 2 go to ``<state>/logs/stack.log``
  (in-process Lambdas, Batch jobs and jsii write there); :attr:`DevStack.console` and
  :meth:`DevStack.say` reach the user's terminal.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gpufleet.adminapi.app import ADMIN_RESOURCES
from gpufleet.devstack.api_process import ApiProcess, ApiSpec
from gpufleet.devstack.components import (
    AgentProcess,
    FunctionInit,
    LocalTsa,
    ProvenanceKeys,
    SchedulerTimer,
    SwitchInterval,
    detect_device,
    write_json,
)
from gpufleet.devstack.gateway import LocalCredential
from gpufleet.devstack.principals import CREDENTIALS_DIR, PROFILES_DIR, principal_arn
from gpufleet.devstack.settings import DevSettings
from gpufleet.devstack.supervisor import Supervisor
from gpufleet.devstack.webconsole import ConsoleServer, origin_of
from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.local.event_delivery import DEV_PACE, AsyncEventDelivery
from gpufleet.local.moto_patches import AsyncStreamDelivery
from gpufleet.local.queue_delivery import AsyncQueueDelivery
from gpufleet.profile import Profile, write_profile

log = logging.getLogger("gpufleet.devstack")

#: Pool of the local agent's node (the scheduler's default on-prem pool, gpufleet/pools.py).
ONPREM_POOL = "onprem-a"
#: the operator principal the stack bootstraps (admin): ``<state>/profiles/operator.json``
OPERATOR = "operator"
#: Credentials of the moto server (it accepts any; the harness and the agents use these).
MOTO_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
#: API processes sharing the gateway's port (gpufleet.devstack.api_process): requests on different connections are
#: answered concurrently, each process one at a time (Powertools keeps the current event in a class attribute)
API_PROCESSES = 4
#: on Ctrl-C, how long a task Lambda still running may take to finish, and each delivery thread to end (their work
#: is lost with the process anyway; at load 15-17, with a few hundred executions unwinding, a busy background
#: function used all of 5 s and the event delivery's thread 10 s)
IDLE_WAIT_S = 3.0
#: the interpreter's switch interval while the stack runs (:class:`~gpufleet.devstack.components.SwitchInterval`)
SWITCH_INTERVAL_S = 0.001
#: in-process functions whose init phase runs at start (:class:`FunctionInit`)
INIT_FUNCTIONS = ("check_prompt",)
#: Quota of the developer (milli-GPUs, any GPU type), so ``gpufleet quota`` shows a real tree.
DEV_QUOTA = {"tenant": (8000, 8000), "team": (8000, 4000), "user": (4000, 4000)}


class MotoTemplate:
    """The moto server with the deployed template (the infra harness in server mode)."""

    name = "moto + deployed template"

    def __init__(self, port: int, region: str, context: dict[str, Any], batch_running: Path | None = None) -> None:
        from gpufleet.local.batch_runner import ExecutorFactory
        from gpufleet.local.harness import LocalStack
        from gpufleet.local.prewarmed import PrewarmedExecutor

        # the process ends right after the stack (gpufleet.cli.dev.exit_now): executions are not woken to unwind.
        # Cloud attempts of the runtime fork from a server that imported torch/diffusers once (gpufleet.local.prewarmed)
        self.harness = LocalStack(mode="server", port=port or None, region=region, context=context,
                                  abort_on_stop=False,
                                  batch_executor=ExecutorFactory(lambda: PrewarmedExecutor(records=batch_running)))
        self.deploy_s = 0.0

    def start(self) -> None:
        self.harness.start()
        t0 = time.monotonic()
        try:
            self.harness.deploy()
        except BaseException:
            self.harness.stop()
            raise
        self.deploy_s = time.monotonic() - t0

    def stop(self) -> None:
        self.harness.stop()

    def describe(self) -> dict[str, str]:
        out = self.harness.outputs
        return {
            "moto server": f"{self.harness.endpoint_url} (template deployed in {self.deploy_s:.1f}s)",
            "state machine": out.state_machine_arn,
            "jobs table": out.jobs_table,
            "outputs bucket": out.outputs_bucket,
        }


class Identity:
    """The developer's principal (tenant/team/user) and quota nodes in the control table."""

    name = "developer identity"

    def __init__(self, settings: DevSettings, harness: Any) -> None:
        self.s = settings
        self.harness = harness

    def start(self) -> None:
        from gpufleet.adminapi.models import TeamIn, TenantIn
        from gpufleet.adminapi.service import AdminDeps, AdminService
        from gpufleet.clock import SystemClock
        from gpufleet.scheduler.model import QuotaNode
        from gpufleet.store.admin import DynamoAdminStore
        from gpufleet.store.principals import Principal, put_principal
        from gpufleet.store.quotas import put_quota

        ddb = self.harness.client("dynamodb")
        table = self.harness.outputs.control_table
        put_principal(ddb, table, self.s.principal_arn, self.s.tenant, self.s.team, self.s.user)
        # the first operator (bootstrap): everything else is onboarded through the administration API
        put_principal(ddb, table, principal_arn(OPERATOR), "ops", "platform", OPERATOR, admin=True)
        # the developer's tenant and team as the operator would onboard them (audited), so that the stack's
        # tenant is listed like any other (admin tenant list, the console's admin pages, diagnose's ledger reads)
        operator = Principal(arn=principal_arn(OPERATOR), tenant="ops", team="platform", user=OPERATOR, admin=True)
        admin = AdminService(AdminDeps(store=DynamoAdminStore(ddb, table), clock=SystemClock()))
        admin.create_tenant(operator, TenantIn(tenant=self.s.tenant, display_name="development"))
        admin.create_team(operator, self.s.tenant, TeamIn(team=self.s.team))
        paths = {
            "tenant": self.s.tenant,
            "team": f"{self.s.tenant}/{self.s.team}",
            "user": f"{self.s.tenant}/{self.s.team}/{self.s.user}",
        }
        for level, path in paths.items():
            guarantee, borrow = DEV_QUOTA[level]
            put_quota(ddb, table, QuotaNode(path=path, guarantee={"*": guarantee}, borrow_limit={"*": borrow}))

    def stop(self) -> None:
        return None  # lives in moto, which stops after this

    def describe(self) -> dict[str, str]:
        return {"identity": f"{self.s.tenant}/{self.s.team}/{self.s.user} ({self.s.principal_arn})",
                "operator": f"{principal_arn(OPERATOR)} (admin; profile {self.s.path(PROFILES_DIR, OPERATOR + '.json')})"}


class DevStack:
    """Start, describe and stop the embedded stack (see the module docstring)."""

    def __init__(self, settings: DevSettings, *, prefix: str = "", say: Callable[[str], None] | None = None) -> None:
        self.s = settings
        self.prefix = prefix
        self._say = say
        #: where messages for the user go; while the stack runs, file descriptors 1 and 2 of this
        #: process point at ``<state>/logs/stack.log`` and these are duplicates of the originals.
        self.console: TextIO = sys.stdout
        self.console_err: TextIO = sys.stderr
        self.supervisor: Supervisor | None = None
        self.keys: ProvenanceKeys | None = None
        self.tsa: LocalTsa | None = None
        self.moto: MotoTemplate | None = None
        self.gateway: ApiProcess | None = None
        self.webconsole: ConsoleServer | None = None
        #: each agent's access key at the gateway (its node's identity at the node API), by node id
        self.node_credentials: dict[str, Any] = {}
        self.agents: AgentFleet | None = None
        self.timer: SchedulerTimer | None = None
        self.containers: TenantContainers | None = None
        self.device = "cpu"
        self.started_s = 0.0
        self._lock_file = None
        self._saved_fds: tuple[int, int] | None = None
        self._saved_env: dict[str, str | None] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> DevStack:
        t0 = time.monotonic()
        state = self.s.state
        state.mkdir(parents=True, exist_ok=True)
        self._lock(state)
        self._redirect_output(state / "logs")
        try:
            self._start_components()
        except GpufleetError as err:
            self._release()
            raise type(err)(f"the local stack did not start: {err.detail} (logs: {self.s.path('logs')})")
        except Exception as err:
            log.exception("the local stack did not start")  # the traceback goes to the stack log
            self._release()
            detail = " ".join(str(err).split())[:500]
            raise GpufleetError(
                f"the local stack did not start: {type(err).__name__}: {detail} (logs: {self.s.path('logs')})"
            )
        except BaseException:
            self._release()
            raise
        self.started_s = time.monotonic() - t0
        self._write_profile_and_manifest()
        return self

    def _start_components(self) -> None:
        self.device = detect_device(self.s.device)
        self.keys = ProvenanceKeys(self.s.path("runtime"))
        self.tsa = LocalTsa(self.s.path("runtime"))
        self._set_env(
            {
                "GPUFLEET_STATE_DIR": str(self.s.path("runtime")),
                "GPUFLEET_TSA_URL": self.tsa.url,  # the runtime's C2PA signatures get a trusted time
                "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": os.environ.get(
                    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20"
                ),
            }
        )
        self.moto = MotoTemplate(self.s.moto_port, self.s.region, self.s.cdk_context(), self.s.path("batch-running"))
        harness = self.moto.harness
        self.containers = TenantContainers()
        runtime_env = {**self.containers.env(), **self.s.runtime_env}  # an explicit --runtime-env wins
        self.operator = LocalCredential(access_key_id="AKIAOPS" + secrets.token_hex(6).upper(),
                                        secret_access_key=secrets.token_urlsafe(30),
                                        principal_arn=principal_arn(OPERATOR))
        # the node API's supervisor-token exchange is API Gateway's one method without IAM auth (infra/api.py), and
        # the session it vends is accepted as IAM auth accepts a role session (gpufleet.devstack.gateway)
        from gpufleet.nodeapi.app import EXCHANGE_PATH

        self.gateway = ApiProcess(lambda: self._api_spec([("POST", EXCHANGE_PATH)]), gate=harness.gate,
                                  resolve=self._supervisor_session, processes=API_PROCESSES)
        # JobPending / CapacityFreed wake the scheduler, as the template's rule does (AsyncEventDelivery)
        deliveries = [AsyncStreamDelivery(), AsyncQueueDelivery(), AsyncEventDelivery(pace=DEV_PACE)]
        for delivery in deliveries:  # on Ctrl-C a delivery still invoking is left to its daemon thread (Quiesce)
            delivery.stop_wait_s = IDLE_WAIT_S
        init = FunctionInit(harness.initialize, INIT_FUNCTIONS)
        components: list[Any] = [
            SwitchInterval(SWITCH_INTERVAL_S),
            self.keys,
            self.tsa,
            self.moto,
            init,
            *deliveries,
            self.containers,
            CloudRunner(harness, runtime_env, self.s.imds_endpoint),
            Identity(self.s, harness),
            self.gateway,
            # after the gateway: the supervisors of cloud container jobs reach the node API at its URL
            CloudContainerTasks(harness, self.containers, lambda: self.gateway.url),
        ]
        self.webconsole = ConsoleServer(lambda: self.gateway.url, self._console_config, port=self.s.console_port,
                                        media_origin=lambda: origin_of(harness.endpoint_url))
        components.append(self.webconsole)
        # stopped right after the timer and the agents (which drain through a live stack): Ctrl-C then ends
        # the in-process work at once instead of queueing the gateway and the deliveries behind it
        components.append(Quiesce(harness, then=lambda: self.timer.join(3.0) if self.timer is not None else True))
        if self.s.agent:
            self.agents = AgentFleet(
                self,
                [
                    AgentProcess(
                        node_id,
                        {},
                        self._agent_paths(node_id)[0],
                        lambda n=node_id: self._node_ready(n),
                        device=self.device,
                    )
                    for node_id in self.s.node_ids()
                ],
            )
            components.append(self.agents)
        components.append(init.ready)
        self.timer = SchedulerTimer(lambda: harness.invoke("scheduler", {}), self.s.scheduler_interval_s,
                                    idle_max_s=self.s.scheduler_idle_max_s)
        components.append(self.timer)
        self.supervisor = Supervisor(components)
        self.supervisor.start(on_started=lambda c: self.say(f"started {c.name}"))

    def say(self, text: str) -> None:
        """Tell the user (through ``say`` if given, else on :attr:`console`)."""
        if self._say is not None:
            self._say(text)
        else:
            print(f"{self.prefix}{text}", file=self.console, flush=True)

    def stop(self) -> list[tuple[str, BaseException]]:
        """Stop everything (reverse order); returns the failures, if any. Safe to call twice."""
        failures: list[tuple[str, BaseException]] = []
        if self.supervisor is not None:
            failures = self.supervisor.stop()
            self.supervisor = None
            # the profile and manifest describe a running stack: a stale one would point the CLI at nothing
            for name in ("profile.json", "stack.json"):
                self.s.path(name).unlink(missing_ok=True)
            for folder in (PROFILES_DIR, CREDENTIALS_DIR):  # local principals die with the stack
                for f in self.s.path(folder).glob("*.json"):
                    f.unlink(missing_ok=True)
        self._release()
        return failures

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ access

    def client(self):
        from gpufleet.sdk import Client

        return Client(profile=self.profile())

    def profile(self) -> Profile:
        return Profile(
            endpoint=self.gateway.url,
            region=self.s.region,
            access_key_id=self.s.access_key_id,
            secret_access_key=self.s.secret_access_key,
            trust_anchors=str(self.keys.trust_anchor),
            watermark_keys=str(self.keys.watermark_keys),
            state_dir=str(self.s.state),
        )

    def trust_anchors_pem(self) -> str:
        return self.keys.trust_anchor.read_text()

    def where(self) -> dict[str, str]:
        info: dict[str, str] = {}
        for component in self.supervisor.started if self.supervisor else []:
            info.update(component.describe())
        info["profile"] = str(self.s.path("profile.json"))
        info["logs"] = str(self.s.path("logs"))
        if self.moto is not None and self.moto.harness.deployment is not None:
            # where `gpufleet admin models publish … --root` puts a model its jobs then run (on-prem and cloud)
            info["published models"] = self.moto.harness.outputs.models_root
        return info

    def banner(self) -> list[str]:
        info = self.where()
        width = max(len(k) for k in info)
        lines = [f"local stack ready in {self.started_s:.1f}s:"]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in info.items()]
        lines.append(f'  try: gpufleet submit "a red fox running in snow" --wait   (profile: {info["profile"]})')
        return lines

    def health_problem(self) -> str | None:
        """A one-line description of a failed part (every agent exited, every scheduler pass failing), else None."""
        for part in (self.agents, self.timer):
            problem = part.problem() if part is not None else None
            if problem:
                return problem
        return None

    def health_notices(self) -> list[str]:
        """Lines worth telling the user once that do not stop the stack (one agent of several exited)."""
        return self.agents.notices() if self.agents is not None else []

    def manifest(self) -> dict[str, Any]:
        """What ``<state>/stack.json`` holds: :meth:`where` plus, for programs, this process's ``pid``,
        ``agents`` (node id, pid, log, device, pool each), ``aws`` (the moto endpoint, region, its
        credentials, table and bucket names, state machine ARN, every stack output; ``moto_endpoint``,
        ``region``, ``tables``, ``buckets`` and ``state_machine_arn`` also at the top level), ``api``
        (endpoint, profile path, ``pid`` of the first API process and ``pids`` of every one), ``runtime_env``, ``imds_endpoint``
        and ``batch_running`` (the folder recording the local Batch runner's forked attempts)."""
        harness = self.moto.harness
        out = harness.outputs
        tables = {"jobs": out.jobs_table, "control": out.control_table, "ledger": out.ledger_table}
        buckets = {"outputs": out.outputs_bucket, "checkpoints": out.checkpoints_bucket, "logs": out.logs_bucket}
        return {
            "pid": os.getpid(),
            "started_s": round(self.started_s, 1),
            **self.where(),
            # the most used of ``aws`` at the top level too
            "moto_endpoint": harness.endpoint_url,
            "region": self.s.region,
            "tables": tables,
            "buckets": buckets,
            "state_machine_arn": out.state_machine_arn,
            "api": {"endpoint": self.gateway.url, "profile": str(self.s.path("profile.json")), "pid": self.gateway.pid,
                    "pids": self.gateway.pids},
            "console": {"url": self.webconsole.url} if self.webconsole is not None else None,
            "agents": self.agents.records() if self.agents is not None else [],
            "aws": {
                "endpoint_url": harness.endpoint_url,
                "region": self.s.region,
                "account": harness.account,
                "access_key_id": MOTO_CREDENTIALS["aws_access_key_id"],
                "secret_access_key": MOTO_CREDENTIALS["aws_secret_access_key"],
                "tables": tables,
                "buckets": buckets,
                "state_machine_arn": out.state_machine_arn,
                "outputs": dict(out.raw),
            },
            "runtime_env": dict(self.s.runtime_env),
            "imds_endpoint": self.s.imds_endpoint,
            # the local Batch runner's running attempts forked from its pre-warmed server (gpufleet.local.prewarmed)
            "batch_running": str(self.s.path("batch-running")),
        }

    # ------------------------------------------------------------------ internals

    def _credential(self):
        return LocalCredential(
            access_key_id=self.s.access_key_id,
            secret_access_key=self.s.secret_access_key,
            principal_arn=self.s.principal_arn,
        )

    def _console_config(self) -> dict[str, Any]:
        """What the console's page signs with: the developer's own credentials (never the operator's)."""
        return {"region": self.s.region, "service": "execute-api", "identity": self.s.principal_arn,
                "credentials": {"access_key_id": self.s.access_key_id,
                                "secret_access_key": self.s.secret_access_key}}

    def _cursor_secret(self) -> str:
        path = self.s.path("cursor_secret")
        if not path.is_file():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32))
        return path.read_text().strip()

    def _api_spec(self, open_routes: list[tuple[str, str]]) -> ApiSpec:
        """What the API process (:mod:`gpufleet.devstack.api_process`) needs: the API, node API and administration
        API handlers configured as their deployed functions are (environment, cursor secret from Secrets Manager;
        this state directory's cursor secret when the function names none), the deployed registration function
        for ``POST /v1/nodes``, the development watermark key (the provenance lookup detects with the key the
        runtime embeds with), and the gateway's keys (the developer's, the operator's, every local principal's
        in ``credentials/``)."""
        harness = self.moto.harness
        return ApiSpec(
            region=self.s.region, endpoint_url=harness.endpoint_url, port=self.s.api_port,
            credentials=[self._credential(), self.operator], credentials_dir=str(self.s.path(CREDENTIALS_DIR)),
            open_routes=open_routes,
            functions={k: harness.function_name(k)
                       for k in ("api", "provenance_lookup", "node_api", "admin_api", "register_node")},
            cursor_secret=self._cursor_secret(), watermark_keys=str(self.keys.watermark_keys),
            gang_silence_s=str(self.s.heartbeat_seconds), admin_resources=list(ADMIN_RESOURCES))

    def _supervisor_session(self, key: str):
        """A cloud supervisor's session at the gateway: one moto's STS vended for the node API's supervisor role."""
        from gpufleet.devstack.gateway import moto_sessions

        role = self._node_api_settings().get("GPUFLEET_SUPERVISOR_ROLE_ARN")
        return moto_sessions([role], self.moto.harness.account)(key) if role else None

    def _node_api_settings(self) -> dict[str, str]:
        harness = self.moto.harness
        conf = harness.foreground_client("lambda").get_function_configuration(FunctionName=harness.function_name("node_api"))
        return (conf.get("Environment") or {}).get("Variables") or {}

    def _node_credential(self, node_id: str):
        """``node_id``'s access key at the gateway: it stands for the agent role's session of that node (as the
        certificate CN does in AWS), so the node API knows the caller is that node."""
        from gpufleet.devstack.gateway import LocalCredential
        from gpufleet.nodeapi.identity import agent_session_arn

        role = self._node_api_settings().get("GPUFLEET_AGENT_ROLE_NAMES", "gpufleet-agent").split(",")[0]
        cred = LocalCredential(access_key_id=f"AKNODE{secrets.token_hex(6).upper()}",
                               secret_access_key=secrets.token_urlsafe(30),
                               principal_arn=agent_session_arn(self.moto.harness.account, role, node_id))
        self.gateway.add_credential(cred)
        self.node_credentials[node_id] = cred
        return cred

    def _agent_paths(self, node_id: str) -> tuple[Path, Path]:
        """(log file, agent directory) of an agent: ``logs/agent.log`` and ``agent/`` when there is one,
        else ``logs/agent-<node_id>.log`` and ``agents/<node_id>/``."""
        if self.s.agents == 1:
            return self.s.path("logs", "agent.log"), self.s.path("agent")
        return self.s.path("logs", f"agent-{node_id}.log"), self.s.path("agents", node_id)

    def _agent_env(self, node_id: str) -> dict[str, str]:
        """Registers ``node_id`` (deployed registration function) and returns its agent's environment."""
        s, harness = self.s, self.moto.harness
        # the operator's registration binds the node to the on-prem pool and its inventory
        queue = harness.register_node(node_id, pool=ONPREM_POOL, gpus=self._slots())["queue_url"]
        cred = self._node_credential(node_id)
        state = self._agent_paths(node_id)[1]
        # in-process invocations see their variables in a per-thread layer: os.environ is the process's own
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "AWS_", "MOTO_"))}
        env.update(
            {
                "AWS_ACCESS_KEY_ID": cred.access_key_id,  # moto accepts any key; the gateway maps this one
                "AWS_SECRET_ACCESS_KEY": cred.secret_access_key,
                "GPUFLEET_AGENT_NODE_API_URL": self.gateway.url,
                "AWS_DEFAULT_REGION": s.region,
                "AWS_REGION": s.region,
                "AWS_ENDPOINT_URL": harness.endpoint_url,
                "GPUFLEET_STATE_DIR": str(s.path("runtime")),
                "GPUFLEET_AGENT_NODE_ID": node_id,
                "GPUFLEET_AGENT_POOL": ONPREM_POOL,
                "GPUFLEET_AGENT_QUEUE_URL": queue,
                "GPUFLEET_AGENT_REGION": s.region,
                "GPUFLEET_AGENT_ENDPOINT_URL": harness.endpoint_url,
                "GPUFLEET_AGENT_JOBS_TABLE": harness.outputs.jobs_table,
                "GPUFLEET_AGENT_CONTROL_TABLE": harness.outputs.control_table,
                "GPUFLEET_AGENT_STATE_DIR": str(state / "state"),
                "GPUFLEET_AGENT_CACHE_DIR": str(state / "cache"),
                "GPUFLEET_AGENT_METRICS_PORT": "0",
                "GPUFLEET_AGENT_POLL_WAIT_S": "1",
                "GPUFLEET_AGENT_HEARTBEAT_INTERVAL_S": "1",  # cancels are seen within a second
                "GPUFLEET_AGENT_VISIBILITY_TIMEOUT_S": "30",
                "GPUFLEET_AGENT_NODE_HEARTBEAT_S": "2",
                "GPUFLEET_AGENT_NODE_TTL_S": "15",
                "GPUFLEET_AGENT_DRAIN_TIMEOUT_S": "20",
                # above the node API's gang silence here (heartbeat_seconds) plus a heartbeat or two
                "GPUFLEET_AGENT_GANG_FAILURE_HOLD_S": str(s.heartbeat_seconds + 5),
                "GPUFLEET_AGENT_WARM_WORKERS": "true" if s.warm_workers else "false",
                **harness.outputs.runtime_env(),
            }
        )
        # the deployment's published models (ModelsRoot), as an operator names them in [agent.child_env]
        # (docs/operations.md "Publishing models"); an explicit --runtime-env wins
        child_env = {"GPUFLEET_MODEL_S3_ROOT": harness.outputs.models_root,
                     **(self.containers.env() if self.containers else {}), **s.runtime_env}
        if child_env:
            env["GPUFLEET_AGENT_CHILD_ENV"] = json.dumps(child_env)
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def _slots(self) -> int:
        """GPUs of this host (CPU slots on a host without NVML): the inventory an agent here reports."""
        if self.device == "cpu":
            return 1
        from onprem_agent.gpus import discover

        return max(1, len(discover(1, visible=os.environ.get("CUDA_VISIBLE_DEVICES")).devices))

    def _node_ready(self, node_id: str) -> bool:
        from gpufleet.store.dynamo import unmarshal
        from gpufleet.tables import NODE_SK, node_pk

        harness = self.moto.harness
        item = harness.client("dynamodb").get_item(
            TableName=harness.outputs.control_table,
            Key={"pk": {"S": node_pk(node_id)}, "sk": {"S": NODE_SK}},
            ConsistentRead=True,
        )
        found = unmarshal(item.get("Item"))
        return bool(found) and not found.get("draining")

    def _lock(self, state: Path) -> None:
        self._lock_file = open(state / "stack.lock", "w")  # noqa: SIM115 - held for the stack's lifetime
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            raise ConfigError(f"another gpufleet stack is running with state directory {state}")

    def _redirect_output(self, logs: Path) -> None:
        """Send fds 1 and 2 (this process, in-process Lambdas, Batch jobs, jsii) to the stack log."""
        logs.mkdir(parents=True, exist_ok=True)
        stream = open(logs / "stack.log", "a", buffering=1)  # noqa: SIM115 - closed in _release
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved_fds = (os.dup(1), os.dup(2))
        self.console = os.fdopen(os.dup(self._saved_fds[0]), "w", buffering=1)
        self.console_err = os.fdopen(os.dup(self._saved_fds[1]), "w", buffering=1)
        os.dup2(stream.fileno(), 1)
        os.dup2(stream.fileno(), 2)
        self._log_stream = stream
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        self._log_handler = handler
        for noisy in ("werkzeug", "botocore", "urllib3"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        logging.captureWarnings(True)  # moto's "not supported by CloudFormation" warnings go to the log

    def _set_env(self, values: dict[str, str]) -> None:
        for k, v in values.items():
            self._saved_env.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    def _release(self) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}
        if self._saved_fds is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self._saved_fds[0], 1)
            os.dup2(self._saved_fds[1], 2)
            for fd in self._saved_fds:
                os.close(fd)
            self._saved_fds = None
            logging.getLogger().removeHandler(self._log_handler)
            logging.captureWarnings(False)
            self._log_stream.close()
            for stream in (self.console, self.console_err):
                stream.close()
            self.console, self.console_err = sys.stdout, sys.stderr
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def _write_profile_and_manifest(self) -> None:
        write_profile(self.profile(), self.s.path("profile.json"))
        write_profile(self.profile().model_copy(update={"access_key_id": self.operator.access_key_id,
                                                        "secret_access_key": self.operator.secret_access_key}),
                      self.s.path(PROFILES_DIR, f"{OPERATOR}.json"))
        write_json(self.s.path("stack.json"), self.manifest())


class Quiesce:
    """Stopped once the timer and the agents are (see :meth:`DevStack._start_components`): the in-process Lambda runner refuses every invocation from then on (also those
    waiting for their function: :meth:`gpufleet.local.lambda_runner.LambdaRunner.close`), background work no
    longer waits for its turn (:meth:`gpufleet.local.foreground.ForegroundGate.close`), ``then`` runs (the dev
    stack waits there for the timer's last pass, which the closed runner ends at once if it was still queued),
    and a task Lambda already running gets at most :data:`IDLE_WAIT_S` to finish (the timer's pass 3 s before that). An execution that reaches its next task is
    refused and fails; one parked on a task token stays parked (it is not woken: waking a few hundred at once to
    unwind took 23 s of the Ctrl-C), and its thread ends with the process. The deliveries then stop without
    queueing behind work nobody will see: the stack's state lives in its moto server and goes with it."""

    name = "in-process work"

    def __init__(self, harness: Any, then: Callable[[], object] | None = None) -> None:
        self.harness = harness
        self.then = then

    def start(self) -> None:
        return None

    def stop(self) -> None:
        if self.harness.lambda_runner is not None:
            self.harness.lambda_runner.close()
        if self.harness.gate is not None:
            self.harness.gate.close()
        t0 = time.monotonic()
        if self.then is not None:
            self.then()
        idle = self.harness.lambda_runner is None or self.harness.lambda_runner.wait_idle(IDLE_WAIT_S)
        log.info("stopping: in-process invocations refused (in %.1fs; %s)", time.monotonic() - t0,
                 "none running" if idle else "one still running")

    def describe(self) -> dict[str, str]:
        return {}


class AgentFleet:
    """The on-prem agents: registers each node (deployed registration function), launches every
    agent process, then waits until each has registered. Stops them together (SIGTERM to all, one
    shared drain deadline). Health: an agent that exits is reported once by :meth:`notices`; the
    stack fails (:meth:`problem`) only when no agent is left."""

    name = "on-prem agents"

    def __init__(self, stack: DevStack, agents: list[AgentProcess]) -> None:
        self.stack = stack
        self.agents = agents
        self._reported: set[str] = set()

    def start(self) -> None:
        try:
            for agent in self.agents:
                agent.env = self.stack._agent_env(agent.node_id)
                agent.launch()
            for agent in self.agents:
                agent.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for agent in self.agents:
            agent.terminate()
        deadline = time.monotonic() + max(a.grace_s for a in self.agents)
        for agent in self.agents:
            agent.wait_stopped(deadline)

    def notices(self) -> list[str]:
        """One line per agent that has exited since the last call (never the same agent twice)."""
        out = []
        for agent in self.agents:
            problem = agent.problem()
            if problem and agent.node_id not in self._reported:
                self._reported.add(agent.node_id)
                out.append(problem)
        return out

    def problem(self) -> str | None:
        problems = [a.problem() for a in self.agents]
        if all(problems):
            return problems[0] if len(problems) == 1 else f"every agent exited: {'; '.join(problems)}"
        return None

    def records(self) -> list[dict[str, Any]]:
        out = []
        for a in self.agents:
            rec = {**a.record(), "pool": ONPREM_POOL}
            if self.stack is not None:  # where its running-job records are (a warm worker's job is found there)
                rec["state_dir"] = str(self.stack._agent_paths(a.node_id)[1] / "state")
            cred = self.stack.node_credentials.get(a.node_id) if self.stack is not None else None
            if cred is not None:  # the manifest is 0600, like the developer's own credentials in it
                rec["node_api"] = {"access_key_id": cred.access_key_id, "secret_access_key": cred.secret_access_key}
            out.append(rec)
        return out

    def describe(self) -> dict[str, str]:
        info: dict[str, str] = {}
        for agent in self.agents:
            info.update(agent.describe())
        return info


class CloudRunner:
    """The cloud pool's local Batch runner (started by the harness): every Batch job gets
    ``runtime_env``; jobs on a spot pool's queue also get ``GPUFLEET_IMDS_ENDPOINT`` when
    ``imds_endpoint`` is set (the runtime polls it for spot interruption notices, as on a spot
    instance; on-demand instances never get one)."""

    name = "cloud pool runner"

    def __init__(self, harness: Any, runtime_env: dict[str, str], imds_endpoint: str | None) -> None:
        from gpufleet.pools import PoolKind, load_pools

        self.harness = harness
        self.env = dict(runtime_env)
        self.imds_endpoint = imds_endpoint
        self.spot_queues = sorted({p.job_queue for p in load_pools(os.environ) if p.kind is PoolKind.SPOT and p.job_queue})

    def start(self) -> None:
        runner = self.harness.batch_runner
        runner.base_env.update(self.env)
        if self.imds_endpoint:
            for queue in self.spot_queues:
                runner.queue_env.setdefault(queue, {})["GPUFLEET_IMDS_ENDPOINT"] = self.imds_endpoint

    def stop(self) -> None:
        return None  # the runner goes with the harness

    def describe(self) -> dict[str, str]:
        env = {**self.env, **({"GPUFLEET_IMDS_ENDPOINT": f"{self.imds_endpoint} (spot queues)"} if self.imds_endpoint else {})}
        extra = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
        return {"cloud pool runner": "python -m gpufleet.runtime per Batch job" + (f" with {extra}" if extra else "")}


class CloudContainerTasks:
    """Cloud container jobs in the local Batch runner (RunCloudContainer's multi-container jobs, docs/runtime.md):
    the runner's ``ecs_executor`` is :class:`gpufleet.local.ecs_task.EcsTaskExecutor` (the supervisor as a process
    with this process's environment less its AWS credentials, the tenant's image by digest under rootless podman
    beside it), and the deployed ``dispatch_cloud`` function's ``GPUFLEET_NODE_API_URL`` is the gateway's URL, where
    the supervisor exchanges its one-time token and then calls the node API with the session it got. Where podman
    cannot run, nothing is set and such jobs fail as a system error (the stack still serves everything else)."""

    name = "cloud container tasks"

    def __init__(self, harness: Any, containers: TenantContainers, node_api_url: Callable[[], str]) -> None:
        self.harness = harness
        self.containers = containers
        self.node_api_url = node_api_url

    def start(self) -> None:
        from gpufleet.local.ecs_task import EcsTaskExecutor

        lam = self.harness.client("lambda")
        name = self.harness.function_name("dispatch_cloud")
        env = dict(lam.get_function_configuration(FunctionName=name)["Environment"]["Variables"])
        env["GPUFLEET_NODE_API_URL"] = self.node_api_url()
        lam.update_function_configuration(FunctionName=name, Environment={"Variables": env})
        local = self.containers.local
        if local is not None:
            runner = self.harness.batch_runner
            # the runtime's settings and the moto endpoint; EcsTaskExecutor drops every AWS credential from it
            self.harness.batch_runner.ecs_executor = EcsTaskExecutor(
                local.podman, local.jobs_dir, supervisor_env={**os.environ, **runner.base_env})

    def stop(self) -> None:
        return None  # the runner goes with the harness

    def describe(self) -> dict[str, str]:
        if self.containers.local is None:
            return {"cloud container tasks": f"unavailable ({self.containers.reason})"}
        return {"cloud container tasks": f"supervisor process + tenant under rootless podman; node API "
                                         f"{self.node_api_url()}"}


class TenantContainers:
    """Container jobs on this machine: on-prem agents and the local Batch runner run them the same way,
    through the runtime's ``container`` stage under rootless podman (docs/runtime.md, "Isolation").
    Prepares the local tools image (``localhost/gpufleet-test/tools:1``, built from the host's own
    packages, never pulled) and a jobs directory the podman user can reach, and gives every job the
    settings that point at them (``GPUFLEET_OCI_USER``, ``GPUFLEET_JOBS_DIR``, and ``GPUFLEET_GANG_NETWORK=local``:
    the agents share this host, so a gang's members share one loopback-only namespace). Where podman cannot run
    (:func:`gpufleet.local.oci_image.local_oci_unavailable`), container jobs fail as the runtime says
    and the stack still serves video jobs."""

    name = "tenant containers"

    def __init__(self) -> None:
        from gpufleet.local import oci_image

        self.reason = oci_image.local_oci_unavailable()
        self.local = None
        if self.reason is None:
            self.local = oci_image.prepare_local()

    def env(self) -> dict[str, str]:
        return self.local.env if self.local is not None else {}

    def start(self) -> None:
        return None  # prepared in __init__: the agents' and the runner's settings need it first

    def stop(self) -> None:
        if self.local is not None:
            import shutil

            shutil.rmtree(self.local.jobs_dir, ignore_errors=True)

    def describe(self) -> dict[str, str]:
        if self.local is None:
            return {"tenant containers": f"unavailable ({self.reason})"}
        return {"tenant containers": f"rootless podman, image {self.local.image}, jobs in {self.local.jobs_dir}"}
