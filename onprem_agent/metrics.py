"""Prometheus metrics of one agent, served on localhost with ``prometheus-client``.

Each :class:`AgentMetrics` has its own registry (several agents can live in one
test process). GPU utilization/memory and cache counters are read at scrape
time by a collector, so they are never stale.

:class:`ShippedMetrics` is what the agent sends with each node heartbeat to the node API, which publishes
it to CloudWatch (EMF on the node API function's log stream: ``NodeGpuBusy``, ``NodeCacheHits``,
``NodeCacheMisses`` by pool, and a ``node_metrics`` log line naming the node). The node's role stays
as narrow as it is: no CloudWatch or Logs permission, only the node API call it already makes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpufleet.runtime.hostcache import CacheStats
from onprem_agent.gpus import GpuSample

_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_RUN_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 48 * 3600)
_GAP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class _ScrapeCollector(Collector):
    def __init__(self, gpus: Callable[[], list[GpuSample]], cache: Callable[[], CacheStats | None]) -> None:
        self._gpus = gpus
        self._cache = cache

    def collect(self) -> Iterable:
        util = GaugeMetricFamily("gpufleet_agent_gpu_utilization_ratio", "GPU utilization (NVML), 0..1", labels=["gpu"])
        mem = GaugeMetricFamily("gpufleet_agent_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=["gpu"])
        total = GaugeMetricFamily("gpufleet_agent_gpu_memory_total_bytes", "GPU memory (NVML)", labels=["gpu"])
        for s in self._gpus():
            util.add_metric([str(s.index)], s.utilization)
            mem.add_metric([str(s.index)], s.memory_used_bytes)
            total.add_metric([str(s.index)], s.memory_total_bytes)
        yield from (util, mem, total)
        st = self._cache()
        if st is not None:
            yield CounterMetricFamily("gpufleet_agent_cache_hits", "model/data cache hits", value=st.hits)
            yield CounterMetricFamily("gpufleet_agent_cache_misses", "model/data cache misses", value=st.misses)
            yield CounterMetricFamily("gpufleet_agent_cache_evictions", "cache entries evicted (LRU)", value=st.evictions)
            yield GaugeMetricFamily("gpufleet_agent_cache_bytes", "bytes held by the cache", value=st.bytes)


class ShippedMetrics:
    """The ``metrics`` of a node heartbeat (pure): NVML utilisation per GPU as sampled now (nothing without
    NVML: never a made-up number), and the cache hits and misses since the last report the node API
    accepted. :meth:`pending` builds a report; :meth:`sent` marks it delivered (a failed heartbeat's
    counts go with the next one)."""

    def __init__(self) -> None:
        self._hits = 0
        self._misses = 0

    def pending(self, gpus: list[GpuSample], cache: CacheStats | None) -> dict:
        hits, misses = (cache.hits, cache.misses) if cache is not None else (self._hits, self._misses)
        if hits < self._hits or misses < self._misses:  # a counter went back (a new cache): count from zero
            self._hits = self._misses = 0
        return {"gpu_busy": {str(s.index): round(min(1.0, max(0.0, s.utilization)), 4) for s in gpus},
                "cache_hits": hits - self._hits, "cache_misses": misses - self._misses,
                "_totals": (hits, misses)}

    def sent(self, report: dict) -> None:
        self._hits, self._misses = report["_totals"]

    @staticmethod
    def body(report: dict) -> dict:
        """The report as the node API takes it (without the bookkeeping)."""
        return {k: v for k, v in report.items() if not k.startswith("_")}


class AgentMetrics:
    def __init__(
        self,
        gpus: Callable[[], list[GpuSample]] = list,
        cache: Callable[[], CacheStats | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.jobs = Counter("gpufleet_agent_jobs", "jobs finished on this node, by outcome", ["outcome"], registry=r)
        self.queue_wait = Histogram(
            "gpufleet_agent_queue_wait_seconds", "message sent → workload process started", buckets=_WAIT_BUCKETS, registry=r
        )
        self.run_time = Histogram("gpufleet_agent_job_run_seconds", "job process run time", buckets=_RUN_BUCKETS, registry=r)
        self.idle_gap = Histogram(
            "gpufleet_agent_gpu_idle_gap_seconds",
            "time a GPU sat free between one job ending and the next starting on it",
            buckets=_GAP_BUCKETS,
            registry=r,
        )
        self.running = Gauge("gpufleet_agent_running_jobs", "job processes running now", registry=r)
        self.free_gpus = Gauge("gpufleet_agent_free_gpus", "whole GPUs (or CPU slots) free now", registry=r)
        self.draining = Gauge("gpufleet_agent_draining", "1 while the agent drains", registry=r)
        self.registered = Gauge("gpufleet_agent_registered", "1 while the node API accepts this node's heartbeats, 0 "
                                "once it refuses them as not registered (deregistered by an operator)", registry=r)
        self.registered.set(1)
        self.duplicates = Counter(
            "gpufleet_agent_duplicate_messages", "redelivered or stale messages dropped without running", ["reason"], registry=r
        )
        self.starts = Counter("gpufleet_agent_job_starts", "jobs started, by process: fresh or warm (a warm worker)",
                              ["process"], registry=r)
        self.warm_workers = Gauge("gpufleet_agent_warm_workers", "warm worker processes alive now", registry=r)
        self.warm_replaced = Counter("gpufleet_agent_warm_workers_replaced", "warm workers that died and were replaced",
                                     registry=r)
        self.prefetches = Counter("gpufleet_agent_prefetches", "held jobs' inputs and model fetched into the cache "
                                  "before they started, by outcome: done, stopped, failed", ["outcome"], registry=r)
        self.nudges = Counter("gpufleet_agent_cancel_nudges", "cancel nudges read from the node's signal queue, by "
                              "the attempt they named: running, held or unknown", ["target"], registry=r)
        self.heartbeat_errors = Counter("gpufleet_agent_heartbeat_errors", "failed task/node heartbeats", ["kind"], registry=r)
        r.register(_ScrapeCollector(gpus, cache))
        self._server = None

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint; returns the bound port (useful with port 0)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
