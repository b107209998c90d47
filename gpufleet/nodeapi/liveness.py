"""A node's registration and its heartbeat (pure): what an operator binds, what a node may report.

Contract:
- :class:`Registration` is written by an operator (``POST /v1/nodes``, admin only): the node's pool,
  site, residency labels and inventory (GPU count and type, per-GPU memory, CPU and memory). A node
  never writes it.
- :class:`LivenessReport` is what a node's heartbeat may say: free milli-GPUs per device, free CPU and
  memory, cached models, staged datasets, draining, running jobs, and the GPUs' pairwise links
  (``topology``: :meth:`gpufleet.topology.Topology.code`, read through NVML; absent when unknown).
- :class:`NodeMetricsReport` (the report's optional ``metrics``) is what the node's agent measured since its
  previous report: NVML utilisation per GPU (none without NVML: never a made-up number) and cache hits and
  misses. :func:`node_metrics` clamps it the same way: only registered GPUs, shares within 0..1.
- :func:`node_item` builds the ``NODE#<id>`` / ``NODE`` item the scheduler reads (docs/contracts.md)
  from the registration, with the report clamped into it: pool, queue, GPU type, labels and the device
  list come from the registration; a reported device the registration does not have is ignored, free
  milli is bounded by 0..1000 (0 when draining), free CPU and memory by the registered amounts;
  a node an operator drained (``drained``) reports draining whatever it says; ``gpu_topology`` is the
  reported topology when it has exactly one letter per pair of the registered GPUs, else ``""`` (unknown);
  ``heartbeat_at`` and ``expires_at`` come from the server's clock (``ttl_s`` bounded by ``max_ttl_s``).
  So a heartbeat cannot move a node to another pool or site, or add capacity it was not registered with.
- :func:`became_usable` (the previous node item, the new one, the time): the heartbeat made the node usable for
  placements — it had no item, its item had expired (the scheduler no longer counted it) or it was draining, and
  the new one is not draining. :func:`freed_capacity`: the heartbeat reports a GPU freer than the previous one did
  (a job on it ended; the agent reports at once when GPUs come free), at least :data:`FREED_WAKE_MIN_INTERVAL_S`
  after that one (a node flipping its report gets at most one wake-up a second). Either way the node API wakes the scheduler
  (``NodeReady``), so jobs waiting for such a node are placed now rather than at the timer's next pass (a pass counts
  a GPU free only once its booking is released *and* its node reports it free, and the two land in either order).
- The name lists are bounded so the node item stays far below DynamoDB's 400 KB (about 150 KB at most):
  :func:`bounded` keeps the report's order, drops names longer than the spec allows (a model name
  :data:`NAME_MAX_CHARS`, an input URI :data:`URI_MAX_CHARS`) and stops at a character budget
  (:data:`MODELS_MAX_CHARS` for ``cached_models``, :data:`RESIDENT_MAX_CHARS`, :data:`DATASETS_MAX_CHARS`).
  ``datasets`` are the ``s3://`` objects on the node's disk: the operator's static list and the inputs the
  runtime staged into its cache, the most recently used first (docs/agent.md). What a node claims there only
  ranks it for locality among the nodes a job may use anyway (docs/security.md, "Node reports").
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufleet.clock import epoch_seconds, iso
from gpufleet.spec import LIMITS
from gpufleet.topology import Topology

#: node ids: 2-42 of a-z, 0-9, '-', starting and ending with a letter or digit, never ending in -dlq
#: (a node's queue is <prefix><id> and its dead-letter queue <prefix><id>-dlq)
NODE_ID_PATTERN = re.compile(r"^(?!.*-dlq$)[a-z0-9][a-z0-9-]{0,40}[a-z0-9]$")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

#: the longest model name and input URI a spec may give (gpufleet.spec.LIMITS): longer names match no job
NAME_MAX_CHARS = int(LIMITS["model_max_chars"])
URI_MAX_CHARS = int(LIMITS["input_uri_max_chars"])
#: character budgets of the node item's name lists (see module)
MODELS_MAX_CHARS = 64 * 1024
RESIDENT_MAX_CHARS = 16 * 1024
DATASETS_MAX_CHARS = 64 * 1024


def bounded(names: list[str], max_chars: int, item_max_chars: int) -> list[str]:
    """``names`` in order, without repeats or names over ``item_max_chars``, up to ``max_chars`` together."""
    out: dict[str, None] = {}
    chars = 0
    for n in names:
        if n in out or len(n) > item_max_chars or chars + len(n) > max_chars:
            continue
        out[n] = None
        chars += len(n)
    return list(out)


class Registration(BaseModel):
    """What an operator binds a node to; see the module contract."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: str
    pool: str = Field(pattern=_NAME)
    site: str = Field("", max_length=128)
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_type: str = Field("cpu", max_length=64)
    gpus: int = Field(1, ge=0, le=64, description="GPU devices (or CPU slots on a node without GPUs)")
    gpu_memory_gb: float = Field(0, ge=0)
    cpu_milli: int = Field(0, ge=0, description="0: not advertised")
    memory_mib: int = Field(0, ge=0, description="0: not advertised")
    drained: bool = Field(False, description="an operator drained the node: no new placements")
    queue_url: str = ""
    registered_by: str = ""
    registered_at: str = ""

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, v: str) -> str:
        if not NODE_ID_PATTERN.match(v):
            raise ValueError("node_id must be 2-42 characters of a-z, 0-9 and '-', start and end with a letter or "
                             "digit, and not end in -dlq")
        return v

    def bound_labels(self) -> dict[str, str]:
        """The registered labels with ``site`` set from the registration (residency is the operator's)."""
        labels = dict(self.labels)
        if self.site:
            labels["site"] = self.site
        return labels


class NodeMetricsReport(BaseModel):
    """What a node's agent measured (see the module contract)."""

    model_config = ConfigDict(extra="forbid")
    gpu_busy: dict[int, float] = Field(default_factory=dict, description="device index -> NVML utilisation 0..1")
    cache_hits: int = Field(0, ge=0, le=10**9, description="since the previous report")
    cache_misses: int = Field(0, ge=0, le=10**9, description="since the previous report")


class LivenessReport(BaseModel):
    """What a node's heartbeat may report (anything else it sends is refused: ``extra="forbid"``)."""

    model_config = ConfigDict(extra="forbid")

    free_milli: dict[int, int] = Field(default_factory=dict, description="device index -> free milli-GPUs")
    cpu_milli_free: int = Field(0, ge=0)
    memory_mib_free: int = Field(0, ge=0)
    cached_models: list[str] = Field(default_factory=list, max_length=4096)
    resident_models: list[str] = Field(default_factory=list, max_length=256,
                                       description="models loaded in the node's warm workers now")
    datasets: list[str] = Field(default_factory=list, max_length=1024,
                                description="s3:// objects on the node: configured datasets and staged inputs")
    accelerator: str = Field("cpu", pattern=r"^(nvml|cpu)$")
    topology: str = Field("", max_length=2016, pattern=r"^[NBSMHUX]*$",
                          description="GPU pairwise links, one letter per pair (gpufleet.topology); empty: unknown")
    draining: bool = False
    running_jobs: int = Field(0, ge=0)
    ttl_s: int = Field(60, ge=0)
    metrics: NodeMetricsReport | None = None


def node_metrics(reg: Registration, report: NodeMetricsReport) -> dict[str, Any]:
    """The report's metrics clamped to the registration: GPUs it has, shares within 0..1."""
    return {"gpu_busy": {i: max(0.0, min(1.0, float(v))) for i, v in sorted(report.gpu_busy.items())
                         if 0 <= i < reg.gpus},
            "cache_hits": report.cache_hits, "cache_misses": report.cache_misses}


def node_item(reg: Registration, report: LivenessReport, *, now: float, max_ttl_s: int) -> dict[str, Any]:
    """The scheduler's node item: the registration, with the report clamped into it (see module)."""
    cpu = report.cpu_milli_free if not reg.cpu_milli else min(report.cpu_milli_free, reg.cpu_milli)
    mem = report.memory_mib_free if not reg.memory_mib else min(report.memory_mib_free, reg.memory_mib)
    gpus = [
        {"index": i, "memory_gb": reg.gpu_memory_gb,
         "milli_free": 0 if report.draining or reg.drained else max(0, min(1000, int(report.free_milli.get(i, 0))))}
        for i in range(reg.gpus)
    ]
    return {
        "node_id": reg.node_id,
        "pool": reg.pool,
        "queue_url": reg.queue_url,
        "gpu_type": reg.gpu_type,
        "gpus": gpus,
        "accelerator": report.accelerator,
        "gpu_topology": report.topology if Topology.parse(range(reg.gpus), report.topology) is not None else "",
        "cpu_milli_free": int(cpu),
        "memory_mib_free": int(mem),
        "labels": reg.bound_labels(),
        "cached_models": sorted(bounded(report.cached_models, MODELS_MAX_CHARS, NAME_MAX_CHARS)),
        "resident_models": sorted(bounded(report.resident_models, RESIDENT_MAX_CHARS, NAME_MAX_CHARS)),
        "datasets": sorted(bounded(report.datasets, DATASETS_MAX_CHARS, URI_MAX_CHARS)),
        "heartbeat_at": iso(now),
        "expires_at": int(now) + max(0, min(int(report.ttl_s), int(max_ttl_s))),
        "draining": bool(report.draining or reg.drained),
        "running_jobs": int(report.running_jobs),
    }


def became_usable(previous: dict[str, Any] | None, current: dict[str, Any], now: float) -> bool:
    """Whether the heartbeat that wrote ``current`` over ``previous`` made the node usable (see module)."""
    if current.get("draining"):
        return False
    return (previous is None or bool(previous.get("draining"))
            or float(previous.get("expires_at", float("inf"))) <= now)


#: a node's freed-capacity wake-ups come at most one heartbeat per this many seconds: a node flipping its report
#: cannot make the scheduler run a pass per request (the release at CompleteRun wakes it too: docs/security.md)
FREED_WAKE_MIN_INTERVAL_S = 1.0


def freed_capacity(previous: dict[str, Any] | None, current: dict[str, Any], now: float) -> bool:
    """Whether the heartbeat that wrote ``current`` over ``previous`` at ``now`` reports some GPU freer than before,
    at least :data:`FREED_WAKE_MIN_INTERVAL_S` after the previous heartbeat (see module)."""
    if previous is None or current.get("draining"):
        return False
    before_at = epoch_seconds(previous.get("heartbeat_at"))
    if before_at is not None and now - before_at < FREED_WAKE_MIN_INTERVAL_S:
        return False
    before = {int(g.get("index", -1)): int(g.get("milli_free", 0)) for g in previous.get("gpus") or []}
    return any(int(g.get("milli_free", 0)) > before.get(int(g.get("index", -1)), 0) for g in current.get("gpus") or [])
