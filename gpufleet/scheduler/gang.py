"""Step 4 (reserve): take capacity for every member of a job, all or nothing.

On-prem: each member goes to a distinct node chosen by the configured packing
policy (locality-policy jobs prefer nodes that already hold their inputs or
model); if any member does not fit, every member reserved so far is released
and the job is UNSCHEDULABLE. Cloud: the pool's GPU count is the capacity; a
fractional request takes a whole cloud GPU.
"""

from __future__ import annotations

from gpufleet.scheduler.framework import register
from gpufleet.scheduler.model import Member
from gpufleet.scheduler.results import Outcome, Status


@register("reserve", "gang")
class GangReserve:
    def reserve(self, job, pool, ctx):
        from gpufleet.scheduler.cycle import Placement

        charge = ctx.charge_milli(job, pool)
        if pool.kind.is_cloud:
            if ctx.pool_used[pool.name] + charge > pool.max_gpus * 1000:
                return Status(Outcome.UNSCHEDULABLE, f"pool {pool.name} is full")
            ctx.pool_used[pool.name] += charge
            members = tuple(Member(None) for _ in range(job.nodes))
            placement = Placement(job, pool, pool.gpu_type, members, charge)
        else:
            table = ctx.tables[pool.name]
            req = job.request
            chosen: list[tuple[int, tuple[int, ...]]] = []
            prefer = ctx.preferred_nodes(pool.name, job)
            try:
                for _ in range(job.nodes):
                    choice = None
                    if prefer is not None:
                        saved = table.blocked.copy()
                        table.blocked |= ~prefer
                        choice = ctx.packer.choose(table, req, ctx.rng, ctx.mix)
                        table.blocked = saved
                    if choice is None:
                        choice = ctx.packer.choose(table, req, ctx.rng, ctx.mix)
                    if choice is None:
                        break
                    table.allocate(choice.node, choice.gpus, req)
                    table.blocked[choice.node] = True
                    chosen.append((choice.node, choice.gpus))
            finally:
                for n, _ in chosen:
                    table.blocked[n] = False
            if len(chosen) < job.nodes:
                for n, gpus in chosen:
                    table.release(n, gpus, req)
                return Status(Outcome.UNSCHEDULABLE, f"{len(chosen)}/{job.nodes} member(s) fit in {pool.name}")
            members = tuple(
                Member(table.node_ids[n], gpus, ctx.queue_url(table.node_ids[n])) for n, gpus in chosen
            )
            placement = Placement(job, pool, pool.gpu_type, members, charge)
        ctx.ledger.charge(job.owner_path, pool.gpu_type, charge)
        ctx.placed_to[pool.name] += 1
        return placement

    def unreserve(self, placement, ctx):
        job, pool = placement.job, placement.pool
        if pool.kind.is_cloud:
            ctx.pool_used[pool.name] -= placement.charge_milli
        else:
            table = ctx.tables[pool.name]
            for m in placement.members:
                table.release(ctx.node_index[pool.name][m.node], m.gpu_indices, job.request)
        ctx.ledger.refund(job.owner_path, pool.gpu_type, placement.charge_milli)
        ctx.placed_to[pool.name] -= 1
