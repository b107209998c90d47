"""Phase timings (pure): the record the runtime writes, its validation, and the durations it yields."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.phases import MARKS, PHASES, PhaseRecorder, attempt_marks, durations, parse, summary


def test_a_recorder_marks_each_phase_once_with_its_details():
    t = iter([10.0, 11.0, 12.5, 13.0, 99.0])
    rec = PhaseRecorder(lambda: next(t))
    rec.mark("started")
    rec.mark("model_loaded", model_cache="miss", model_bytes=2048)
    rec.mark("first_step")
    rec.mark("generation_done", steps=4, mean_step_s=0.25)
    rec.mark("started")  # a second mark of a phase keeps the first time
    assert rec.as_item() == {"started": 10.0, "model_loaded": 11.0, "model_cache": "miss", "model_bytes": 2048,
                             "first_step": 12.5, "generation_done": 13.0, "steps": 4, "mean_step_s": 0.25}
    with pytest.raises(ValueError):
        rec.mark("lunch")


@pytest.mark.parametrize("bad", [
    {"started": "soon"}, {"started": float("nan")}, {"started": -1.0}, {"started": True}, {"lunch": 1.0},
    {"model_cache": "warm"}, {"steps": 2.5}, {"model_bytes": -1}, {"started": 5.0, "model_loaded": 4.0},
])
def test_parse_refuses_what_the_runtime_never_writes(bad):
    with pytest.raises(ValueError):
        parse(bad)


def test_an_attempt_items_marks_give_the_durations_of_each_phase():
    attempt = {"created_at": "2026-01-01T00:00:00Z", "dispatched_at": 1767225601.5,
               "phases": {"started": 1767225603.0, "model_loaded": 1767225606.0, "model_cache": "hit",
                          "first_step": 1767225607.0, "generation_done": 1767225615.0, "steps": 9,
                          "mean_step_s": 1.0}}
    marks = attempt_marks(attempt)
    assert marks["placed"] == 1767225600.0
    assert summary(marks) == {
        "durations": {"dispatch": 1.5, "start": 1.5, "model_load": 3.0, "first_step": 1.0, "steps": 8.0, "run": 12.0},
        "model_cache": "hit", "steps": 9, "mean_step_s": 1.0}
    assert attempt_marks(None) == {} and summary({}) == {"durations": {}}
    # a cloud attempt: no dispatch mark; start counts from the placement
    cloud = attempt_marks({"created_at": "2026-01-01T00:00:00+00:00", "phases": {"started": 1767225602.0}})
    assert durations(cloud) == {"start": 2.0}


@given(st.lists(st.floats(0, 1e9), min_size=len(MARKS), max_size=len(MARKS)), st.sets(st.sampled_from(MARKS)))
def test_durations_of_ordered_marks_are_never_negative_and_only_for_present_ends(times, present):
    marks = {m: t for m, t in zip(MARKS, sorted(times), strict=True) if m in present}
    parse(marks)
    got = durations(marks)
    assert all(v >= 0 for v in got.values())
    assert all(PHASES[p][1] in marks for p in got)


def test_the_checkpoint_stall_and_the_gpu_busy_share_are_recorded_and_shown():
    record = parse({"first_step": 5.0, "generation_done": 15.0, "checkpoint_stall": 1.5, "gpu_busy": 0.8,
                    "gpu_busy_samples": 20})
    got = summary(attempt_marks({"phases": record}))
    assert got["durations"] == {"steps": 10.0, "checkpoint_stall": 1.5}
    assert got["gpu_busy"] == 0.8 and got["gpu_busy_samples"] == 20
    for bad in ({"checkpoint_stall": -1.0}, {"gpu_busy": 1.5}, {"gpu_busy_samples": 0.5}):
        with pytest.raises(ValueError):
            parse(bad)
