"""Every custom metric the platform emits: name, unit, dimension sets, and which code path emits it.

Contract:
- Namespace :data:`NAMESPACE`. A :class:`MetricDef` names the dimension sets a data point is published
  under (``()`` = no dimensions). An emitter must give exactly the dimensions those sets name
  (:func:`gpufleet.metrics.emf.record` refuses anything else), so a dashboard widget or alarm
  built from a :class:`MetricDef` (infra/observability.py) reads what the code writes.
- Dimensions are low-cardinality by rule: ``Pool`` (configured pools), ``Phase`` (:data:`gpufleet.phases.PHASES`),
  ``ModelCache`` (hit/miss), ``FailureClass``
  (:class:`gpufleet.status.FailureClass`), ``Outcome`` (:class:`gpufleet.lifecycle.billing.Outcome`),
  ``Reason`` (the scheduler's :class:`gpufleet.scheduler.results.Outcome`; the node API's refusal kinds). Never a
  job, node or tenant id.
- Emitted as CloudWatch embedded metric format (EMF) log lines on stdout by the Lambdas, whose
  log groups CloudWatch Logs extracts them from (no ``PutMetricData``, so no IAM grant).
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "Gpufleet"

POOL = "Pool"
FAILURE_CLASS = "FailureClass"
OUTCOME = "Outcome"
REASON = "Reason"
PHASE = "Phase"
MODEL_CACHE = "ModelCache"


@dataclass(frozen=True)
class MetricDef:
    """One custom metric: ``name``, CloudWatch ``unit``, the ``dimension_sets`` it is published under,
    and ``emitted_by`` (the code path, for the runbook and the acceptance test's messages)."""

    name: str
    unit: str
    dimension_sets: tuple[tuple[str, ...], ...]
    emitted_by: str

    @property
    def dimension_names(self) -> frozenset[str]:
        return frozenset(d for ds in self.dimension_sets for d in ds)


# -- the scheduler pass (lambdas/tasks/scheduler_pass.py → gpufleet.scheduler.passes.run_pass) ---------------
PENDING_JOBS = MetricDef("PendingJobs", "Count", ((),), "scheduler pass: PENDING jobs in its snapshot")
JOBS_CONSIDERED = MetricDef("JobsConsidered", "Count", ((),), "scheduler pass: jobs the cycle decided on")
PLACEMENTS = MetricDef("Placements", "Count", ((), (POOL,)), "scheduler pass: placements committed")
QUEUE_WAIT = MetricDef("QueueWaitSeconds", "Seconds", ((), (POOL,)),
                       "scheduler pass: PENDING → placed, per committed placement")
UNSCHEDULABLE = MetricDef("UnschedulableJobs", "Count", ((REASON,),),
                          "scheduler pass: jobs left PENDING, by result (unschedulable/unresolvable/error/lost)")
PASS_SECONDS = MetricDef("SchedulerPassSeconds", "Seconds", ((),), "scheduler pass: snapshot + cycle + commit")
FREE_GPUS = MetricDef("FreeGpus", "Count", ((POOL,),), "scheduler pass: GPUs free after its placements")
FRAGMENTED_GPUS = MetricDef("FragmentedGpus", "Count", ((POOL,),),
                            "scheduler pass: free GPU capacity on partly used GPUs (no whole-GPU job fits)")

# -- the lifecycle task Lambdas (gpufleet.lifecycle.steps) ----------------------------------------------------
GPU_SECONDS = MetricDef("GpuSeconds", "Seconds", ((), (POOL,)),
                        "CompleteRun (a finished run) and ClassifyFailure (a failed run): the attempt's GPU-seconds")
ATTEMPT_FAILURES = MetricDef("AttemptFailures", "Count", ((FAILURE_CLASS,),), "ClassifyFailure: a failed attempt")
JOBS_ENDED = MetricDef("JobsEnded", "Count", ((OUTCOME,),), "Bill: a job reached its terminal outcome")
FINALIZE_FAILED = MetricDef("FinalizeFailed", "Count", ((),),
                            "MarkFinalizeFailed: finalize or publish failed for good (system failure)")
WORKFLOW_FAILED = MetricDef("WorkflowFailed", "Count", ((),),
                            "MarkFailed: a task of the workflow itself failed for good")

PHASE_SECONDS = MetricDef("PhaseSeconds", "Seconds", ((PHASE,), (POOL, PHASE)),
                          "CompleteRun: the finished attempt's phase durations (gpufleet.phases); Publish: finalize")
MODEL_LOADS = MetricDef("ModelLoads", "Count", ((MODEL_CACHE,), (POOL, MODEL_CACHE)),
                        "CompleteRun: the attempt's model load (hit, miss or resident), by pool too: a cloud pool's "
                        "misses are its GPU instances' host caches missing")

# -- the node API's node heartbeat (gpufleet.nodeapi.service.NodeService.node_heartbeat): what an on-prem agent
#    measured and reported, published under the pool its registration binds (the node id goes in the line's
#    ``node_metrics`` log record, never a dimension)
NODE_GPU_BUSY = MetricDef("NodeGpuBusy", "None", ((POOL,),),
                          "node heartbeat: an on-prem GPU's NVML utilisation (0..1), one value per GPU, as its agent "
                          "sampled it (agents without NVML report none)")
NODE_CACHE_HITS = MetricDef("NodeCacheHits", "Count", ((POOL,),),
                            "node heartbeat: model/data cache hits on an on-prem node since its previous report")
NODE_CACHE_MISSES = MetricDef("NodeCacheMisses", "Count", ((POOL,),),
                              "node heartbeat: model/data cache misses on an on-prem node since its previous report")

# -- the node API's refusals (gpufleet.nodeapi.app.NodeApi.handle): by reason; ``unregistered`` is a caller with the
#    agent role but no registration (never registered, or deregistered: its key still calls)
NODE_CALLS_REFUSED = MetricDef("NodeCallsRefused", "Count", ((REASON,),),
                               "node API: a node's call refused, by reason (unregistered, not-allowed, stale-epoch, "
                               "task-gone)")

ALL: tuple[MetricDef, ...] = (
    PENDING_JOBS, JOBS_CONSIDERED, PLACEMENTS, QUEUE_WAIT, UNSCHEDULABLE, PASS_SECONDS, FREE_GPUS,
    FRAGMENTED_GPUS, GPU_SECONDS, ATTEMPT_FAILURES, JOBS_ENDED, FINALIZE_FAILED, WORKFLOW_FAILED, PHASE_SECONDS,
    MODEL_LOADS, NODE_GPU_BUSY, NODE_CACHE_HITS, NODE_CACHE_MISSES, NODE_CALLS_REFUSED,
)
BY_NAME = {m.name: m for m in ALL}
