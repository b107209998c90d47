"""The cluster's static shape fingerprint (gpufleet.scheduler.shape) and how the cycle uses it: UNRESOLVABLE
backoffs grow with the job's own scheduling attempts, and a parked job is considered again as soon as the shape
its backoff recorded is no longer the cluster's, not when the free capacity or the heartbeats move."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from sched_strategies import POOLS, job, jobs, node, nodes, snapshot

from gpufleet.pools import parse_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.results import Outcome
from gpufleet.scheduler.shape import FINGERPRINT_HEX, cluster_shape

NOW = 100.0  # sched_strategies.snapshot's now
PLUGINS = ("allowlist", "gpu-type", "residency", "fits-ever")


def shape(pools=POOLS, nodes_=(), now=NOW, plugins=PLUGINS):
    return cluster_shape(pools, nodes_, now, plugins)


# --------------------------------------------------------------------------- the pure function


@settings(max_examples=60, deadline=None)
@given(nodes(), st.randoms(use_true_random=False))
def test_the_fingerprint_ignores_the_order_of_pools_nodes_and_plugins(ns, rnd):
    pools, ns2, plugins = list(POOLS), list(ns), list(PLUGINS)
    rnd.shuffle(pools)
    rnd.shuffle(ns2)
    rnd.shuffle(plugins)
    fp = shape(POOLS, ns)
    assert shape(tuple(pools), tuple(ns2), plugins=tuple(plugins)) == fp
    assert len(fp) == FINGERPRINT_HEX and int(fp, 16) >= 0


@settings(max_examples=60, deadline=None)
@given(nodes(), st.data())
def test_free_capacity_heartbeats_caches_and_labels_leave_the_fingerprint_alone(ns, data):
    moved = tuple(
        dataclasses.replace(
            n,
            gpu_free=tuple(data.draw(st.sampled_from([0, 250, 1000])) for _ in n.gpu_free),
            cpu_milli_free=data.draw(st.integers(0, 10**6)),
            memory_mib_free=data.draw(st.integers(0, 10**7)),
            expires_at=NOW + data.draw(st.floats(1.0, 10**6)),  # a fresh heartbeat: still usable
            cached_models=frozenset(data.draw(st.sets(st.sampled_from(["m1", "m2"])))),
            resident_models=frozenset(data.draw(st.sets(st.sampled_from(["m1"])))),
            labels=(("rack", data.draw(st.sampled_from(["r1", "r2"]))),),
            queue_url=data.draw(st.sampled_from(["", "q"])),
        )
        for n in ns
    )
    assert shape(nodes_=moved) == shape(nodes_=ns)
    priced = tuple(p.model_copy(update={"price_per_gpu_hour": p.price_per_gpu_hour + 1, "cold_start_s": 9.0}) for p in POOLS)
    assert shape(priced, ns) == shape(POOLS, ns)


def test_every_part_of_the_static_shape_changes_the_fingerprint():
    base_nodes = (node("n0"), node("n1", pool="onprem-b", gpu_type="L4"))
    fp = shape(nodes_=base_nodes)
    variants = {
        "a node registers": base_nodes + (node("n2"),),
        "a node leaves": base_nodes[1:],
        "a node drains": (dataclasses.replace(base_nodes[0], draining=True), base_nodes[1]),
        "a node's registration expires": (dataclasses.replace(base_nodes[0], expires_at=NOW), base_nodes[1]),
        "a node has more GPUs": (node("n0", free=(1000,) * 8), base_nodes[1]),
        "a node moves pool": (node("n0", pool="onprem-b"), base_nodes[1]),
        "a node's GPU type": (node("n0", gpu_type="H100"), base_nodes[1]),
    }
    seen = {fp}
    for what, ns in variants.items():
        other = shape(nodes_=ns)
        assert other != fp, what
        seen.add(other)
    raw = [p.model_dump(mode="json") for p in POOLS]
    pool_variants = {
        "a pool is configured": raw + [{"name": "onprem-c", "kind": "onprem", "region": "eu", "gpu_type": "H100",
                                        "max_gpus": 8}],
        "a pool is removed": raw[:2],
        "a pool's GPU type": [dict(raw[0], gpu_type="H100")] + raw[1:],
        "a pool's region": [dict(raw[0], region="us")] + raw[1:],
        "a cloud pool's size": raw[:2] + [dict(raw[2], max_gpus=7)],
        "a cloud pool's kind": raw[:2] + [dict(raw[2], kind="ondemand")],
    }
    for what, pools in pool_variants.items():
        other = shape(parse_pools(pools), base_nodes)
        assert other != fp, what
        seen.add(other)
    assert shape(nodes_=base_nodes, plugins=PLUGINS[:-1]) != fp
    # a node draining or expired is, to the pass, a node gone: the same shape as without it
    gone = {shape(nodes_=variants[k]) for k in ("a node leaves", "a node drains", "a node's registration expires")}
    assert len(gone) == 1
    assert len(seen) == 1 + len(variants) - 2 + len(pool_variants)


@settings(max_examples=80, deadline=None)
@given(nodes(), nodes(), jobs(max_jobs=6))
def test_equal_fingerprints_give_equal_unresolvable_verdicts(ns_a, ns_b, js):
    """What the fingerprint leaves out cannot turn a job UNRESOLVABLE or back: two clusters with the same static
    shape but different free capacity judge every job UNRESOLVABLE alike (b keeps a's shape, b's free GPUs)."""
    same_shape = tuple(
        dataclasses.replace(a, gpu_free=tuple(b.gpu_free[i % len(b.gpu_free)] for i in range(len(a.gpu_free))),
                            cpu_milli_free=b.cpu_milli_free)
        for a, b in zip(ns_a, ns_b * len(ns_a), strict=False)
    )
    assert shape(nodes_=same_shape) == shape(nodes_=ns_a)
    r_a = run_cycle(snapshot(ns_a, js, {}))
    r_b = run_cycle(snapshot(same_shape, js, {}))
    assert r_a.shape == r_b.shape
    for j in js:
        assert (r_a.status[j.job_id].outcome is Outcome.UNRESOLVABLE) == (r_b.status[j.job_id].outcome is Outcome.UNRESOLVABLE)


# --------------------------------------------------------------------------- the cycle


def test_unresolvable_backoff_doubles_with_the_jobs_scheduling_attempts_not_its_runs():
    delays = []
    for n in range(8):
        r = run_cycle(snapshot((node("n0"),), (job("j", gpu_type="H100", sched_attempts=n),), {}))
        assert r.status["j"].outcome is Outcome.UNRESOLVABLE
        delays.append(r.requeue["j"].delay_s)
    assert delays == [30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 3600.0]
    never_ran = run_cycle(snapshot((node("n0"),), (job("j", gpu_type="H100", attempts=0, sched_attempts=5),), {}))
    assert never_ran.requeue["j"].delay_s == 960.0


def test_a_parked_job_waits_while_the_shape_is_the_one_it_was_judged_on():
    parked = run_cycle(snapshot((node("n0"),), (job("j", pools=("onprem-b",)),), {}))
    assert parked.status["j"].outcome is Outcome.UNRESOLVABLE and parked.shape
    later = job("j", pools=("onprem-b",), backoff_until=NOW + 30, backoff_shape=parked.shape, sched_attempts=1)
    # the free capacity moved (n0 half used): the same shape, still backing off, not re-judged
    r = run_cycle(snapshot((node("n0", free=(0, 0, 1000, 1000)),), (later,), {}))
    assert r.status["j"].reason == "backing off" and r.woken == 0 and r.order == []
    # a node of its pool registers: considered at once and placed, long before its backoff ends
    r = run_cycle(snapshot((node("n0"), node("b1", pool="onprem-b", gpu_type="L4")), (later,), {}))
    assert r.woken == 1 and r.status["j"].ok and r.placements[0].members[0].node == "b1"


def test_a_shape_change_that_does_not_help_re_judges_it_once_and_it_parks_again_longer():
    r0 = run_cycle(snapshot((node("n0"),), (job("j", gpu_type="H100"),), {}))
    later = job("j", gpu_type="H100", backoff_until=NOW + 30, backoff_shape=r0.shape, sched_attempts=1)
    r = run_cycle(snapshot((node("n0"), node("n1")), (later,), {}))  # another A100 node: still no H100
    assert r.woken == 1 and r.status["j"].outcome is Outcome.UNRESOLVABLE
    assert r.requeue["j"].delay_s == 60.0 and r.shape != r0.shape


def test_an_error_backoff_records_no_shape_and_only_its_end_wakes_it():
    waiting = job("j", backoff_until=NOW + 30, backoff_shape="", sched_attempts=1)
    r = run_cycle(snapshot((node("n0"), node("n1")), (waiting,), {}))
    assert r.status["j"].reason == "backing off" and r.woken == 0
    r = run_cycle(dataclasses.replace(snapshot((node("n0"),), (waiting,), {}), now=NOW + 30))
    assert r.status["j"].ok
