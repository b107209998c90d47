"""Step 5 (preempt): pick running jobs to stop so that a pending job can fit.

``reclaim`` (default) rules, for a pending job J and a running allocation V:
- V is never of higher priority than J;
- V may be taken when J's owner stays within its guarantee and V's owner is
  borrowing (using more than its guarantee) — reclaiming lent capacity — or when
  V is of strictly lower priority and in J's own team;
- V is not taken if it was preempted less than ``preemption_window_s`` ago;
- gangs are taken whole (an allocation is a whole job).
Among eligible victims, those that lose the least work (time since their last
checkpoint) go first; the set is then minimised (a victim whose capacity turns
out unnecessary is kept). Capacity already being freed by earlier preemptions is
counted first, so a job does not trigger a second round while it waits.
J is not placed in this pass; it takes the freed capacity once the victims'
attempts are released.
"""

from __future__ import annotations

from gpufleet.pools import Pool
from gpufleet.scheduler.context import PassContext
from gpufleet.scheduler.model import Allocation, PendingJob
from gpufleet.scheduler.nodetable import NodeTable
from gpufleet.scheduler.quota import QuotaLedger
from gpufleet.scheduler.results import Outcome, Status


def _team(path: str) -> str:
    return "/".join(path.split("/")[:2])


class ReclaimPreempt:
    def eligible(
        self, job: PendingJob, victim: Allocation, reclaim: bool, borrowing: dict[str, bool], gpu_type: str, ledger: QuotaLedger, ctx: PassContext
    ) -> bool:
        """May ``victim`` make room for ``job``? ``reclaim``: the job stays within its guarantee."""
        if victim.priority > job.priority:
            return False
        if victim.last_preempted_at is not None and ctx.now - victim.last_preempted_at < ctx.settings.preemption_window_s:
            return False
        if reclaim:
            if victim.owner_path not in borrowing:
                borrowing[victim.owner_path] = ledger.borrowed_at(victim.owner_path, gpu_type)
            if borrowing[victim.owner_path]:
                return True
        return victim.priority < job.priority and _team(victim.owner_path) == _team(job.owner_path)

    def _free(self, a: Allocation, table: NodeTable, ledger: QuotaLedger, index: dict[str, int]) -> None:
        for m in a.members:
            table.release(index[m.node], m.gpu_indices, a.request)
        ledger.refund(a.owner_path, a.gpu_type, a.total_gpu_milli)

    def _take(self, a: Allocation, table: NodeTable, ledger: QuotaLedger, index: dict[str, int]) -> None:
        for m in a.members:
            table.allocate(index[m.node], m.gpu_indices, a.request)
        ledger.charge(a.owner_path, a.gpu_type, a.total_gpu_milli)

    def _fits(self, job: PendingJob, pool: Pool, table: NodeTable, ledger: QuotaLedger, ctx: PassContext) -> bool:
        if ledger.violation(job.owner_path, pool.gpu_type, ctx.charge_milli(job, pool)) is not None:
            return False
        trial = table.copy()
        req = job.request
        for _ in range(job.nodes):
            c = ctx.packer.choose(trial, req, ctx.rng, ctx.mix)
            if c is None:
                return False
            trial.allocate(c.node, c.gpus, req)
            trial.blocked[c.node] = True
        return True

    def victims(self, job: PendingJob, pools: list[Pool], ctx: PassContext) -> tuple[list[Allocation], Status | None]:
        for pool in pools:
            if pool.kind.is_cloud or pool.name not in ctx.tables:
                continue
            index = ctx.node_index[pool.name]
            need = ctx.charge_milli(job, pool)
            table = ctx.tables[pool.name].copy()
            ledger = ctx.ledger.copy()
            here = [a for a in ctx.running if a.pool == pool.name and all(m.node in index for m in a.members)]
            freed = 0
            for a in here:
                if a.job_id in ctx.preempting:
                    self._free(a, table, ledger, index)
                    freed += 1
            if self._fits(job, pool, table, ledger, ctx):
                if freed:
                    return [], Status(Outcome.UNSCHEDULABLE, "waiting for capacity being preempted")
                return [], None  # it fits as is (the pass held it back): nothing to preempt
            reclaim = ledger.within_guarantee(job.owner_path, pool.gpu_type, need)
            borrowing: dict[str, bool] = {}
            cands = [
                a
                for a in here
                if a.job_id not in ctx.preempting and self.eligible(job, a, reclaim, borrowing, pool.gpu_type, ledger, ctx)
            ]
            cands.sort(key=lambda a: (a.lost_work_s(ctx.now), a.priority, -a.started_at, a.job_id))
            chosen: list[Allocation] = []
            for a in cands:
                self._free(a, table, ledger, index)
                chosen.append(a)
                if self._fits(job, pool, table, ledger, ctx):
                    break
            else:
                continue
            for a in sorted(chosen, key=lambda a: -a.lost_work_s(ctx.now)):
                self._take(a, table, ledger, index)
                if self._fits(job, pool, table, ledger, ctx):
                    chosen.remove(a)
                else:
                    self._free(a, table, ledger, index)
            return chosen, Status(Outcome.UNSCHEDULABLE, f"preempting {len(chosen)} job(s) in {pool.name}")
        return [], Status(Outcome.UNSCHEDULABLE, "no capacity and no eligible victims")
