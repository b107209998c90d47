"""Every custom metric the dashboard and the alarms read is emitted, with exactly those dimensions, by the
code path it describes.

The read side comes from the synthesized template: every metric in namespace ``Gpufleet`` that a
dashboard widget (``DashboardBody``) or an alarm (``Metrics[].MetricStat`` or a single-metric alarm)
names, with its dimensions. The emitted side comes from running the real code on the deployed stack:
the control-plane survey (:mod:`control_plane_survey`) keeps every CloudWatch EMF line the functions
wrote to stdout, with the function that wrote it. For each metric read:

- the catalogue (:mod:`gpufleet.metrics.catalog`) defines it, with those dimension names as one of its
  dimension sets;
- the survey saw it emitted under exactly those dimension names, and only by the functions that
  :data:`EMITTERS` names for it (the code path the dashboard says it describes);
- each dimension value was emitted as such, or — for what the survey's scenarios cannot all produce
  (``FailureClass`` PREEMPTED/SYSTEM, ``Outcome`` QUARANTINED/…, a queue wait in a pool no scenario
  uses) — is a value of the vocabulary the emitting code takes it from. Scheduler reasons, and the
  per-pool placements and free GPUs, are emitted on every pass, so each must have been seen.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from gpufleet.lifecycle.billing import Outcome
from gpufleet.metrics import catalog as M
from gpufleet.metrics.emf import parse_line
from gpufleet.phases import MODEL_CACHE, PHASE_NAMES
from gpufleet.pools import load_pools
from gpufleet.status import FailureClass

pytestmark = [pytest.mark.xdist_group("cdk-synth"), pytest.mark.slow]

#: metric → the functions (survey principals) whose code emits it
EMITTERS = {
    M.PENDING_JOBS.name: {"scheduler"},
    M.JOBS_CONSIDERED.name: {"scheduler"},
    M.PLACEMENTS.name: {"scheduler"},
    M.QUEUE_WAIT.name: {"scheduler"},
    M.UNSCHEDULABLE.name: {"scheduler"},
    M.PASS_SECONDS.name: {"scheduler"},
    M.FREE_GPUS.name: {"scheduler"},
    M.FRAGMENTED_GPUS.name: {"scheduler"},
    M.GPU_SECONDS.name: {"complete_run", "classify_failure"},
    M.ATTEMPT_FAILURES.name: {"classify_failure"},
    M.JOBS_ENDED.name: {"bill"},
    M.FINALIZE_FAILED.name: {"mark_terminal"},
    M.WORKFLOW_FAILED.name: {"mark_terminal"},
    M.PHASE_SECONDS.name: {"complete_run", "publish"},
    M.MODEL_LOADS.name: {"complete_run"},
    M.NODE_GPU_BUSY.name: {"node_api"},
    M.NODE_CACHE_HITS.name: {"node_api"},
    M.NODE_CACHE_MISSES.name: {"node_api"},
    M.NODE_CALLS_REFUSED.name: {"node_api"},
}

#: dimension → every value the emitting code can give it; ``None``: every value read must have been emitted
VOCABULARY: dict[str, set[str] | None] = {
    M.POOL: {p.name for p in load_pools({})},  # the deployed functions' pools (no GPUFLEET_POOLS: the defaults)
    M.REASON: None,
    M.FAILURE_CLASS: {c.value for c in FailureClass},
    M.OUTCOME: {o.value for o in Outcome},
    M.PHASE: set(PHASE_NAMES),  # staging needs a job with inputs: no survey job has any
    M.MODEL_CACHE: set(MODEL_CACHE),
}

Read = tuple[str, frozenset[tuple[str, str]]]


def _dashboard_body(raw) -> dict:
    if isinstance(raw, dict) and "Fn::Join" in raw:
        raw = "".join(p if isinstance(p, str) else "TOKEN" for p in raw["Fn::Join"][1])
    return json.loads(raw)


def metrics_read(tpl: dict) -> dict[Read, list[str]]:
    """(metric name, dimensions) of every ``Gpufleet`` metric the dashboard and alarms read → who reads it."""
    read: dict[Read, list[str]] = defaultdict(list)
    for lid, res in tpl["Resources"].items():
        props = res.get("Properties", {})
        if res["Type"] == "AWS::CloudWatch::Dashboard":
            for widget in _dashboard_body(props["DashboardBody"])["widgets"]:
                for row in widget.get("properties", {}).get("metrics", []):
                    if not row or not isinstance(row[0], str) or row[0] != M.NAMESPACE:
                        continue
                    parts = [x for x in row[2:] if isinstance(x, str)]
                    dims = frozenset(zip(parts[::2], parts[1::2], strict=True))
                    read[(row[1], dims)].append(f"dashboard widget {widget['properties'].get('title')!r}")
        elif res["Type"] == "AWS::CloudWatch::Alarm":
            stats = [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
            if "MetricName" in props:
                stats.append(props)
            for m in stats:
                if m.get("Namespace") == M.NAMESPACE:
                    dims = frozenset((d["Name"], d["Value"]) for d in m.get("Dimensions", []))
                    read[(m["MetricName"], dims)].append(f"alarm {lid}")
    return read


@pytest.fixture(scope="module")
def emitted(survey) -> list[tuple[str, str, frozenset[tuple[str, str]]]]:
    """(principal, metric name, dimensions) of every EMF record in namespace ``Gpufleet`` the survey's functions
    wrote (the API's Powertools request counters live in their own namespace, ``gpufleet``)."""
    out = []
    for principal, line in survey.emf:
        records = parse_line(line)
        assert records, f"{principal} wrote an EMF line that does not parse: {line[:300]}"
        for ns, name, dims, _values in records:
            if ns != M.NAMESPACE:
                continue
            assert name in M.BY_NAME, f"{principal} emitted {ns}/{name}, not in the catalogue"
            out.append((principal, name, dims))
    return out


def test_the_dashboard_and_alarms_read_custom_metrics(tpl):
    read = metrics_read(tpl)
    names = {name for name, _ in read}
    assert {M.PENDING_JOBS.name, M.QUEUE_WAIT.name, M.PLACEMENTS.name, M.GPU_SECONDS.name,
            M.ATTEMPT_FAILURES.name, M.JOBS_ENDED.name, M.FINALIZE_FAILED.name} <= names
    pools = {p.name for p in load_pools({})}
    assert {dict(d)[M.POOL] for n, d in read if n == M.QUEUE_WAIT.name and d} == pools  # the per-pool SLOs


def test_every_metric_read_is_emitted_with_those_dimensions_by_its_code_path(tpl, emitted):
    read = metrics_read(tpl)
    seen_pairs = {(name, dims) for _, name, dims in emitted}
    seen_names = {(name, frozenset(k for k, _ in dims)) for _, name, dims in emitted}
    by = defaultdict(set)
    for principal, name, _ in emitted:
        by[name].add(principal)
    problems = []
    for (name, dims), readers in sorted(read.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))):
        where = f"{name} {dict(dims)} (read by {readers[0]})"
        metric = M.BY_NAME.get(name)
        if metric is None:
            problems.append(f"{where}: not in gpufleet.metrics.catalog")
            continue
        keys = frozenset(k for k, _ in dims)
        if keys not in {frozenset(ds) for ds in metric.dimension_sets}:
            problems.append(f"{where}: the catalogue publishes it under {metric.dimension_sets}")
        if (name, keys) not in seen_names:
            problems.append(f"{where}: never emitted with dimensions {sorted(keys)}")
            continue
        wrong = by[name] - EMITTERS[name]
        if wrong or not by[name]:
            problems.append(f"{where}: emitted by {sorted(by[name])}, expected {sorted(EMITTERS[name])}")
        if (name, dims) in seen_pairs:
            continue
        for k, v in dims:
            vocab = VOCABULARY.get(k)
            if vocab is None:
                problems.append(f"{where}: {k}={v} never emitted")
            elif v not in vocab:
                problems.append(f"{where}: {k}={v} is no value the code emits")
    assert not problems, "\n".join(problems)


def test_the_survey_saw_the_metrics_of_each_scenario(emitted):
    """What the scenarios must have produced (so the vocabulary fallback above covers only the rest)."""
    pairs = {(name, dims) for _, name, dims in emitted}
    assert (M.ATTEMPT_FAILURES.name, frozenset({(M.FAILURE_CLASS, FailureClass.USER.value)})) in pairs
    assert (M.ATTEMPT_FAILURES.name, frozenset({(M.FAILURE_CLASS, FailureClass.CANCELLED.value)})) in pairs
    for outcome in (Outcome.SUCCEEDED, Outcome.USER_ERROR, Outcome.REJECTED, Outcome.SYSTEM_FAILURE):
        assert (M.JOBS_ENDED.name, frozenset({(M.OUTCOME, outcome.value)})) in pairs, outcome
    assert (M.FINALIZE_FAILED.name, frozenset()) in pairs
    # the runtime's phase timings reached CompleteRun: cloud runs and the on-prem run (dispatch: on-prem only)
    for phase in ("start", "model_load", "first_step", "steps", "run", "dispatch", "finalize"):
        assert (M.PHASE_SECONDS.name, frozenset({(M.PHASE, phase)})) in pairs, phase
    assert (M.PHASE_SECONDS.name, frozenset({(M.PHASE, "dispatch"), (M.POOL, "onprem-a")})) in pairs
    assert any(n == M.MODEL_LOADS.name for n, _ in pairs)
    # by pool too (the dashboard's misses per pool): every load names its pool and its cache outcome
    loads = {dims for n, dims in pairs if n == M.MODEL_LOADS.name}
    assert any({k for k, _ in dims} == {M.POOL, M.MODEL_CACHE} for dims in loads), loads
    # what the on-prem agent measured, through its node heartbeat
    for metric in (M.NODE_GPU_BUSY, M.NODE_CACHE_HITS, M.NODE_CACHE_MISSES):
        assert (metric.name, frozenset({(M.POOL, "onprem-a")})) in pairs, metric.name
    assert any(n == M.QUEUE_WAIT.name and dict(d).get(M.POOL) == "cloud-ondemand" for n, d in pairs)
    assert any(n == M.QUEUE_WAIT.name and dict(d).get(M.POOL) == "onprem-a" for n, d in pairs)
    for pool in VOCABULARY[M.POOL]:  # every pass reports every pool
        for metric in (M.PLACEMENTS, M.FREE_GPUS, M.FRAGMENTED_GPUS):
            assert (metric.name, frozenset({(M.POOL, pool)})) in pairs, (metric.name, pool)
