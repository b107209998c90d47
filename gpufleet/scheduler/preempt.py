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

Cost: candidates come from the pass's :class:`~gpufleet.scheduler.candidates.CandidateIndex`
(by pool, team, owner path and priority; only quota paths that are borrowing are
looked up), and the what-ifs run in a :meth:`~gpufleet.scheduler.nodetable.NodeTable.trial`
of the pool's table and a :meth:`~gpufleet.scheduler.quota.QuotaLedger.overlay` of the
ledger, both undone afterwards. A job that cannot fit costs O(nodes + candidates +
allocations already being freed in the pool), not O(running allocations), and copies
neither the table nor the ledger; while victims are tried one by one, a single-member
job's feasible nodes are kept current node by node, so the packer is asked only once
some node fits (it would answer None otherwise, without drawing from the rng) — and not
at all when it declares ``draws_rng = False`` (``frag-aware``): a packer answers None exactly
when no node is feasible, so for a single member feasibility is the answer. The decisions are those of the plain scan
(``tests/unit/scheduler/test_sched_preempt_index.py`` keeps it as a reference).
"""

from __future__ import annotations

from gpufleet.pools import Pool
from gpufleet.scheduler.context import PassContext
from gpufleet.scheduler.model import Allocation, PendingJob
from gpufleet.scheduler.nodetable import NodeTable, Request
from gpufleet.scheduler.quota import QuotaLedger
from gpufleet.scheduler.results import NO_VICTIMS, Outcome, Status


class _Feasible:
    """The nodes of a table where a request fits, kept current one node at a time (O(GPUs) per change)."""

    def __init__(self, table: NodeTable, req: Request) -> None:
        self.table, self.req = table, req
        self.mask = table.feasible(req)
        self.count = int(self.mask.sum())

    def update(self, n: int) -> None:
        now = self.table.feasible_at(n, self.req)
        if now != self.mask[n]:
            self.mask[n] = now
            self.count += 1 if now else -1


class ReclaimPreempt:
    def _free(self, a: Allocation, table: NodeTable, ledger: QuotaLedger, index: dict[str, int], feas: _Feasible | None = None) -> None:
        for m in a.members:
            table.release(index[m.node], m.gpu_indices, a.request)
            if feas is not None:
                feas.update(index[m.node])
        ledger.refund(a.owner_path, a.gpu_type, a.total_gpu_milli)

    def _take(self, a: Allocation, table: NodeTable, ledger: QuotaLedger, index: dict[str, int], feas: _Feasible | None = None) -> None:
        for m in a.members:
            table.allocate(index[m.node], m.gpu_indices, a.request)
            if feas is not None:
                feas.update(index[m.node])
        ledger.charge(a.owner_path, a.gpu_type, a.total_gpu_milli)

    def _fits(
        self, job: PendingJob, pool: Pool, table: NodeTable, ledger: QuotaLedger, ctx: PassContext, feasible: _Feasible | None = None
    ) -> bool:
        """Would ``job`` fit in ``table`` under ``ledger``? (``table`` is left as it was.)

        ``feasible`` (single-member jobs): the table's feasible nodes kept current by the caller;
        with none, the packer is not asked (it would answer None without drawing from the rng)."""
        if ledger.violation(job.owner_path, pool.gpu_type, ctx.charge_milli(job, pool)) is not None:
            return False
        req = job.request
        if job.nodes == 1:
            if feasible is not None and feasible.count == 0:
                return False
            if not getattr(ctx.packer, "draws_rng", True):  # its answer is "some node fits": no need to ask it
                return feasible.count > 0 if feasible is not None else bool(table.feasible(req).any())
            return ctx.packer.choose(table, req, ctx.rng, ctx.mix) is not None
        held: list[int] = []
        with table.trial():
            try:
                for _ in range(job.nodes):
                    c = ctx.packer.choose(table, req, ctx.rng, ctx.mix)
                    if c is None:
                        return False
                    table.allocate(c.node, c.gpus, req)
                    table.blocked[c.node] = True
                    held.append(c.node)
                return True
            finally:
                table.blocked[held] = False

    def victims(self, job: PendingJob, pools: list[Pool], ctx: PassContext) -> tuple[list[Allocation], Status | None]:
        candidates = ctx.candidates()
        for pool in pools:
            if pool.kind.is_cloud or pool.name not in ctx.tables:
                continue
            index = ctx.node_index[pool.name]
            need = ctx.charge_milli(job, pool)
            table = ctx.tables[pool.name]
            with table.trial():  # every what-if below is undone when the block exits
                ledger = ctx.ledger.overlay()
                freeing = candidates.freeing(pool.name)
                for a in freeing:
                    self._free(a, table, ledger, index)
                if self._fits(job, pool, table, ledger, ctx):
                    if freeing:
                        return [], Status(Outcome.UNSCHEDULABLE, "waiting for capacity being preempted")
                    return [], None  # it fits as is (the pass held it back): nothing to preempt
                reclaim = ledger.within_guarantee(job.owner_path, pool.gpu_type, need)
                cands = candidates.eligible(
                    pool.name, job.owner_path, job.priority, reclaim, lambda q, t=pool.gpu_type, led=ledger: led.borrowing(q, t) > 0
                )
                feas = _Feasible(table, job.request) if cands and job.nodes == 1 else None
                chosen: list[Allocation] = []
                for a in cands:
                    self._free(a, table, ledger, index, feas)
                    chosen.append(a)
                    if self._fits(job, pool, table, ledger, ctx, feas):
                        break
                else:
                    continue
                for a in sorted(chosen, key=lambda a: -a.lost_work_s(ctx.now)):
                    self._take(a, table, ledger, index, feas)
                    if self._fits(job, pool, table, ledger, ctx, feas):
                        chosen.remove(a)
                    else:
                        self._free(a, table, ledger, index, feas)
                return chosen, Status(Outcome.UNSCHEDULABLE, f"preempting {len(chosen)} job(s) in {pool.name}")
        return [], Status(Outcome.UNSCHEDULABLE, NO_VICTIMS)
