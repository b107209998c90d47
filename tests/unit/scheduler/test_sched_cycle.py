"""The cycle's steps on hand-made snapshots: config validation, results vocabulary, pool policies,
quota borrowing, preemption choice, starvation guard, and the placement document."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sched_strategies import POOLS, allocation, job, node, snapshot

from gpufleet.errors import ConfigError
from gpufleet.pools import load_pools, parse_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import SchedulerConfig
from gpufleet.scheduler.model import QuotaNode
from gpufleet.scheduler.quota import QuotaLedger
from gpufleet.scheduler.registry import REGISTRY, build
from gpufleet.scheduler.results import Outcome, Status, requeue_for


def test_config_rejects_unknown_plugins_and_registry_lists_builtins():
    with pytest.raises(ValidationError):
        SchedulerConfig(queue_sort="lottery")
    with pytest.raises(ValidationError):
        SchedulerConfig(packing="worst-fit")
    with pytest.raises(ConfigError):
        build("score", "cheapest")
    assert {"fifo", "priority", "drf", "drf-aging"} <= set(REGISTRY["queue_sort"])
    assert {"cost", "latency", "locality"} <= set(REGISTRY["score"])


def test_result_vocabulary_becomes_requeue_or_backoff():
    assert requeue_for(Status(Outcome.FITS), 0, 0.5) is None
    assert requeue_for(Status(Outcome.UNSCHEDULABLE), 3, 0.5).delay_s == 0
    un = requeue_for(Status(Outcome.UNRESOLVABLE), 2, 0.5)
    assert un.backoff and un.delay_s == 120
    assert requeue_for(Status(Outcome.UNRESOLVABLE), 30, 0.5).delay_s == 3600
    err = requeue_for(Status(Outcome.ERROR), 2, 0.25)
    assert err.backoff and err.delay_s == 30


def test_unresolvable_when_no_pool_can_ever_hold_the_job():
    r = run_cycle(snapshot((node("n0"),), (job("j", num_gpu=1, gpu_type="H100"), job("k", residency=("mars",))), {}))
    assert r.status["j"].outcome is Outcome.UNRESOLVABLE and r.requeue["j"].backoff
    assert r.status["k"].outcome is Outcome.UNRESOLVABLE


def test_cost_policy_prefers_onprem_then_bursts_to_cloud():
    jobs_ = tuple(job(f"j{i}", num_gpu=4, created_at=float(i), pending_since=float(i)) for i in range(3))
    r = run_cycle(snapshot((node("n0"),), jobs_, {}))
    assert [p.pool.name for p in r.placements] == ["onprem-a", "cloud-spot"]
    assert r.status["j2"].outcome is Outcome.UNSCHEDULABLE  # the cloud pool has 6 GPUs


def test_latency_policy_takes_the_free_onprem_node_and_locality_follows_the_data():
    n_plain = node("plain")
    n_data = node("data", datasets=frozenset({"s3://b/in"}))
    r = run_cycle(snapshot((n_plain, n_data), (job("j", policy="locality", inputs=("s3://b/in",)),), {}))
    assert r.placements[0].members[0].node == "data"
    full = node("full", free=(0, 0, 0, 0))
    r = run_cycle(snapshot((full,), (job("l", policy="latency"),), {}))
    assert r.placements[0].pool.name == "cloud-spot"


def test_locality_prefers_a_node_with_the_model_resident_over_one_with_it_cached():
    cached = node("cached", cached_models=frozenset({"wan-2"}))
    warm = node("warm", cached_models=frozenset({"wan-2"}), resident_models=frozenset({"wan-2"}))
    r = run_cycle(snapshot((cached, warm), (job("j", policy="locality", model="wan-2"),), {}))
    assert r.placements[0].members[0].node == "warm"
    r = run_cycle(snapshot((cached, node("other", resident_models=frozenset({"wan-3"}))),
                           (job("k", policy="locality", model="wan-2"),), {}))
    assert r.placements[0].members[0].node == "cached"


def test_borrowing_is_allowed_up_to_the_limit_only():
    q = {"t/a": QuotaNode("t/a", {"*": 1000}, {"*": 1000}, {})}
    jobs_ = tuple(job(f"j{i}", num_gpu=1, created_at=float(i), pending_since=float(i)) for i in range(3))
    r = run_cycle(snapshot((node("n0"),), jobs_, q))
    assert len(r.placements) == 2 and r.status["j2"].outcome is Outcome.UNSCHEDULABLE
    led = QuotaLedger(q, {"t/a": {"*": 2000, "A100": 2000}})
    assert led.borrowing("t/a", "A100") == 1000 and led.violation("t/a/u", "A100", 1) == "t/a"


def test_reclaim_preempts_the_borrower_that_loses_least_work_and_respects_the_window():
    q = {"t/a": QuotaNode("t/a", {"*": 2000}, {"*": 0}, {}), "t/b": QuotaNode("t/b", {"*": 2000}, {"*": 2000}, {})}
    full = node("n0", free=(0, 0, 0, 0))
    running = [
        allocation("b1", "t/b/u", 100, "n0", [0], started=0.0),
        allocation("b2", "t/b/u", 100, "n0", [1], started=0.0, checkpoint=95.0),  # loses 5 s
        allocation("b3", "t/b/u", 100, "n0", [2], started=0.0, checkpoint=99.0, last_preempted=90.0),  # in window
        allocation("b4", "t/b/u", 100, "n0", [3], started=50.0),
    ]
    usage = {"t": {"*": 4000, "A100": 4000}, "t/b": {"*": 4000, "A100": 4000}, "t/b/u": {"*": 4000, "A100": 4000}}
    snap = snapshot((full,), (job("a1", num_gpu=1, gpu_type="A100"),), q, now=100.0, running=running, usage=usage)
    r = run_cycle(snap, SchedulerConfig(preemption_window_s=60))
    assert [v.job_id for v, _ in r.preemptions] == ["b2"]
    assert not r.placements and r.status["a1"].outcome is Outcome.UNSCHEDULABLE
    # a higher-priority victim is never taken, even from a borrower
    running_hi = [allocation(f"h{i}", "t/b/u", 900, "n0", [i]) for i in range(4)]
    r = run_cycle(snapshot((full,), (job("a2", num_gpu=1, gpu_type="A100"),), q, now=100.0, running=running_hi, usage=usage))
    assert not r.preemptions


def test_priority_preemption_within_a_team_only_takes_lower_priority():
    full = node("n0", free=(0, 0, 0, 0))
    running = [allocation("lo", "t/a/u", 10, "n0", [0, 1, 2, 3])]
    r = run_cycle(snapshot((full,), (job("hi", num_gpu=2, gpu_type="A100", priority=500),), {}, now=10.0, running=running))
    assert [v.job_id for v, _ in r.preemptions] == ["lo"]
    r = run_cycle(snapshot((full,), (job("same", num_gpu=2, gpu_type="A100", priority=10),), {}, now=10.0, running=running))
    assert not r.preemptions


def test_a_starving_gang_blocks_backfill_on_its_pools():
    n = node("n0", free=(1000, 1000, 0, 0))
    big = job("big", num_gpu=4, gpu_type="A100", created_at=0.0, pending_since=0.0)
    small = job("small", num_gpu=1, gpu_type="A100", created_at=1.0, pending_since=1.0)
    cfg = SchedulerConfig(starvation_s=600, aging_per_minute=0)
    r = run_cycle(snapshot((n,), (big, small), {}, now=10_000.0), cfg)
    assert not r.placements and "starving" in r.status["small"].reason
    r = run_cycle(snapshot((n,), (big, small), {}, now=100.0), cfg)
    assert [p.job.job_id for p in r.placements] == ["small"]


def test_drf_orders_the_team_with_the_smaller_weighted_share_first():
    q = {"t/a": QuotaNode("t/a", {"*": 0}, {"*": 8000}, {"*": 1.0}), "t/b": QuotaNode("t/b", {"*": 0}, {"*": 8000}, {"*": 4.0})}
    usage = {"t/a": {"A100": 2000, "*": 2000}, "t/b": {"A100": 4000, "*": 4000}}
    jobs_ = (job("ja", team="a", created_at=0.0), job("jb", team="b", created_at=5.0))
    r = run_cycle(snapshot((node("n0"),), jobs_, q, usage=usage), SchedulerConfig(queue_sort="drf"))
    assert r.order == ["jb", "ja"]  # b uses more but its weight is 4x
    r = run_cycle(snapshot((node("n0"),), jobs_, q, usage=usage), SchedulerConfig(queue_sort="fifo"))
    assert r.order == ["ja", "jb"]


def test_placement_document_follows_the_contract():
    r = run_cycle(snapshot((node("n0", queue_url="https://q/n0"),), (job("j", num_gpu=1, gpu_milli=250),), {}))
    doc = r.placements[0].to_json(3)
    assert doc["epoch"] == 3 and doc["attempt"] == 3 and doc["target"] == "onprem" and doc["node"] == "n0"
    assert doc["queue_url"] == "https://q/n0" and doc["gpu_milli"] == 250 and len(doc["gpu_indices"]) == 1
    gang = run_cycle(snapshot((node("a"), node("b")), (job("g", num_gpu=4, nodes=2),), {})).placements[0].to_json(1)
    assert {m["node"] for m in gang["members"]} == {"a", "b"}


def test_pool_configuration_is_validated():
    assert [p.name for p in load_pools({})] == ["onprem-a", "cloud-spot", "cloud-ondemand", "cloud-gang"]
    with pytest.raises(ConfigError):
        parse_pools([{"name": "x", "kind": "spot", "region": "r", "gpu_type": "A10G", "max_gpus": 1}])  # no job queue
    with pytest.raises(ConfigError):
        parse_pools('[{"name": "a", "kind": "onprem", "region": "r", "gpu_type": "A100", "max_gpus": 1},'
                    ' {"name": "a", "kind": "onprem", "region": "r", "gpu_type": "A100", "max_gpus": 1}]')
    with pytest.raises(ConfigError):
        load_pools({"GPUFLEET_POOLS": "not json"})
    assert POOLS[2].kind.is_cloud


def test_burst_after_wait_keeps_fresh_jobs_off_paid_pools():
    cfg = SchedulerConfig(filters=("gpu-type", "residency", "fits-ever", "quota", "burst-after-wait"), burst_after_s=600)
    full = node("n0", free=(0, 0, 0, 0))
    fresh = job("fresh", created_at=90.0, pending_since=90.0)
    old = job("old", created_at=0.0, pending_since=-1000.0)
    r = run_cycle(snapshot((full,), (fresh, old), {}, now=100.0), cfg)
    assert [p.job.job_id for p in r.placements] == ["old"] and r.placements[0].pool.name == "cloud-spot"
    assert r.status["fresh"].outcome is Outcome.UNSCHEDULABLE and "fresh" not in {p.job.job_id for p in r.placements}


def test_burst_within_guarantee_sends_only_entitled_work_to_paid_pools():
    cfg = SchedulerConfig(filters=("gpu-type", "residency", "fits-ever", "quota", "burst-within-guarantee"), preempt=None)
    q = {"t/a": QuotaNode("t/a", {"*": 1000}, {"*": 8000}, {}), "t/b": QuotaNode("t/b", {"*": 0}, {"*": 8000}, {})}
    full = node("n0", free=(0, 0, 0, 0))
    r = run_cycle(snapshot((full,), (job("a", team="a"), job("b", team="b")), q), cfg)
    assert [p.job.job_id for p in r.placements] == ["a"] and r.placements[0].pool.name == "cloud-spot"
    assert r.status["b"].outcome is Outcome.UNSCHEDULABLE
