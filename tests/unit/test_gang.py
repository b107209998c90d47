"""The gang contract (:mod:`gpufleet.gang`, :func:`gpufleet.envelope.member_envelopes`): one envelope per member, ranks 0..N-1 unique, every member on
the attempt's epoch, the member's own GPUs, and the torchrun variables a member's job sees."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet import gang
from gpufleet.envelope import Envelope, member_envelopes
from gpufleet.errors import NotAllowed
from gpufleet.runtime import oci
from onprem_agent.child import child_environment


def _env(job_id: str = "job_g1", epoch: int = 4, members: list[dict] | None = None) -> Envelope:
    first = (members or [{"node": "n0", "queue_url": "q/n0", "gpu_indices": [0]}])[0]
    placement = {"epoch": epoch, "attempt": epoch, "node": first["node"], "queue_url": first["queue_url"],
                 "gpu_indices": first.get("gpu_indices", []), "gpu_milli": 1000}
    if members is not None:
        placement["members"] = members
    return Envelope.model_validate({
        "job_id": job_id, "attempt": epoch, "epoch": epoch, "stage": "container",
        "spec": {"workload": {"kind": "container", "image": "busybox", "command": ["true"]},
                 "resources": {"gpus": 2, "nodes": max(1, len(members or []))}},
        "s3": {"bucket_outputs": "b", "bucket_checkpoints": "b", "bucket_logs": "b", "output_prefix": "jobs/j/",
               "checkpoint_prefix": "jobs/j/", "log_prefix": "jobs/j/attempt-0004/"},
        "placement": placement,
    })


def _members(n: int) -> list[dict]:
    return [{"node": f"n{i}", "queue_url": f"q/n{i}", "gpu_indices": [2 * (i % 2), 2 * (i % 2) + 1]} for i in range(n)]


@settings(deadline=None, max_examples=60)
@given(n=st.integers(2, 16), epoch=st.integers(1, 10_000), job=st.from_regex(r"job_[a-z0-9]{1,12}", fullmatch=True))
def test_members_of_one_attempt_share_its_epoch_and_have_unique_ranks(n, epoch, job):
    env = _env(job, epoch, _members(n))
    out = member_envelopes(env)
    assert [q for q, _ in out] == [f"q/n{i}" for i in range(n)]
    envs = [e for _, e in out]
    assert {(e.job_id, e.epoch, e.attempt, e.placement.epoch) for e in envs} == {(job, epoch, epoch, epoch)}
    assert sorted(e.gang.rank for e in envs) == list(range(n))
    assert {e.gang.world_size for e in envs} == {n}
    assert len({(e.gang.master_addr, e.gang.master_port) for e in envs}) == 1  # one rendezvous
    for i, e in enumerate(envs):  # each member runs on its own node's GPUs
        assert (e.placement.node, e.placement.queue_url, e.placement.gpu_indices) == (
            f"n{i}", f"q/n{i}", _members(n)[i]["gpu_indices"])
        assert Envelope.model_validate_json(e.model_dump_json()) == e  # what the node parses


def test_rendezvous_is_rank_zero_address_and_the_port_moves_with_the_epoch():
    out = member_envelopes(_env(members=_members(2)), addresses={"n0": "10.0.0.5", "n1": "10.0.0.6"})
    assert {e.gang.master_addr for _, e in out} == {"10.0.0.5"}
    assert member_envelopes(_env(members=_members(2)))[0][1].gang.master_addr == "n0"  # no address: the id
    ports = {gang.master_port("job_g1", e) for e in range(1, 50)}
    assert len(ports) > 1 and all(gang.PORT_BASE <= p < gang.PORT_BASE + gang.PORT_SPAN for p in ports)


def test_a_single_node_attempt_is_unchanged():
    env = _env()
    assert member_envelopes(env) == [("q/n0", env)]
    assert env.gang is None and gang.dist_env(None) == {}


def test_a_malformed_gang_is_refused():
    with pytest.raises(NotAllowed):
        member_envelopes(_env(members=[{"node": "n0", "queue_url": "q/n0"}, {"node": "n1"}]))
    with pytest.raises(NotAllowed):
        member_envelopes(_env(members=[{"node": "n0", "queue_url": "q/n0"}, {"node": "n0", "queue_url": "q"}]))
    with pytest.raises(ValueError):
        gang.GangRole(rank=2, world_size=2, nodes=["a", "b"], master_addr="a", master_port=1)


def test_a_member_process_and_its_container_get_the_torchrun_variables(tmp_path):
    _q, e = member_envelopes(_env(members=_members(3)), addresses={"n0": "10.1.1.1"})[1]
    want = {"RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "3", "NNODES": "3", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": str(gang.master_port("job_g1", 4))}
    child = child_environment({"RANK": "7"}, {}, [2, 3], True, tmp_path, e.job_id, e.epoch, gang.dist_env(e.gang))
    assert {k: child[k] for k in want} == want and child["CUDA_VISIBLE_DEVICES"] == "2,3"
    spec = oci.ContainerSpec(name="c", image="i", command=["x"], env=gang.dist_env(e.gang), uid=1, mounts=[])
    argv = oci.run_argv(spec)
    envs = [argv[i + 1] for i, a in enumerate(argv[: argv.index("--")]) if a == "--env"]
    assert {f"{k}={v}" for k, v in want.items()} <= set(envs)


def _batch_node(index: int, num: int = 3, main: int = 0) -> dict[str, str]:
    env = {"AWS_BATCH_JOB_ID": f"abc-123#{index}", "AWS_BATCH_JOB_NUM_NODES": str(num),
           "AWS_BATCH_JOB_NODE_INDEX": str(index), "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main)}
    if index != main:  # Batch sets the main node's address on child nodes only
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "10.0.1.7"
    return env


def test_a_batch_multi_node_job_node_gets_the_torchrun_contract():
    """Cloud gangs: every node of the Batch multi-node parallel job maps Batch's variables to the same contract
    as on-prem members (rank 0 = the main node, MASTER_ADDR its private address, the attempt's port)."""
    from gpufleet.runtime.main import with_batch_role

    roles = [gang.batch_role(_batch_node(i), "job_g1", 4, lambda: "10.0.1.7") for i in range(3)]
    assert [r.rank for r in roles] == [0, 1, 2] and {r.world_size for r in roles} == {3}
    assert {r.master_addr for r in roles} == {"10.0.1.7"} and {r.master_port for r in roles} == {gang.master_port("job_g1", 4)}
    assert roles[1].nodes == ["abc-123#0", "abc-123#1", "abc-123#2"]
    env = gang.dist_env(roles[2])
    assert (env["RANK"], env["NODE_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("2", "2", "3", "10.0.1.7")
    # a main node other than 0 is still rank 0, and the ranks follow the node indices from it
    moved = [gang.batch_role(_batch_node(i, 3, main=1), "job_g1", 4, lambda: "10.0.1.7").rank for i in range(3)]
    assert moved == [2, 0, 1]
    asked = []
    gang.batch_role(_batch_node(1), "job_g1", 4, lambda: asked.append(1) or "x")
    assert not asked  # a child node never uses its own address
    # not a multi-node job, or malformed variables: no role (a single-node Batch job is unchanged)
    for env in ({}, {"AWS_BATCH_JOB_NUM_NODES": "1", "AWS_BATCH_JOB_NODE_INDEX": "0"},
                {**_batch_node(1), "AWS_BATCH_JOB_NODE_INDEX": "x"}, {**_batch_node(1), "AWS_BATCH_JOB_NODE_INDEX": "3"}):
        assert gang.batch_role(env, "job_g1", 4, lambda: "h") is None
    assert with_batch_role(_env(), _batch_node(1)).gang.rank == 1
    assert with_batch_role(_env(), {}).gang is None
    _, on_prem = member_envelopes(_env(members=_members(2)))[1]
    assert with_batch_role(on_prem, _batch_node(2)).gang == on_prem.gang  # a role the envelope has is kept
