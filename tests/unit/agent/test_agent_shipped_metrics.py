"""What an agent ships with its node heartbeat (onprem_agent.metrics.ShippedMetrics, NodeRegistry.put)."""

from __future__ import annotations

from gpufleet.errors import ValidationFailed
from gpufleet.runtime.hostcache import CacheStats
from onprem_agent.aws import NodeRegistry
from onprem_agent.gpus import GpuSample
from onprem_agent.metrics import ShippedMetrics


def test_gpu_utilisation_as_sampled_and_cache_counts_since_the_last_delivered_report():
    s = ShippedMetrics()
    gpus = [GpuSample(0, 0.5, 1, 2), GpuSample(1, 1.0, 1, 2)]
    first = s.pending(gpus, CacheStats(hits=4, misses=1))
    assert ShippedMetrics.body(first) == {"gpu_busy": {"0": 0.5, "1": 1.0}, "cache_hits": 4, "cache_misses": 1}
    again = s.pending([], CacheStats(hits=6, misses=1))  # the first was never delivered: its counts stay due
    assert (again["cache_hits"], again["cache_misses"]) == (6, 1)
    s.sent(again)
    later = ShippedMetrics.body(s.pending([], CacheStats(hits=7, misses=3)))
    assert later == {"gpu_busy": {}, "cache_hits": 1, "cache_misses": 2}  # no NVML: no utilisation, never 0
    assert ShippedMetrics.body(s.pending([], None)) == {"gpu_busy": {}, "cache_hits": 0, "cache_misses": 0}


class Api:
    def __init__(self, refuse_metrics: bool) -> None:
        self.refuse_metrics, self.bodies = refuse_metrics, []

    def call(self, method, path, body=None):
        self.bodies.append(body)
        if self.refuse_metrics and "metrics" in body:
            raise ValidationFailed("invalid body: metrics: extra fields not permitted")
        return {"ok": True}


def test_a_node_api_that_refuses_metrics_still_gets_the_liveness_report():
    item = {"gpus": [{"index": 0, "milli_free": 1000}], "running_jobs": 0}
    metrics = {"gpu_busy": {}, "cache_hits": 0, "cache_misses": 0}
    new, old = Api(refuse_metrics=False), Api(refuse_metrics=True)
    assert NodeRegistry(new).put(item, 60, metrics) == {"ok": True} and new.bodies[0]["metrics"] == metrics
    assert NodeRegistry(old).put(item, 60, metrics) == {"ok": True}
    assert ["metrics" in b for b in old.bodies] == [True, False]
