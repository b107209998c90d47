"""The agent process: node registration and heartbeats, polling, dispatch, drain.

Threads: the *poller* long-polls the node queue while there is room (free GPUs
plus ``prefetch``); the *ticker* writes the node heartbeat and keeps unstarted
messages invisible; the *signals* thread long-polls the node's signal queue for cancel
nudges (each makes the named attempt heartbeat at once: :meth:`Agent.nudge`); one
:class:`onprem_agent.runner.JobRunner` per job; the
*prefetch* thread (:mod:`onprem_agent.prefetch`, ``prefetch_data``) fills the node
cache with a held job's inputs and model, one job at a time, while it waits for its
GPUs (forgotten when it starts, stopped when its message is released or its task is
gone). The main thread waits for a signal.

Shutdown (the dramatiq/arq habit):
- first SIGTERM/SIGINT → :meth:`Agent.request_drain`: stop polling, mark the node
  draining, release unstarted messages (visibility 0), forward SIGTERM to every
  job's process group and keep heart-beating while they checkpoint; each is
  reported PREEMPTED (or SUCCEEDED if it finished), so the workflow reschedules
  it; after ``drain_timeout_s`` stragglers are killed. Exit code 0.
- second SIGTERM/SIGINT → :meth:`Agent.hard_exit`: kill every job's process
  group and exit 1 at once (their pid records let the next start clean up).

Start-up: refuses to run beside a live agent on the same state dir, kills
orphaned process groups left by a previous agent (kill -9), prunes old
completed records, starts a warm worker per GPU when ``warm_workers`` is on
(:mod:`onprem_agent.warm`; the node advertises their loaded models as ``resident_models``),
registers the node.

Nothing runs twice: a message is deduplicated on (job, epoch) against jobs in
flight, held messages and the local completed records; the runner then checks
the job's fencing epoch and the task token before it spawns anything.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import psutil
from pydantic import ValidationError

from gpufleet import batching
from gpufleet.batching import batch_key
from gpufleet.clock import WaitingClock
from gpufleet.envelope import Envelope
from gpufleet.errors import BadRequest, ConfigError, GpufleetError, NotAllowed, StaleEpoch, TransientError
from gpufleet.nodeapi.liveness import DATASETS_MAX_CHARS, URI_MAX_CHARS, bounded
from gpufleet.runtime.hostcache import ContentCache
from gpufleet.store.queues import signals_url
from onprem_agent.aws import (
    AttemptReports,
    Message,
    NodeApiClient,
    NodeQueue,
    NodeRefused,
    NodeRegistry,
    SignalQueue,
    TaskGone,
    make_client,
)
from onprem_agent.child import agent_env_extra, child_environment
from onprem_agent.gpus import GpuSampler, Inventory, discover
from onprem_agent.metrics import AgentMetrics, ShippedMetrics
from onprem_agent.node import node_item
from onprem_agent.prefetch import Prefetcher, attempt_objects, cache_filler
from onprem_agent.runner import JobRunner, Lease, RunnerPorts, RunnerSettings, request_for
from onprem_agent.settings import AgentSettings
from onprem_agent.slots import GpuSlots, Request
from onprem_agent.state import StateDir
from onprem_agent.warm import BatchLaunch, WorkerPool, serves

log = logging.getLogger("onprem_agent.agent")


@dataclass
class Held:
    """A received message waiting for its GPUs (not started)."""

    env: Envelope
    lease: Lease
    req: Request


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        clock: WaitingClock,
        environ: Mapping[str, str],
        sqs=None,
        node_api: NodeApiClient | None = None,
        inventory: Inventory | None = None,
    ) -> None:
        self.s = settings
        self.clock = clock
        region, endpoint = settings.region, settings.endpoint_url
        wait = settings.poll_wait_s + 10
        sqs = sqs or make_client("sqs", region, endpoint, read_timeout=wait)
        self.queue = NodeQueue(sqs, settings.queue_url)
        url = settings.signals_queue_url
        url = signals_url(settings.queue_url) if url is None else url
        self.signal_queue = SignalQueue(sqs, url) if url else None
        if node_api is None:
            if not settings.node_api_url:
                raise ConfigError("node_api_url is required: the agent reports through the node API")
            node_api = NodeApiClient(settings.node_api_url, region)
        self.reports = AttemptReports(node_api)
        self.registry = NodeRegistry(node_api)
        self.state = StateDir(settings.state_dir, clock)
        self.inventory = inventory or discover(settings.cpu_slots, visible=environ.get("CUDA_VISIBLE_DEVICES"))
        self.slots = GpuSlots([d.index for d in self.inventory.devices], self.inventory.topology)
        self.cache = ContentCache(settings.cache_dir, settings.cache_max_bytes, settings.cache_min_age_s, clock=clock,
                                  reverify_s=settings.cache_reverify_s)
        self.sampler = GpuSampler(self.inventory)
        self.metrics = AgentMetrics(gpus=self.sampler.sample, cache=self.cache.stats)
        self.shipped = ShippedMetrics()
        self._accepted = True  # the node API accepted the last node heartbeat (gpufleet_agent_registered)
        self.metrics_port: int | None = None
        self.warm = self._warm_pool(settings, environ)
        self.prefetcher = self._prefetcher(settings, environ, node_api) if settings.prefetch_data else None
        self.ports = RunnerPorts(
            settings=RunnerSettings.of(settings), queue=self.queue, reports=self.reports,
            records=self.state, metrics=self.metrics, clock=clock, base_env=dict(environ),
            extra_env=agent_env_extra(settings, environ), real_gpus=self.inventory.visible_indices,
            draining=lambda: self.draining, started=self.job_started, finished=self.job_finished, warm=self.warm,
            gpus_free=self.release_gpus,
        )

        self._lock = threading.RLock()
        self._held: dict[tuple[str, int], Held] = {}
        self._runners: dict[tuple[str, int], JobRunner] = {}
        self._free_since: dict[int, float] = {}
        self._slot_of: dict[tuple[str, int], str] = {}  # job -> the slot holder it runs under (a batch's first)
        self._holders: dict[str, int] = {}  # slot holder -> jobs still running under it
        self._room = threading.Event()
        self._drain = threading.Event()
        self._tick = threading.Event()  # wakes the ticker: a drain, or GPUs came free (the node reports at once)
        self._freed = False  # GPUs came free since the node's last heartbeat
        self._done = threading.Event()
        self._signals = 0
        self._threads: list[threading.Thread] = []
        self.exit_code = 0

    def _warm_pool(self, s: AgentSettings, environ: Mapping[str, str]) -> WorkerPool | None:
        """The warm workers (``warm_workers``): each GPU set's worker gets a job's environment less the job."""
        if not s.warm_workers:
            return None
        extra = {**agent_env_extra(s, environ), "GPUFLEET_WARM_MODEL_BUDGET_BYTES": str(s.warm_model_budget_bytes),
                 "GPUFLEET_BATCH_MEMORY_BYTES": str(s.batch_memory_bytes),
                 # a batching worker pads every GPU call to its largest batch (both guidance branches): a member's
                 # result is then bitwise what it would be alone (gpufleet.runtime.denoise.set_pad_rows)
                 "GPUFLEET_BATCH_PAD_ROWS": str(2 * s.batch_max_members if s.batch_max_members > 1 else 0)}
        real = self.inventory.visible_indices

        def env_for(key: tuple[int, ...]) -> dict[str, str]:
            return child_environment(environ, extra, list(key), real, s.cache_dir, "", 0)

        pool = WorkerPool(command=s.warm_worker_command, env_for=env_for, work_dir=s.state_dir,
                          log_dir=s.state_dir / "workers", clock=self.clock,
                          orphan_signal=getattr(signal, s.orphan_signal) if s.orphan_signal else None,
                          on_replace=self.metrics.warm_replaced.inc)
        self.metrics.warm_workers.set_function(lambda: len(pool.pids()))
        return pool

    def _prefetcher(self, s: AgentSettings, environ: Mapping[str, str], api: NodeApiClient) -> Prefetcher:
        """Fills the cache where the runtime looks: the models its environment names (GPUFLEET_MODEL_ROOT,
        GPUFLEET_MODEL_S3_ROOT, from the agent's environment or ``child_env``) under ``cache_dir``."""
        env = {**environ, **agent_env_extra(s, environ)}
        objects = attempt_objects(api, region=s.region, endpoint_url=s.endpoint_url, node_id=s.node_id)
        fill = cache_filler(cache_dir=s.cache_dir, objects=objects, model_root=env.get("GPUFLEET_MODEL_ROOT") or None,
                            model_s3_root=env.get("GPUFLEET_MODEL_S3_ROOT") or None, reverify_s=s.cache_reverify_s)
        return Prefetcher(fill, outcome=lambda o: self.metrics.prefetches.labels(o).inc())

    # ------------------------------------------------------------------ start / stop
    def start(self) -> None:
        """Start-up checks, orphan clean-up, node registration, background threads (non-blocking)."""
        live = self.state.live_agent_pid()
        if live is not None and live != os.getpid():
            raise ConfigError(f"another agent (pid {live}) is running with state dir {self.s.state_dir}")
        self.state.write_agent_pid(os.getpid())
        for rec in self.state.reap_orphans():
            log.warning("cleaned up orphaned job", extra={"job_id": rec.job_id, "epoch": rec.epoch})
        self.state.prune_completed(self.clock.now() - self.s.completed_retention_s)
        if self.s.metrics_enabled:
            self.metrics_port = self.metrics.serve(self.s.metrics_host, self.s.metrics_port)
        if self.warm is not None:
            self.warm.prestart([(i,) for i in self.slots.indices])
        self._heartbeat_node()
        log.info(
            "agent started",
            extra={"node": self.s.node_id, "accelerator": self.inventory.kind, "slots": self.slots.indices,
                   "metrics_port": self.metrics_port},
        )
        loops = [("poller", self._poll_loop), ("ticker", self._tick_loop)]
        if self.signal_queue is not None:
            loops.append(("signals", self._signal_loop))
        for name, target in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def run(self) -> int:
        """Run until drained. Installs SIGTERM/SIGINT handlers when called from the main thread."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self.start()
        while not self.clock.wait(self._drain, 0.2):
            pass
        self.drain()
        return self.exit_code

    def _on_signal(self, signum: int, _frame) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("signal received: draining", extra={"signal": signal.Signals(signum).name})
            self.request_drain()
        else:
            self.hard_exit()

    def request_drain(self) -> None:
        self._drain.set()
        self._tick.set()
        self._room.set()

    @property
    def draining(self) -> bool:
        return self._drain.is_set()

    def drain(self) -> None:
        """Stop taking work, let running jobs checkpoint, release unstarted messages, deregister."""
        self._drain.set()
        self._tick.set()
        self.metrics.draining.set(1)
        try:
            self._heartbeat_node()
        except TransientError as err:
            log.warning("could not mark the node draining", extra={"detail": str(err)})
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
            runners = list(self._runners.values())
        if self.prefetcher is not None:
            self.prefetcher.close()
        for h in held:
            self.queue.release(h.lease.receipt)
            log.info("released unstarted message", extra={"job_id": h.env.job_id, "epoch": h.env.epoch})
        for r in runners:
            r.request_drain()
        deadline = self.clock.monotonic() + self.s.drain_timeout_s
        for r in runners:
            r.join(max(0.0, deadline - self.clock.monotonic()))
        for r in runners:
            if r.is_alive():
                log.warning("job did not stop within the drain timeout; killing it", extra={"job_id": r.env.job_id})
                r.kill_now()
                r.join(10)
        for t in self._threads:
            t.join(self.s.poll_wait_s + 5)
        if self.warm is not None:
            self.warm.close()
        try:
            self.registry.put(self._node_item(draining=True, ttl_s=0), ttl_s=0)
        except TransientError as err:
            log.warning("could not deregister the node", extra={"detail": str(err)})
        self.metrics.stop()
        self.state.pid_path.unlink(missing_ok=True)
        self._done.set()
        log.info("agent drained")

    def hard_exit(self) -> None:
        """Second signal: kill every job's process group and exit now (exit code 1)."""
        log.warning("second signal: exiting at once")
        with self._lock:
            runners = list(self._runners.values())
        for r in runners:
            if r.child is not None:
                r.child.signal(signal.SIGKILL)
        if self.warm is not None:
            self.warm.kill_all()
        sys.stderr.flush()
        os._exit(1)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    # ------------------------------------------------------------------ node heartbeat
    def _node_item(self, draining: bool, ttl_s: int | None = None) -> dict:
        with self._lock:
            free = self.slots.free_milli()
            # jobs still holding GPUs: a job whose GPUs came back is reporting its outcome, and uses nothing more
            running = [r for key, r in self._runners.items() if key in self._slot_of]
        cpu_total = self.s.cpu_milli if self.s.cpu_milli is not None else (os.cpu_count() or 1) * 1000
        mem_total = self.s.memory_mib if self.s.memory_mib is not None else psutil.virtual_memory().total // 2**20
        cpu_used = sum(int(r.env.spec.resources.cpu * 1000) for r in running)
        mem_used = sum(int(r.env.spec.resources.memory_gb * 1024) for r in running)
        return node_item(
            node_id=self.s.node_id, pool=self.s.pool, queue_url=self.s.queue_url, inventory=self.inventory,
            free_milli=free, gpu_type=self.s.gpu_type, cpu_milli_free=max(0, cpu_total - cpu_used),
            memory_mib_free=max(0, mem_total - mem_used), labels=self.s.labels, cached_models=self.cache.model_names(),
            resident_models=self.warm.resident_models() if self.warm is not None else [],
            datasets=self._datasets(), now=self.clock.now(), ttl_s=self.s.node_ttl_s if ttl_s is None else ttl_s,
            draining=draining or self.draining, running_jobs=len(running),
        )

    def _datasets(self) -> list[str]:
        """The configured datasets, then the staged inputs in the cache (most recently used first), within the
        node API's budget (:func:`gpufleet.nodeapi.liveness.bounded`): nothing the server would cut."""
        staged = self.cache.input_uris(self.s.advertise_inputs, DATASETS_MAX_CHARS) if self.s.advertise_inputs else []
        return bounded([*self.s.datasets, *staged], DATASETS_MAX_CHARS, URI_MAX_CHARS)

    def _heartbeat_node(self) -> None:
        item = self._node_item(draining=self.draining)
        shipped = self.shipped.pending(self.sampler.sample(), self.cache.stats())
        self.registry.put(item, ttl_s=self.s.node_ttl_s, metrics=ShippedMetrics.body(shipped))
        self.shipped.sent(shipped)
        self.state.write_status({"pid": os.getpid(), "heartbeat_at": self.clock.now(), "draining": item["draining"],
                                 "running_jobs": item["running_jobs"], "node_id": self.s.node_id})
        self.metrics.free_gpus.set(self.slots.whole_free())

    def _tick_loop(self) -> None:
        """Every ``heartbeat_interval_s`` the held messages' task heartbeats; every ``node_heartbeat_s`` the node's
        heartbeat, and at once when GPUs came free (:meth:`release_gpus`): the scheduler counts a GPU free only
        once both its booking is released and the node reports it free, so a stale report would keep a freed GPU
        idle (or send the next job to another pool) until the next beat."""
        now = self.clock.monotonic()
        next_held, next_node = now + self.s.heartbeat_interval_s, now + self.s.node_heartbeat_s
        while not self._drain.is_set():
            self.clock.wait(self._tick, max(0.0, min(next_held, next_node) - self.clock.monotonic()))
            if self._drain.is_set():
                return
            self._tick.clear()
            with self._lock:
                freed, self._freed = self._freed, False
            if self.clock.monotonic() >= next_held:
                with self._lock:
                    held = list(self._held.values())
                for h in held:
                    self._keep_held(h)
                next_held = self.clock.monotonic() + self.s.heartbeat_interval_s
            due = self.clock.monotonic() >= next_node
            if freed or due:
                if due:
                    evicted = self.cache.evict()
                    if evicted:
                        log.info("cache entries evicted", extra={"keys": evicted})
                try:
                    self._heartbeat_node()
                    self._registered(True, "")
                except NodeRefused as err:
                    self.metrics.heartbeat_errors.labels("node").inc()
                    self._registered(False, str(err))
                    log.warning("node heartbeat failed", extra={"detail": str(err)})
                except (TransientError, OSError) as err:
                    self.metrics.heartbeat_errors.labels("node").inc()
                    log.warning("node heartbeat failed", extra={"detail": str(err)})
                next_node = self.clock.monotonic() + self.s.node_heartbeat_s

    def _registered(self, accepted: bool, detail: str) -> None:
        """Track whether the node API accepts this node (``gpufleet_agent_registered``); say so once per change."""
        if accepted == self._accepted:
            return
        self._accepted = accepted
        self.metrics.registered.set(1 if accepted else 0)
        if accepted:
            log.info("node registered again: the node API accepts its heartbeats")
        else:
            log.error("node not registered: the node API refuses every call of this node (deregistered by an "
                      "operator?); stop the agent, or have the node registered again", extra={"detail": detail})

    def _keep_held(self, h: Held) -> None:
        """An unstarted message stays ours: extend its visibility and heartbeat its task (node API). A cancelled
        one does not wait for GPUs: a runner reports it CANCELLED now (its pre-flight check reads the cancel)."""
        self.queue.extend(h.lease.receipt, self.s.visibility_timeout_s)
        try:
            view = self.reports.heartbeat(h.env.job_id, h.env.epoch)
            if view.cancel_requested:
                self._settle_cancelled(h)
        except (TaskGone, StaleEpoch, NotAllowed):
            key = (h.env.job_id, h.env.epoch)
            with self._lock:
                dropped = self._held.pop(key, None) is not None
            if dropped:
                if self.prefetcher is not None:
                    self.prefetcher.forget(key, stop=True)
                log.warning("held message dropped: its task is gone", extra={"job_id": key[0], "epoch": key[1]})
                self.metrics.duplicates.labels("task_gone").inc()
                self.queue.delete(h.lease.receipt)
        except TransientError as err:
            self.metrics.heartbeat_errors.labels("task").inc()
            log.warning("heartbeat of a held task failed", extra={"job_id": h.env.job_id, "detail": str(err)})

    def _settle_cancelled(self, h: Held) -> None:
        """A held message whose job was cancelled: a runner without GPUs settles it (its pre-flight check reports
        CANCELLED, records the attempt completed and deletes the message); nothing is spawned."""
        key = (h.env.job_id, h.env.epoch)
        with self._lock:
            if self.draining or self._held.pop(key, None) is None:
                return  # a drain releases held messages; another thread settled this one
            runner = JobRunner(self.ports, h.env, h.lease, [], h.req, settle_only=True)
            self._runners[key] = runner
        if self.prefetcher is not None:
            self.prefetcher.forget(key, stop=True)
        log.info("held message cancelled before start", extra={"job_id": key[0], "epoch": key[1]})
        runner.start()
        self._room.set()

    def _signal_loop(self) -> None:
        """Long-poll the node's signal queue; a cancel nudge heartbeats that attempt now (a running job's runner, or
        a held message), so a cancel reaches the job in about a second instead of at the next heartbeat. A queue
        that is missing or refused (a node registered before signal queues) leaves cancels to the heartbeats and is
        looked for again every ``signals_recheck_s`` (re-registering the node creates it: no restart needed)."""
        backoff, missing = 0.5, False
        while not self.draining:
            try:
                nudges = self.signal_queue.receive(self.s.poll_wait_s)
                backoff = 0.5
            except TransientError as err:
                backoff = self._back_off("signal poll failed; backing off", err, backoff)
                continue
            if nudges is None:
                if not missing:
                    log.warning("no signal queue for this node; cancels are seen at the next heartbeat",
                                extra={"queue_url": self.signal_queue.url, "recheck_s": self.s.signals_recheck_s})
                missing = True
                self.clock.wait(self._drain, self.s.signals_recheck_s)
                continue
            if missing:
                log.info("signal queue found; cancel nudges on", extra={"queue_url": self.signal_queue.url})
                missing = False
            for key in nudges:
                self.nudge(key)

    def _back_off(self, msg: str, err: TransientError, backoff: float) -> float:
        """A failed long poll: log, wait a jittered ``backoff`` (a drain ends the wait), return the next one."""
        log.warning(msg, extra={"detail": str(err)})
        self.clock.wait(self._drain, backoff * (1 + random.random()))
        return min(backoff * 2, 30.0)

    def nudge(self, key: tuple[str, int]) -> None:
        """Check attempt ``key`` with the node API now (a cancel nudge); unknown attempts are ignored."""
        with self._lock:
            runner, held = self._runners.get(key), self._held.get(key)
        target = "running" if runner else "held" if held else "unknown"
        self.metrics.nudges.labels(target).inc()
        log.info("cancel nudge", extra={"job_id": key[0], "epoch": key[1], "target": target})
        if runner is not None:
            runner.check_now()
        elif held is not None:
            self._keep_held(held)

    # ------------------------------------------------------------------ polling and dispatch
    def _room_for(self) -> int:
        """Messages to take now: one per free GPU plus ``prefetch``; with batching, a batch's worth per free GPU
        plus at least a batch's worth held."""
        with self._lock:
            per_slot = self.s.batch_max_members if self._batching() else 1
            prefetch = max(self.s.prefetch, per_slot)  # with batching, a batch's worth waits for the next GPU
            return self.slots.whole_free() * per_slot + prefetch - len(self._held)

    def _poll_loop(self) -> None:
        backoff = 0.5
        while not self.draining:
            room = self._room_for()
            if room <= 0:
                self.clock.wait(self._room, 1.0)
                self._room.clear()
                continue
            try:
                msgs = self.queue.receive(room, self.s.poll_wait_s, self.s.visibility_timeout_s)
                backoff = 0.5
            except TransientError as err:
                backoff = self._back_off("poll failed; backing off", err, backoff)
                continue
            for m in msgs:
                self.accept(m)
            self.dispatch()

    def accept(self, m: Message) -> None:
        """Take one received message: drop duplicates and malformed ones, hold the rest for dispatch."""
        try:
            env = Envelope.model_validate_json(m.body)
        except ValidationError as err:
            self._reject_malformed(m, str(err))
            return
        key = (env.job_id, env.epoch)
        with self._lock:
            if key in self._runners:
                self._runners[key].lease.receipt = m.receipt
                self.metrics.duplicates.labels("in_flight").inc()
                return
            if key in self._held:
                self._held[key].lease.receipt = m.receipt
                self.metrics.duplicates.labels("held").inc()
                return
            if self.draining:
                self.queue.release(m.receipt)
                return
        done = self.state.completed(env.job_id, env.epoch)
        if done is not None:
            log.info("redelivered message of a completed attempt dropped",
                     extra={"job_id": env.job_id, "epoch": env.epoch, "outcome": done})
            self.metrics.duplicates.labels("completed").inc()
            self.queue.delete(m.receipt)
            return
        req = request_for(env)
        try:
            self.slots.check(req)
        except BadRequest as err:
            self._fail_unrunnable(env, m, err.detail)
            return
        with self._lock:
            self._held[key] = Held(env=env, lease=Lease(message=m, receipt=m.receipt), req=req)
        log.info("message accepted", extra={"job_id": env.job_id, "epoch": env.epoch, "message_id": m.message_id})

    def _batching(self) -> bool:
        return self.warm is not None and self.s.batch_max_members > 1

    def _batch_key(self, h: Held):
        """What held jobs must share to run as one batch (None: alone): the spec's compatibility key, the GPU request
        (so the batch's GPUs are each member's) and the pinned model content (one batch runs one model's weights:
        a job admitted before its model was re-registered never runs in a batch of the new content)."""
        if not (self._batching() and serves(h.env)):
            return None
        key = batch_key(h.env.spec)
        return None if key is None else (key, h.req, h.env.model_hash)

    def dispatch(self) -> None:
        """Start every held job whose GPUs are free, oldest first; with batching on, compatible held jobs go
        together to one GPU set's warm worker (:func:`gpufleet.batching.group`). The jobs left waiting are
        offered to the prefetcher."""
        started = []
        with self._lock:
            if self.draining:
                return
            held = list(self._held.items())
            for group in batching.group(held, lambda kv: self._batch_key(kv[1]), self.s.batch_max_members):
                (key, h), members = group[0], group
                holder = f"{key[0]}@{key[1]}"
                gpus = self.slots.acquire(holder, h.req)
                if gpus is None:
                    continue
                launch = None
                if len(members) > 1:
                    launch = BatchLaunch(self.warm, tuple(gpus), len(members), self.s.cancel_grace_s)
                    log.info("dispatching a batch", extra={"jobs": [f"{k[0]}@{k[1]}" for k, _ in members],
                                                           "gpus": gpus})
                self._holders[holder] = len(members)
                for k, m in members:
                    del self._held[k]
                    runner = JobRunner(self.ports, m.env, m.lease, gpus, m.req, batch=launch)
                    self._runners[k] = runner
                    self._slot_of[k] = holder
                    started.append(runner)
            waiting = [h.env for h in self._held.values()]
            self.metrics.running.set(len(self._runners))
            self.metrics.free_gpus.set(self.slots.whole_free())
        if self.prefetcher is not None:  # the jobs still held fetch their data while they wait
            for r in started:  # a fetch in flight goes on: the runtime waits for it on the cache's locks
                self.prefetcher.forget(r.key)
            for env in waiting:
                self.prefetcher.offer(env)
        for r in started:
            r.start()

    def job_started(self, runner: JobRunner, at: float) -> None:
        self.metrics.queue_wait.observe(max(0.0, at - runner.lease.message.sent_at))
        with self._lock:
            for i in runner.gpus:
                since = self._free_since.pop(i, None)
                if since is not None:
                    self.metrics.idle_gap.observe(max(0.0, at - since))

    def release_gpus(self, runner: JobRunner) -> None:
        """The runner's job no longer runs: its GPUs go back (a batch's once its last member is gone) and held
        jobs start on them — before the outcome is reported, so a GPU does not idle through the report's round
        trips. Once per runner (the runner's end calls it again through :meth:`job_finished`)."""
        now = self.clock.now()
        with self._lock:
            holder = self._slot_of.pop(runner.key, None)
            if holder is None:
                return
            left = self._holders.get(holder, 1) - 1
            if left > 0:  # other members of its batch still hold the GPUs
                self._holders[holder] = left
            else:
                self._holders.pop(holder, None)
                for i in self.slots.release(holder):
                    self._free_since[i] = now
                self._freed = True
            freed = self._freed
            self.metrics.free_gpus.set(self.slots.whole_free())
        if freed:
            self._tick.set()  # the node reports the GPUs free now (:meth:`_tick_loop`)
        self._room.set()
        self.dispatch()

    def job_finished(self, runner: JobRunner) -> None:
        self.release_gpus(runner)  # a runner whose child never started (or ended early) releases here
        with self._lock:
            self._runners.pop(runner.key, None)
            self.metrics.running.set(len(self._runners))
        self._room.set()
        self.dispatch()

    # ------------------------------------------------------------------ unrunnable messages
    def _reject_malformed(self, m: Message, detail: str) -> None:
        log.error("malformed envelope dropped", extra={"message_id": m.message_id, "detail": detail[:500]})
        try:
            doc = json.loads(m.body)
            job_id, epoch = str(doc["job_id"]), int(doc["epoch"])
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
            job_id, epoch = None, None
        if job_id is not None:
            try:
                self.reports.fail(job_id, epoch, "SYSTEM_ERROR", "malformed envelope")
            except GpufleetError as err:
                log.warning("could not report malformed envelope", extra={"detail": str(err)})
        self.metrics.jobs.labels("SYSTEM_ERROR").inc()
        self.queue.delete(m.receipt)

    def _fail_unrunnable(self, env: Envelope, m: Message, detail: str) -> None:
        log.error("placement does not fit this node", extra={"job_id": env.job_id, "epoch": env.epoch, "detail": detail})
        try:
            self.reports.fail(env.job_id, env.epoch, "SYSTEM_ERROR", detail)
        except GpufleetError as err:
            log.warning("could not report unrunnable placement", extra={"detail": str(err)})
        self.state.record_completed(env.job_id, env.epoch, "SYSTEM_ERROR", self.clock.now())
        self.metrics.jobs.labels("SYSTEM_ERROR").inc()
        self.queue.delete(m.receipt)
