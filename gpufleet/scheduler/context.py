"""The vocabulary plugins share: the pass's tunables, its working state and its decisions (pure).

- :class:`PassSettings`: the numeric tunables and default policy plugins read
  (``ctx.settings``); :class:`gpufleet.scheduler.framework.SchedulerConfig` extends it
  with the plugin names.
- :class:`Placement`: a reservation made by the pass, not yet committed.
- :class:`Choice` and :class:`PackingPolicy`: a node-level packing decision and the
  protocol of the policies that make it (the pass context carries the configured one).
- :class:`PassContext`: the working state of one pass — per-pool node tables, pool
  usage, the quota ledger, the packer, the pass's random generator, and the running
  allocations indexed as preemption candidates (built on first use; victims are
  recorded with :meth:`PassContext.mark_preempting`).

This module imports no plugin, no registry and not the cycle, so plugins can
import it freely.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.placement import Placement as PlacementDoc
from gpufleet.placement import PlacementMember
from gpufleet.pools import Pool, PoolKind
from gpufleet.scheduler.candidates import CandidateIndex
from gpufleet.scheduler.fragmentation import TaskMix
from gpufleet.scheduler.model import ANY, Allocation, Member, NodeState, PendingJob, Snapshot
from gpufleet.scheduler.nodetable import MAX_GPUS, MILLI, NodeTable, Request
from gpufleet.scheduler.quota import QuotaLedger
from gpufleet.topology import Topology


class PassSettings(BaseModel):
    """The tunables of a pass (everything but the plugin names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_policy: str = "cost"
    aging_per_minute: float = Field(1.0, ge=0, description="priority points gained per minute waiting")
    starvation_s: float = Field(1800.0, gt=0, description="a job waiting longer blocks backfill onto its pools")
    preemption_window_s: float = Field(900.0, ge=0, description="a job is preempted at most once per window")
    expected_runtime_h: float = Field(1.0, gt=0, description="runtime assumed for cost when the job gives none")
    max_jobs_per_pass: int = Field(10_000, ge=1)
    burst_after_s: float = Field(0.0, ge=0, description="burst-after-wait: pending time before paid cloud pools")


@dataclass(frozen=True)
class Placement:
    """A reservation made by the pass (not yet committed)."""

    job: PendingJob
    pool: Pool
    gpu_type: str
    members: tuple[Member, ...]
    charge_milli: int

    @property
    def target(self) -> str:
        return "cloud" if self.pool.kind.is_cloud else "onprem"

    def to_json(self, epoch: int) -> dict:
        """The placement document (:class:`gpufleet.placement.Placement`; ``members`` for gangs only)."""
        first = self.members[0]
        members = [
            PlacementMember(node=m.node, queue_url=m.queue_url or None, gpu_indices=list(m.gpu_indices),
                            gpu_link=m.gpu_link)
            for m in self.members
        ] if len(self.members) > 1 else None
        return PlacementDoc(
            epoch=epoch,
            attempt=epoch,
            target=self.target,
            pool=self.pool.name,
            node=first.node,
            queue_url=first.queue_url or None,
            job_queue=self.pool.job_queue,
            job_definition=self.pool.job_definition,
            gpu_indices=list(first.gpu_indices),
            gpu_link=first.gpu_link,
            gpu_milli=self.job.gpu_milli if self.job.num_gpu else 0,
            gpu_type=self.gpu_type,
            price_per_gpu_hour=self.pool.price_per_gpu_hour,
            members=members,
        ).model_dump(mode="json")


@dataclass(frozen=True)
class Choice:
    """A packing decision: node index in the table and the GPU indices taken on it."""

    node: int
    gpus: tuple[int, ...]


class PackingPolicy(Protocol):
    """Node-level packing: where (node, GPUs) a request goes; ``None`` when no node fits.

    ``rng`` breaks ties, so a run is reproducible from its seed; ``mix`` is the recent
    task-shape mix (policies that measure fragmentation need it). A policy answers None
    exactly when no node is feasible (:meth:`NodeTable.feasible`); one that never draws from
    ``rng`` may say so with a class attribute ``draws_rng = False`` (absent: it may draw), and
    callers that only need to know whether a request fits then check feasibility instead."""

    name: str

    def choose(self, table: NodeTable, req: Request, rng: np.random.Generator, mix: TaskMix | None = None) -> Choice | None: ...


def _node_table(nodes: list[NodeState]) -> NodeTable:
    return NodeTable(
        [n.node_id for n in nodes],
        [n.gpu_type for n in nodes],
        [n.cpu_milli_free for n in nodes],
        [n.memory_mib_free for n in nodes],
        [min(len(n.gpu_free), MAX_GPUS) for n in nodes],
        topology=[Topology.parse(range(min(len(n.gpu_free), MAX_GPUS)), n.topology) for n in nodes],
        gpu_free=np.array([list(n.gpu_free[:MAX_GPUS]) + [0] * (MAX_GPUS - min(len(n.gpu_free), MAX_GPUS)) for n in nodes]).reshape(
            len(nodes), MAX_GPUS
        ),
    )


class PassContext:
    """Working state of one pass: per-pool node tables, pool usage, quota ledger, packer."""

    def __init__(self, snapshot: Snapshot, settings: PassSettings, packer: PackingPolicy, seed: int = 0) -> None:
        self.snapshot = snapshot
        self.settings = settings
        self.packer = packer
        self.now = snapshot.now
        self.rng = np.random.default_rng(seed)
        self.pools = {p.name: p for p in snapshot.pools}
        self.ledger = QuotaLedger(snapshot.quotas, snapshot.usage)
        self.pool_used: dict[str, int] = defaultdict(int, snapshot.pool_used)
        self.placed_to: Counter[str] = Counter()
        self.running = list(snapshot.running)
        self.preempting: set[str] = {a.job_id for a in snapshot.running if a.preempt_requested}
        by_pool: dict[str, list[NodeState]] = defaultdict(list)
        for n in snapshot.nodes:
            if n.usable(self.now) and n.pool in self.pools and self.pools[n.pool].kind is PoolKind.ONPREM:
                by_pool[n.pool].append(n)
        self.nodes_by_pool = dict(by_pool)
        self.tables = {p: _node_table(ns) for p, ns in by_pool.items()}
        self.node_index = {p: {n.node_id: i for i, n in enumerate(ns)} for p, ns in by_pool.items()}
        self._queue_url = {n.node_id: n.queue_url for n in snapshot.nodes}
        self._max_fit_cache: dict[tuple, int] = {}
        self._candidates: CandidateIndex | None = None
        cap: Counter[str] = Counter()
        for p in snapshot.pools:
            if p.kind.is_cloud:
                cap[p.gpu_type] += p.max_gpus * MILLI
        for ns in by_pool.values():
            for n in ns:
                cap[n.gpu_type] += len(n.gpu_free) * MILLI
        self.capacity_by_type = dict(cap)
        reqs = [j.request for j in snapshot.jobs] + [a.request for a in snapshot.running]
        self.mix = TaskMix.from_requests(reqs) if reqs else None

    # -- helpers used by plugins ---------------------------------------------------
    def candidates(self) -> CandidateIndex:
        """The running allocations indexed as preemption candidates (built once per pass)."""
        if self._candidates is None:
            self._candidates = CandidateIndex(
                self.running, self.node_index, self.preempting, self.ledger.quotas, self.now, self.settings.preemption_window_s
            )
        return self._candidates

    def mark_preempting(self, victim: Allocation) -> None:
        """``victim`` is to be preempted: its capacity counts as being freed for the rest of the pass."""
        self.preempting.add(victim.job_id)
        if self._candidates is not None:
            self._candidates.mark(victim.job_id)

    def charge_milli(self, job: PendingJob, pool: Pool) -> int:
        """GPU milli charged to quota for ``job`` in ``pool`` (cloud rounds shares up to whole GPUs)."""
        if pool.kind.is_cloud:
            return job.nodes * job.num_gpu * MILLI
        return job.total_gpu_milli

    def queue_url(self, node_id: str) -> str:
        return self._queue_url.get(node_id, "")

    def pool_max_member_fit(self, pool: str, job: PendingJob) -> int:
        """How many distinct nodes of ``pool`` could hold one member if they were empty."""
        key = (pool, job.num_gpu, job.gpu_milli, job.cpu_milli, job.memory_mib, job.gpu_type)
        if key not in self._max_fit_cache:
            count = 0
            for n in self.nodes_by_pool.get(pool, []):
                type_ok = job.gpu_type in (ANY, n.gpu_type) or job.num_gpu == 0
                if type_ok and len(n.gpu_free) >= job.num_gpu:
                    count += 1
            self._max_fit_cache[key] = count
        return self._max_fit_cache[key]

    def pool_has_room(self, pool: str, job: PendingJob) -> bool:
        table = self.tables.get(pool)
        return table is not None and int(table.feasible(job.request).sum()) >= job.nodes

    def pool_data(self, pool: str) -> set[str]:
        out: set[str] = set()
        for n in self.nodes_by_pool.get(pool, []):
            out |= n.cached_models | n.datasets
        return out

    def preferred_nodes(self, pool: str, job: PendingJob) -> np.ndarray | None:
        """For locality jobs: the nodes with the job's model loaded in a warm worker if any, else the nodes
        holding any of its inputs or its model in their cache (None = no preference)."""
        if self.policy_of(job) != "locality":
            return None
        nodes = self.nodes_by_pool.get(pool, [])
        if job.model:
            resident = np.array([job.model in n.resident_models for n in nodes], dtype=bool)
            if resident.any():
                return resident
        wanted = set(job.inputs) | ({job.model} if job.model else set())
        if not wanted:
            return None
        mask = np.array([bool(wanted & (n.cached_models | n.datasets)) for n in nodes], dtype=bool)
        return mask if mask.any() else None

    def avoid_mask(self, pool: str, job: PendingJob) -> np.ndarray | None:
        """Nodes of ``pool`` the job failed on earlier (None = none of them is in this pool)."""
        if not job.avoid_nodes:
            return None
        mask = np.array([n.node_id in job.avoid_nodes for n in self.nodes_by_pool.get(pool, [])], dtype=bool)
        return mask if mask.any() else None

    def policy_of(self, job: PendingJob) -> str:
        return job.policy or self.snapshot.tenant_policy.get(job.tenant) or self.settings.default_policy
