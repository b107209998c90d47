"""A gang job's program: every member adds its contribution with a gloo all-reduce on CPU and records the result.

Run by each member of a ``resources.nodes: N`` job (docs/agent.md, "Writing a gang job"); gpufleet sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Each member writes ``rank<r>.json`` to its output directory:
its rank, what it contributed, the all-reduced sum and every rank's contribution (all-gathered), so the
job's collected output records the results of all ranks. ``HOLD_S`` keeps the members meeting at a barrier
every half second for that many seconds after the all-reduce (a test stops an agent meanwhile).
"""

import json
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env:// — reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
mine = torch.tensor([float(rank + 1)])
total = mine.clone()
dist.all_reduce(total)  # sum over every member: N(N+1)/2
gathered = [torch.zeros(1) for _ in range(world)]
dist.all_gather(gathered, mine)
print(f"rank {rank}/{world}: all_reduce sum {total.item()}", flush=True)
for _ in range(int(float(os.environ.get("HOLD_S", "0")) * 2)):  # the same count on every rank
    dist.barrier()  # the members keep talking (a test stops an agent meanwhile)
    time.sleep(0.5)
dist.barrier()
result = {
    "rank": rank,
    "world_size": world,
    "contributed": mine.item(),
    "all_reduce_sum": total.item(),
    "gathered": [t.item() for t in gathered],
    "epoch": os.environ.get("GPUFLEET_EPOCH"),
}
with open(os.path.join(os.environ.get("GPUFLEET_OUTPUT_DIR", "."), f"rank{rank}.json"), "w") as fh:
    json.dump(result, fh)
dist.destroy_process_group()
