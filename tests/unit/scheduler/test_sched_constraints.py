"""Placement constraints of the cycle: the job's pool allowlist and avoiding nodes it failed on.

Examples pin the rules; the properties check them on random snapshots against an oracle
(the same snapshot without the avoided nodes)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_strategies import POOLS, job, jobs, node, nodes, snapshot

from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import SchedulerConfig
from gpufleet.scheduler.gang import block_tiers
from gpufleet.scheduler.model import allowed_pools
from gpufleet.scheduler.results import Outcome

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POOL_NAMES = [p.name for p in POOLS]


def placed_nodes(result, job_id):
    (p,) = [p for p in result.placements if p.job.job_id == job_id]
    return p.pool.name, [m.node for m in p.members]


# ---------------------------------------------------------------- pool allowlist


def test_allowed_pools_is_the_allowlist_or_everything():
    assert allowed_pools(job("j"), POOLS) == list(POOLS)
    assert [p.name for p in allowed_pools(job("j", pools=("cloud-spot", "nope")), POOLS)] == ["cloud-spot"]


def test_allowlist_overrides_the_cheaper_pool():
    r = run_cycle(snapshot((node("n0"),), (job("j", pools=("cloud-spot",)),), {}))
    assert placed_nodes(r, "j") == ("cloud-spot", [None])
    r = run_cycle(snapshot((node("n0"),), (job("k", pools=("onprem-a", "cloud-spot")),), {}))
    assert placed_nodes(r, "k") == ("onprem-a", ["n0"])


def test_allowlist_naming_no_existing_pool_is_unresolvable_with_a_reason():
    r = run_cycle(snapshot((node("n0"),), (job("j", pools=("onprem-zz", "gpu-west")),), {}))
    status = r.status["j"]
    assert status.outcome is Outcome.UNRESOLVABLE and not r.placements
    assert "onprem-zz" in status.reason and "gpu-west" in status.reason and "onprem-a" in status.reason
    assert r.requeue["j"].backoff and r.requeue["j"].delay_s > 0  # recorded as a backoff, not a silent wait


def test_allowlisted_pool_that_cannot_hold_the_job_reports_only_that_pool():
    # onprem-b has L4 only; the job wants A100 and allows only onprem-b
    r = run_cycle(snapshot((node("n0"), node("l0", pool="onprem-b", gpu_type="L4")), (job("j", gpu_type="A100", pools=("onprem-b",)),), {}))
    assert r.status["j"].outcome is Outcome.UNRESOLVABLE
    assert "onprem-b" in r.status["j"].reason and "onprem-a" not in r.status["j"].reason


def test_full_allowlisted_pool_waits_instead_of_bursting_or_preempting_elsewhere():
    from sched_strategies import allocation

    busy = node("n0", free=(0, 0, 0, 0))
    victim = allocation("low", "t/a/v", 0, "n0", [0, 1, 2, 3])
    jobs_ = (job("j", priority=500, pools=("onprem-b",), gpu_type="any"),)
    r = run_cycle(snapshot((busy, node("l0", pool="onprem-b", gpu_type="L4", free=(0,))), jobs_, {}, running=(victim,)))
    assert not r.placements and not r.preemptions
    assert r.status["j"].outcome is Outcome.UNSCHEDULABLE


def test_gang_members_all_stay_in_the_allowlisted_pool():
    ns = (node("a0", free=(1000,) * 8), node("b0", pool="onprem-b", gpu_type="L4"), node("b1", pool="onprem-b", gpu_type="L4"))
    r = run_cycle(snapshot(ns, (job("g", num_gpu=2, nodes=2, pools=("onprem-b",)),), {}))
    assert placed_nodes(r, "g") == ("onprem-b", ["b0", "b1"]) or placed_nodes(r, "g") == ("onprem-b", ["b1", "b0"])


def test_a_gang_is_never_placed_in_a_cloud_pool_without_gangs():
    """A Batch attempt of a pool without ``gangs`` runs one container on one instance: a gang there would be
    booked and billed for every member and run one, so it is placed on-prem, on a gangs pool, or waits."""
    r = run_cycle(snapshot((node("n0"),), (job("g", num_gpu=1, nodes=2, pools=("cloud-spot", "cloud-ondemand")),), {}))
    assert not r.placements and r.status["g"].outcome is Outcome.UNRESOLVABLE
    assert "single-node jobs only" in r.status["g"].reason and "2-node gang" in r.status["g"].reason
    r = run_cycle(snapshot((node("n0"), node("n1")), (job("g", num_gpu=1, nodes=2),), {}))
    assert placed_nodes(r, "g")[0] == "onprem-a"  # any pool allowed: the on-prem one
    r = run_cycle(snapshot((node("n0"),), (job("g", num_gpu=1, nodes=2), job("s", num_gpu=1, pools=("cloud-spot",))), {}))
    assert "g" not in {p.job.job_id for p in r.placements} and placed_nodes(r, "s") == ("cloud-spot", [None])


def test_a_tag_only_container_image_is_never_placed_in_a_cloud_pool():
    """Cloud pools run a container job under a Batch definition of its image's digest (gpufleet.batchdef): an image
    named by tag only runs on-prem; allowed only cloud pools, it is unresolvable (the API refuses it at submission)."""
    r = run_cycle(snapshot((node("n0"),), (job("t", image_pinned=False, pools=("cloud-spot", "cloud-ondemand")),), {}))
    assert not r.placements and r.status["t"].outcome is Outcome.UNRESOLVABLE
    assert "by digest only" in r.status["t"].reason
    busy = node("n0", free=(0, 0, 0, 0))
    r = run_cycle(snapshot((busy,), (job("t", image_pinned=False), job("d", pools=("cloud-spot",))), {}))
    assert "t" not in {p.job.job_id for p in r.placements}  # on-prem full: it waits rather than burst
    assert placed_nodes(r, "d") == ("cloud-spot", [None])  # a pinned image may burst
    r = run_cycle(snapshot((node("n0"),), (job("t", image_pinned=False),), {}))
    assert placed_nodes(r, "t") == ("onprem-a", ["n0"])


def test_a_gang_goes_to_a_cloud_pool_with_gangs_booked_for_every_member():
    import pytest

    from gpufleet.errors import ConfigError
    from gpufleet.pools import parse_pools

    gang_pool = {"name": "cloud-gang", "kind": "ondemand", "region": "eu", "gpu_type": "A10G", "max_gpus": 8,
                 "price_per_gpu_hour": 1.0, "job_queue": "q-gang", "job_definition": "jd-gang", "gangs": True}
    pools = (*POOLS, *parse_pools([gang_pool]))
    snap = dataclasses.replace(snapshot((), (job("g", num_gpu=2, nodes=3),), {}), pools=pools)
    (p,) = run_cycle(snap).placements
    assert p.pool.name == "cloud-gang" and len(p.members) == 3 and p.charge_milli == 6000  # every member booked
    doc = p.to_json(1)
    assert doc["job_queue"] == "q-gang" and len(doc["members"]) == 3
    too_big = dataclasses.replace(snapshot((), (job("g", num_gpu=4, nodes=3),), {}), pools=pools)
    r = run_cycle(too_big)
    assert not r.placements and r.status["g"].outcome is Outcome.UNRESOLVABLE  # 12 GPUs never fit in 8
    for kind in ("spot", "onprem"):  # Batch runs no multi-node parallel job on Spot; on-prem needs no flag
        with pytest.raises(ConfigError, match="on-demand"):
            parse_pools([{**gang_pool, "kind": kind}])


allowlists = st.lists(st.sampled_from(POOL_NAMES + ["onprem-zz"]), max_size=3).map(tuple)


@FAST
@given(nodes(), jobs(), st.lists(allowlists, min_size=12, max_size=12), st.integers(0, 3))
def test_a_placement_is_never_on_a_pool_outside_the_allowlist(ns, js, lists, seed):
    js = tuple(dataclasses.replace(j, pools=lists[i]) for i, j in enumerate(js))
    r = run_cycle(snapshot(ns, js, {}), seed=seed)
    by_id = {j.job_id: j for j in js}
    for p in r.placements:
        allowed = by_id[p.job.job_id].pools
        assert not allowed or p.pool.name in allowed
        for m in p.members:
            assert m.node is None or next(n.pool for n in ns if n.node_id == m.node) == p.pool.name
    for j in js:
        if j.pools and not set(j.pools) & set(POOL_NAMES):
            assert r.status[j.job_id].outcome is Outcome.UNRESOLVABLE
    for victim, by in r.preemptions:
        allowed = by_id[by].pools
        assert not allowed or victim.pool in allowed


# ---------------------------------------------------------------- avoid failed nodes


def test_block_tiers_order():
    avoid = np.array([True, False, False])
    prefer = np.array([True, True, False])
    tiers = block_tiers(avoid, prefer, strict_avoid=False)
    assert [list(t) if t is not False else False for t in tiers] == [
        [True, False, True], [True, False, False], [False, False, True], False,
    ]
    assert all(t is not False and t[0] for t in block_tiers(avoid, prefer, strict_avoid=True))
    assert block_tiers(None, None, strict_avoid=True) == [False]


def test_job_avoids_the_node_it_failed_on_for_every_seed_and_packing():
    ns = (node("n0"), node("n1", free=(1000, 1000, 0, 0)))  # packing policies prefer the fuller n1... or not
    for packing in ("frag-aware", "best-fit", "random", "packing"):
        for seed in range(5):
            for bad, good in (("n0", "n1"), ("n1", "n0")):
                r = run_cycle(snapshot(ns, (job("j", avoid_nodes=frozenset({bad})),), {}), SchedulerConfig(packing=packing), seed=seed)
                assert placed_nodes(r, "j") == ("onprem-a", [good])


def test_failed_node_is_used_when_it_is_the_only_one_that_fits():
    ns = (node("n0"), node("n1", free=(0, 0, 0, 0)))
    r = run_cycle(snapshot(ns, (job("j", num_gpu=2, avoid_nodes=frozenset({"n0"}), pools=("onprem-a",)),), {}))
    assert placed_nodes(r, "j") == ("onprem-a", ["n0"])


def test_another_pool_counts_as_another_node():
    # the only free on-prem node is the failed one; the spot pool has room
    r = run_cycle(snapshot((node("n0"),), (job("j", avoid_nodes=frozenset({"n0"})),), {}))
    assert placed_nodes(r, "j") == ("cloud-spot", [None])


def test_gang_uses_a_failed_node_only_for_the_member_that_needs_it():
    ns = (node("n0"), node("n1"), node("n2"))
    r = run_cycle(snapshot(ns, (job("g", num_gpu=4, nodes=2, pools=("onprem-a",), avoid_nodes=frozenset({"n0"})),), {}))
    assert sorted(placed_nodes(r, "g")[1]) == ["n1", "n2"]
    r = run_cycle(snapshot(ns[:2], (job("g", num_gpu=4, nodes=2, pools=("onprem-a",), avoid_nodes=frozenset({"n0"})),), {}))
    assert sorted(placed_nodes(r, "g")[1]) == ["n0", "n1"]


def test_avoidance_ranks_above_locality():
    ns = (node("data", datasets=frozenset({"s3://b/in"})), node("plain"))
    j = job("j", policy="locality", inputs=("s3://b/in",), pools=("onprem-a",), avoid_nodes=frozenset({"data"}))
    r = run_cycle(snapshot(ns, (j,), {}))
    assert placed_nodes(r, "j") == ("onprem-a", ["plain"])


@st.composite
def one_job_with_failures(draw):
    ns = draw(nodes())
    (j,) = draw(jobs(max_jobs=1))
    ids = [n.node_id for n in ns]
    extra = frozenset(draw(st.lists(st.sampled_from(ids), max_size=len(ids))))
    pools = draw(st.sampled_from([(), ("onprem-a", "onprem-b"), ("onprem-a",), ("onprem-b",)]))
    return ns, dataclasses.replace(j, pools=pools), extra, draw(st.booleans())


@FAST
@given(one_job_with_failures(), st.integers(0, 3), st.sampled_from(["frag-aware", "best-fit", "random"]))
def test_never_on_a_failed_node_while_a_non_failed_fitting_node_exists(case, seed, packing):
    ns, j, extra, failed_where_it_would_go = case
    config = SchedulerConfig(packing=packing)
    plain = run_cycle(snapshot(ns, (j,), {}), config, seed=seed)
    # the interesting case: the job failed on the very nodes it would be placed on again
    avoid = extra | ({m.node for p in plain.placements for m in p.members if m.node} if failed_where_it_would_go else set())
    r = run_cycle(snapshot(ns, (dataclasses.replace(j, avoid_nodes=frozenset(avoid)),), {}), config, seed=seed)
    without = tuple(n for n in ns if n.node_id not in avoid)
    oracle = run_cycle(snapshot(without, (j,), {}), config, seed=seed)
    used = {m.node for p in r.placements for m in p.members}
    if oracle.placements:  # it fits without the failed nodes: none of them may be used
        assert r.placements and not used & avoid
    if plain.placements:  # avoidance never strands a job that fits somewhere
        assert r.placements


# ---------------------------------------------------------------- the spec field


def test_spec_pools_field_validates_names_and_count():
    import pytest
    from pydantic import ValidationError

    from gpufleet.pools import DEFAULT_POOLS
    from gpufleet.spec import LIMITS, JobSpec

    base = {"workload": {"kind": "container", "image": "i", "command": ["x"]}}
    assert JobSpec.model_validate(base).pools == []
    names = [p["name"] for p in DEFAULT_POOLS]
    assert JobSpec.model_validate({**base, "pools": names}).pools == names
    for bad in (["Onprem-A"], ["-x"], [""], ["a_b"], ["a" * 65], ["ok", "sp ace"], "onprem-a"):
        with pytest.raises(ValidationError):
            JobSpec.model_validate({**base, "pools": bad})
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**base, "pools": [f"p{i}" for i in range(int(LIMITS["pools_max"]) + 1)]})
