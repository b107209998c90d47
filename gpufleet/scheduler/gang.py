"""Step 4 (reserve): take capacity for every member of a job, all or nothing.

On-prem: each member goes to a distinct node chosen by the configured packing
policy (locality-policy jobs prefer nodes that already hold their inputs or
model); if any member does not fit, every member reserved so far is released
and the job is UNSCHEDULABLE. Nodes the job failed on (``job.avoid_nodes``) are
excluded with ``strict_avoid``; without it a member goes to one of them only when no
other node fits it (avoidance ranks above the locality preference). Cloud: the
pool's GPU count is the capacity; a fractional request takes a whole cloud GPU.
"""

from __future__ import annotations

import numpy as np

from gpufleet.pools import Pool
from gpufleet.scheduler.context import PassContext, Placement
from gpufleet.scheduler.model import Member, PendingJob
from gpufleet.scheduler.results import Outcome, Status
from gpufleet.topology import link_of


def block_tiers(avoid: np.ndarray | None, prefer: np.ndarray | None, strict_avoid: bool) -> list[np.ndarray | bool]:
    """Extra ``blocked`` masks to try in order for one member, most restrictive first.

    ``avoid``: nodes the job failed on; ``prefer``: nodes holding its data (locality).
    With ``strict_avoid`` every tier blocks ``avoid``; otherwise the last tiers allow it.
    ``False`` is the no-extra-block tier (``blocked | False`` is ``blocked``).
    """
    nonpref = None if prefer is None else ~prefer
    avoids = [avoid] if strict_avoid or avoid is None else [avoid, None]
    tiers: list[np.ndarray | bool] = []
    for a in avoids:
        for p in ([nonpref, None] if nonpref is not None else [None]):
            if a is None and p is None:
                tiers.append(False)
            elif a is None or p is None:
                tiers.append(a if p is None else p)
            else:
                tiers.append(a | p)
    return tiers


class GangReserve:
    def reserve(self, job: PendingJob, pool: Pool, ctx: PassContext, *, strict_avoid: bool = False) -> Placement | Status:
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
            tiers = block_tiers(ctx.avoid_mask(pool.name, job), ctx.preferred_nodes(pool.name, job), strict_avoid)
            try:
                for _ in range(job.nodes):
                    choice = None
                    for extra in tiers:
                        if extra is False:
                            choice = ctx.packer.choose(table, req, ctx.rng, ctx.mix)
                        else:
                            saved = table.blocked.copy()
                            table.blocked |= extra
                            choice = ctx.packer.choose(table, req, ctx.rng, ctx.mix)
                            table.blocked = saved
                        if choice is not None:
                            break
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
                Member(table.node_ids[n], gpus, ctx.queue_url(table.node_ids[n]), link_of(gpus, table.topology[n]))
                for n, gpus in chosen
            )
            placement = Placement(job, pool, pool.gpu_type, members, charge)
        ctx.ledger.charge(job.owner_path, pool.gpu_type, charge)
        ctx.placed_to[pool.name] += 1
        return placement

    def unreserve(self, placement: Placement, ctx: PassContext) -> None:
        job, pool = placement.job, placement.pool
        if pool.kind.is_cloud:
            ctx.pool_used[pool.name] -= placement.charge_milli
        else:
            table = ctx.tables[pool.name]
            for m in placement.members:
                table.release(ctx.node_index[pool.name][m.node], m.gpu_indices, job.request)
        ctx.ledger.refund(job.owner_path, pool.gpu_type, placement.charge_milli)
        ctx.placed_to[pool.name] -= 1
