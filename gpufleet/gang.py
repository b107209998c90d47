"""The gang contract (pure): what each member of a multi-node attempt is told, and the torchrun variables.

Contract:
- A job with ``resources.nodes > 1`` is placed as a gang: :class:`gpufleet.placement.Placement` lists
  its ``members`` (node, queue, GPU indices), first member first. Member *k* of the list is **rank k**;
  the world size is the number of members.
- :func:`gpufleet.envelope.member_envelopes` turns the attempt's one envelope into one envelope per member, in rank order:
  each is the same attempt (same ``job_id``, ``attempt`` and ``epoch`` — members of one attempt never
  straddle epochs) with the placement narrowed to that member (``node``, ``queue_url``, ``gpu_indices``
  are the member's, ``members`` kept) and a :class:`GangRole` naming its rank. A single-node placement
  gives one envelope with no role (``gang`` stays ``None``), so single-node jobs are unchanged.
- The rendezvous: ``master_addr`` is rank 0's address — from the ``addresses`` map the caller passes,
  else rank 0's node id (RunOnPrem's dispatch passes none today, so node ids must be host names that
  resolve on the cluster network); ``master_port`` is :func:`master_port` (a function of job and epoch, so a retried gang
  never meets a socket of the previous attempt still in TIME_WAIT).
- :func:`dist_env` is the environment the runtime gives the job (the process, and a container through
  ``podman --env``): ``RANK``/``NODE_RANK`` = the member's rank, ``WORLD_SIZE``/``NNODES`` = the number
  of members, ``LOCAL_RANK`` 0 and ``LOCAL_WORLD_SIZE`` 1 (one process per node; a job that wants one
  process per GPU runs ``torchrun --nnodes $NNODES --node_rank $NODE_RANK --nproc_per_node <gpus>
  --master_addr $MASTER_ADDR --master_port $MASTER_PORT``, which sets the per-process values itself),
  ``MASTER_ADDR``, ``MASTER_PORT``, and ``GPUFLEET_GANG_*`` copies. No role → ``{}``.
- A cloud gang is one AWS Batch multi-node parallel job whose every node runs the runtime with the same pointer
  envelope; :func:`batch_role` is a node's role from Batch's variables (``AWS_BATCH_JOB_NUM_NODES``,
  ``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX``,
  ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS``): the main node is rank 0 (ranks follow the node indices
  from it), ``MASTER_ADDR`` the main node's private address (Batch sets it on child nodes only: the main node
  gives its own), ``MASTER_PORT`` :func:`master_port`, and the members are named by their node jobs
  (``<job id>#<index>``, what ``DescribeJobs`` answers for one node). Not a multi-node job (no variables, or
  one node) → ``None``.
- A cloud gang's member states: each node's runtime records its own on the attempt item (fenced on the epoch),
  :func:`batch_member_record` ``{"batch_node_<rank>": {"job": "<job id>#<index>", "state"}}`` (``running`` when
  its stage starts, then ``succeeded`` or the exit code's name in lower case); :func:`batch_members_view` is the
  members as ``GET /v1/jobs/{id}`` shows a gang's (``{"node", "rank", "gpus", "state"}``, rank order): the node
  job, ``gpus`` empty (Batch gives each node its GPUs), ``dispatched`` until the node has recorded a state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: MASTER_PORT range: [PORT_BASE, PORT_BASE + PORT_SPAN) (torch's default 29500 is inside it)
PORT_BASE, PORT_SPAN = 29400, 600
#: how long a member waits at the start barrier for the others before the gang is released (failed)
BARRIER_TIMEOUT_S = 300


class GangRole(BaseModel):
    """One member's part in a gang attempt (``Envelope.gang``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(ge=0)
    world_size: int = Field(ge=2)
    nodes: list[str] = Field(description="member node ids in rank order")
    master_addr: str = Field(min_length=1)
    master_port: int = Field(ge=1, le=65535)
    barrier_timeout_s: int = Field(BARRIER_TIMEOUT_S, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> GangRole:
        if self.rank >= self.world_size or len(self.nodes) != self.world_size:
            raise ValueError("rank must be below world_size, and nodes must list world_size members")
        return self

    @property
    def node(self) -> str:
        return self.nodes[self.rank]


def master_port(job_id: str, epoch: int) -> int:
    """The rendezvous port of one attempt of a gang (deterministic; differs between epochs of a job)."""
    digest = int(hashlib.sha256(f"{job_id}:{epoch}".encode()).hexdigest()[:8], 16)
    return PORT_BASE + digest % PORT_SPAN


def batch_role(environ: Mapping[str, str], job_id: str, epoch: int, own_address: Callable[[], str]) -> GangRole | None:
    """This node's role in a Batch multi-node parallel job (module contract); ``own_address`` is asked only on
    the main node, for its private address."""
    try:
        num = int(environ.get("AWS_BATCH_JOB_NUM_NODES", "0"))
        index = int(environ["AWS_BATCH_JOB_NODE_INDEX"]) if num > 1 else 0
        main = int(environ.get("AWS_BATCH_JOB_MAIN_NODE_INDEX", "0"))
    except (KeyError, ValueError):
        return None
    if num < 2 or not 0 <= index < num or not 0 <= main < num:
        return None
    parent = environ.get("AWS_BATCH_JOB_ID", "").split("#", 1)[0]
    addr = environ.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS") or (own_address() if index == main else "")
    if not addr:
        return None
    return GangRole(rank=(index - main) % num, world_size=num, master_addr=addr,
                    master_port=master_port(job_id, epoch),
                    nodes=[f"{parent}#{(main + r) % num}" for r in range(num)])


BATCH_NODE_PREFIX = "batch_node_"


def batch_member_record(role: GangRole, state: str) -> dict[str, dict[str, str]]:
    """The attempt attribute by which a Batch node records its member state (module contract)."""
    return {f"{BATCH_NODE_PREFIX}{role.rank}": {"job": role.nodes[role.rank], "state": state}}


def batch_members_view(attempt: Mapping[str, object], world_size: int) -> list[dict[str, object]]:
    """A cloud gang's members from its attempt item (module contract)."""
    out: list[dict[str, object]] = []
    for rank in range(world_size):
        rec = attempt.get(f"{BATCH_NODE_PREFIX}{rank}")
        rec = rec if isinstance(rec, Mapping) else {}
        out.append({"node": str(rec.get("job") or "-"), "rank": rank, "gpus": [],
                    "state": str(rec.get("state") or "dispatched")})
    return out


#: member states that are not a failure (``dispatched``: nothing recorded yet)
_NOT_FAILED = frozenset({"running", "succeeded", "dispatched"})


def failed_member(attempt: Mapping[str, object], world_size: int, own_rank: int) -> tuple[int, str] | None:
    """The first other member of a cloud gang whose recorded state is a failure: ``(rank, state)``, else None."""
    for member in batch_members_view(attempt, world_size):
        rank, state = int(str(member["rank"])), str(member["state"])
        if rank != own_rank and state not in _NOT_FAILED:
            return rank, state
    return None


def dist_env(role: GangRole | None) -> dict[str, str]:
    """The torchrun-style variables of a member (see module); ``{}`` for a single-node attempt."""
    if role is None:
        return {}
    rank, world = str(role.rank), str(role.world_size)
    return {
        "RANK": rank, "NODE_RANK": rank, "WORLD_SIZE": world, "NNODES": world,
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": role.master_addr, "MASTER_PORT": str(role.master_port),
        "GPUFLEET_GANG_RANK": rank, "GPUFLEET_GANG_SIZE": world, "GPUFLEET_GANG_NODES": ",".join(role.nodes),
    }
