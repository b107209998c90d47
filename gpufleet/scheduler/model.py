"""The snapshot a scheduling pass works on (pure data, no I/O).

Contract:
- A :class:`Snapshot` is taken once per pass (``gpufleet.store.snapshot`` builds it
  from DynamoDB; the simulator builds it from a trace). Policies read it and never
  mutate it; the pass keeps its own working copy of capacity and usage.
- Amounts of GPU are in milli (1000 = one GPU). Times are epoch seconds from the
  injected clock. Quota usage is keyed by owner path (``tenant``,
  ``tenant/team``, ``tenant/team/user``) and GPU type (``"*"`` = all types).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.pools import Pool
from gpufleet.scheduler.nodetable import MILLI, Request

ANY = "any"
ALL_TYPES = "*"


@dataclass(frozen=True)
class NodeState:
    """An on-prem node as its agent last reported it (free capacity per GPU index)."""

    node_id: str
    pool: str
    gpu_type: str
    gpu_free: tuple[int, ...]  # milli free per GPU index
    cpu_milli_free: int
    memory_mib_free: int
    queue_url: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    cached_models: frozenset[str] = frozenset()
    resident_models: frozenset[str] = frozenset()  # loaded in a warm worker now (a subset of what it can run at once)
    datasets: frozenset[str] = frozenset()
    draining: bool = False
    expires_at: float = float("inf")
    topology: str = ""  # the GPUs' pairwise links (gpufleet.topology code); "" unknown

    def usable(self, now: float) -> bool:
        return not self.draining and self.expires_at > now


@dataclass(frozen=True)
class PendingJob:
    """A PENDING job as the scheduler sees it. Resources are per gang member (node)."""

    job_id: str
    tenant: str
    team: str
    user: str
    priority: int = 100
    created_at: float = 0.0
    pending_since: float = 0.0
    num_gpu: int = 1
    gpu_milli: int = MILLI  # per GPU
    gpu_type: str = ANY
    cpu_milli: int = 1000
    memory_mib: int = 4096
    nodes: int = 1  # gang size: members are placed on distinct nodes, all or nothing
    policy: str | None = None  # cost | latency | locality; None → tenant default
    residency: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    input_gb: float = 0.0
    model: str | None = None
    observed_epoch: int = 0
    placement_token: str | None = None
    attempts: int = 0  # run attempts (``attempt_count``)
    backoff_until: float = 0.0
    #: UNRESOLVABLE/ERROR decisions recorded on the job so far (``sched_attempts``): its backoff's exponent
    sched_attempts: int = 0
    #: the cluster shape its UNRESOLVABLE backoff was judged on (``sched_shape``; "" none: only the time wakes it)
    backoff_shape: str = ""
    last_preempted_at: float | None = None
    pools: tuple[str, ...] = ()  # allowlist: only these pools (empty = any pool)
    avoid_nodes: frozenset[str] = frozenset()  # nodes an earlier attempt crashed on or was lost on
    wait_reason: str = ""  # the reason the job item shows for its wait (``sched_reason``), as last recorded
    deadline: float | None = None  # the spec's deadline (epoch s): not started by then → EXPIRED
    #: False for a container job whose image is not pinned by digest: cloud pools run images by digest only
    #: (a Batch job definition per image digest, gpufleet.batchdef), so such a job runs on-prem
    image_pinned: bool = True

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError("a job has at least one member")
        _ = self.request  # validates the resource shape (raises ValueError)

    @property
    def owner_path(self) -> str:
        return f"{self.tenant}/{self.team}/{self.user}"

    @property
    def request(self) -> Request:
        types = frozenset() if self.gpu_type == ANY else frozenset({self.gpu_type})
        return Request(self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli if self.num_gpu else 0, types)

    @property
    def total_gpu_milli(self) -> int:
        return self.nodes * self.num_gpu * (self.gpu_milli if self.num_gpu else 0)


def allowed_pools(job: PendingJob, pools: tuple[Pool, ...] | list[Pool]) -> list[Pool]:
    """The pools ``job`` may be placed on: its allowlist (``job.pools``) or, when empty, all of them."""
    if not job.pools:
        return list(pools)
    wanted = set(job.pools)
    return [p for p in pools if p.name in wanted]


@dataclass(frozen=True)
class Member:
    """Where one gang member runs: a node (on-prem) or a pool slot (cloud: node is None)."""

    node: str | None
    gpu_indices: tuple[int, ...] = ()
    queue_url: str = ""
    gpu_link: str = ""  # worst link within gpu_indices (gpufleet.topology.link_of); "" for one GPU or cloud


@dataclass(frozen=True)
class Allocation:
    """A running (or scheduled) attempt holding capacity."""

    job_id: str
    epoch: int
    owner_path: str
    priority: int
    pool: str
    gpu_type: str
    members: tuple[Member, ...]
    gpu_milli: int  # per GPU
    num_gpu: int  # per member
    cpu_milli: int = 0
    memory_mib: int = 0
    started_at: float = 0.0
    checkpoint_at: float | None = None
    last_preempted_at: float | None = None
    preempt_requested: bool = False  # a pass asked it to stop; its capacity is about to be freed

    @property
    def request(self) -> Request:
        """The capacity one member holds on its node."""
        return Request(self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli if self.num_gpu else 0)

    @property
    def total_gpu_milli(self) -> int:
        return len(self.members) * self.num_gpu * self.gpu_milli

    def lost_work_s(self, now: float) -> float:
        """Work lost if preempted now: time since the last checkpoint (or the start)."""
        since = max(self.started_at, self.checkpoint_at or self.started_at)
        return max(0.0, now - since)


@dataclass(frozen=True)
class QuotaNode:
    """One node of the quota tree: guarantees, borrowing limits and weights per GPU type.

    ``limit(t) = guarantee(t) + borrow_limit(t)``; a type absent from a map falls
    back to its ``"*"`` entry; absent there too means no limit (guarantee 0).
    """

    path: str
    guarantee: dict[str, int] = field(default_factory=dict)
    borrow_limit: dict[str, int] = field(default_factory=dict)
    weight: dict[str, float] = field(default_factory=dict)

    def guaranteed(self, gpu_type: str) -> int:
        return int(self.guarantee.get(gpu_type, self.guarantee.get(ALL_TYPES, 0)))

    def limit(self, gpu_type: str) -> int | None:
        if gpu_type not in self.guarantee and gpu_type not in self.borrow_limit:
            if ALL_TYPES not in self.guarantee and ALL_TYPES not in self.borrow_limit:
                return None
            key = ALL_TYPES
        else:
            key = gpu_type
        return int(self.guarantee.get(key, 0)) + int(self.borrow_limit.get(key, 0))

    def weight_for(self, gpu_type: str) -> float:
        return float(self.weight.get(gpu_type, self.weight.get(ALL_TYPES, 1.0)))


@dataclass(frozen=True)
class Snapshot:
    now: float
    jobs: tuple[PendingJob, ...]
    nodes: tuple[NodeState, ...]
    pools: tuple[Pool, ...]
    quotas: dict[str, QuotaNode] = field(default_factory=dict)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> gpu type -> milli in use
    running: tuple[Allocation, ...] = ()
    pool_used: dict[str, int] = field(default_factory=dict)  # cloud pool -> GPU milli in use
    tenant_policy: dict[str, str] = field(default_factory=dict)  # tenant -> default placement policy


def ancestors(owner_path: str) -> list[str]:
    """``a/b/c`` → ``["a", "a/b", "a/b/c"]``."""
    parts = owner_path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]
