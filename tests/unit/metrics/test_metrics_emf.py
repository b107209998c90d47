"""The EMF writer (pure): exact dimensions, value lists, one parseable line per record, never failing its caller."""

from __future__ import annotations

import io
import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.metrics import Metrics, RecordingMetrics
from gpufleet.metrics import catalog as M
from gpufleet.metrics.emf import MAX_VALUES, parse_line, record


def test_a_record_is_the_emf_document_of_its_metric_and_dimension_sets():
    doc = record(M.PLACEMENTS, 3, {"Pool": "onprem-a"}, timestamp_ms=1700000000000)
    assert doc == {
        "_aws": {"Timestamp": 1700000000000, "CloudWatchMetrics": [{
            "Namespace": "Gpufleet", "Dimensions": [[], ["Pool"]],
            "Metrics": [{"Name": "Placements", "Unit": "Count"}]}]},
        "Pool": "onprem-a", "Placements": 3.0,
    }
    assert sorted(parse_line(json.dumps(doc))) == sorted([
        ("Gpufleet", "Placements", frozenset(), [3.0]),
        ("Gpufleet", "Placements", frozenset({("Pool", "onprem-a")}), [3.0]),
    ])


@pytest.mark.parametrize("dims", [{}, {"Pool": "a", "Tenant": "t"}, {"Pool": ""}, {"Pool": 3}])
def test_dimensions_must_be_exactly_those_of_the_metric(dims):
    with pytest.raises(ValueError):
        record(M.PLACEMENTS, 1, dims)


def test_value_lists_carry_up_to_the_emf_limit():
    assert record(M.QUEUE_WAIT, [1, 2.5], {"Pool": "p"})["QueueWaitSeconds"] == [1.0, 2.5]
    for bad in ([], [0.0] * (MAX_VALUES + 1)):
        with pytest.raises(ValueError):
            record(M.QUEUE_WAIT, bad, {"Pool": "p"})


def test_metrics_write_one_line_each_to_the_current_stdout(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    Metrics().put(M.FINALIZE_FAILED, 1)
    Metrics().log("scheduler_pass", {"placed": 2})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and parse_line(lines[0]) == [("Gpufleet", "FinalizeFailed", frozenset(), [1.0])]
    assert json.loads(lines[1]) == {"event": "scheduler_pass", "placed": 2} and parse_line(lines[1]) == []


def test_a_broken_stream_never_fails_the_caller():
    def broken(_line: str) -> None:
        raise OSError("closed")

    Metrics(write=broken).put(M.FINALIZE_FAILED, 1)  # logged, not raised
    with pytest.raises(ValueError):  # a wrong dimension is the caller's bug
        Metrics(write=broken).put(M.FINALIZE_FAILED, 1, {"Pool": "p"})


def test_every_catalogue_metric_is_unique_and_low_cardinality():
    assert len(M.BY_NAME) == len(M.ALL)
    assert set().union(*(m.dimension_names for m in M.ALL)) <= {M.POOL, M.FAILURE_CLASS, M.OUTCOME, M.REASON, M.PHASE,
                                                                   M.MODEL_CACHE}


@given(st.sampled_from(M.ALL), st.lists(st.floats(-1e9, 1e9), min_size=1, max_size=MAX_VALUES),
       st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20))
def test_what_is_recorded_parses_back(metric, values, dim_value):
    dims = {d: dim_value for d in metric.dimension_names}
    m = RecordingMetrics()
    m.put(metric, values, dims)
    for ds in metric.dimension_sets:
        assert m.values(metric.name, **{d: dim_value for d in ds}) == [float(v) for v in values]
