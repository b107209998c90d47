"""The lifecycle steps over the in-memory stores (:mod:`gpufleet.store.fakes`, whose contracts run on moto too)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from release_log import ReleaseLog

from gpufleet.clock import FakeClock
from gpufleet.lifecycle.settings import Deps, LifecycleSettings
from gpufleet.status import JobStatus as S
from gpufleet.store.fakes.jobs import MemoryJobStore
from gpufleet.store.fakes.ledger import MemoryLedgerStore
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.objects import MemoryBucket, MemoryCheckpoints, MemoryJobOutputs
from gpufleet.store.fakes.provenance import MemoryProvenanceIndex
from gpufleet.store.fakes.safety_profiles import MemorySafetyProfiles
from gpufleet.tables import attempt_sk, job_pk


@dataclass
class World:
    """One test's stores, the lifecycle's :class:`Deps` over them, and what ``deps.release`` was asked to free."""

    db: MemoryDatabase
    deps: Deps
    checkpoints: MemoryBucket
    outputs: MemoryBucket
    released: list[tuple[str, int]] = field(default_factory=list)

    def new_job(
        self,
        prompt: str = "a cat",
        *,
        resources: dict | None = None,
        max_run_seconds: int | None = None,
        spec: dict | None = None,
    ) -> dict:
        """A video job (or ``spec``) as the API creates it (QUEUED)."""
        if spec is None:
            spec = {"workload": {"kind": "video.generate", "prompt": prompt}}
            if resources:
                spec["resources"] = resources
            if max_run_seconds:
                spec["max_run_seconds"] = max_run_seconds
        return self.deps.jobs.create(tenant="acme", team="t", user="u", spec=spec)

    def place(self, job_id: str, target: str = "onprem", *, node: str | None = None, attempt: bool = False) -> dict:
        """What the scheduler's commit does to the job: a new epoch with its placement, SCHEDULED (and, with
        ``attempt``, the attempt item)."""
        job = self.deps.jobs.get(job_id)
        epoch = int(job["current_epoch"]) + 1
        p = {
            "epoch": epoch,
            "attempt": epoch,
            "target": target,
            "pool": "onprem-a",
            "node": node or f"n{epoch}",
            "queue_url": "https://q",
            "gpu_milli": 1000,
            "price_per_gpu_hour": 3.6,
            "job_queue": "gpufleet-gpu-spot",
            "job_definition": "gpufleet-gpu",
        }
        self.deps.jobs.issue_epoch(job_id, epoch - 1, {"placement": p})
        self.deps.jobs.transition(job_id, [S(job["status"])], S.SCHEDULED, remove=("placement_token",))
        if attempt:
            self.db.put(
                "jobs",
                {"pk": job_pk(job_id), "sk": attempt_sk(epoch), "type": "attempt", "epoch": epoch, "placement": p},
            )
        return p


@pytest.fixture
def world() -> World:
    db, clock, checkpoints, outputs, released = MemoryDatabase(), FakeClock(), MemoryBucket(), MemoryBucket(), ReleaseLog()
    deps = Deps(
        jobs=MemoryJobStore(db, clock),
        ledger=MemoryLedgerStore(db),
        safety=MemorySafetyProfiles(db, clock),
        settings=LifecycleSettings(heartbeat_seconds=5),
        clock=clock,
        checkpoints=MemoryCheckpoints(checkpoints),
        outputs=MemoryJobOutputs(outputs),
        provenance=MemoryProvenanceIndex(db),
        rand=lambda: 0.5,
        prompt_check=lambda text: {"allowed": "forbidden" not in text, "reason": "rule"},
        release=released,
    )
    return World(db, deps, checkpoints, outputs, released)
