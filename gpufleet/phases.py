"""Phase timings of an attempt: a fixed vocabulary of marks, how they are recorded and what they mean (pure).

Contract:
- A *mark* is the wall-clock time (epoch seconds) at which an attempt reached a phase boundary, in the
  order of :data:`MARKS`: ``placed`` (the scheduler committed it; the attempt item's ``created_at``),
  ``dispatched`` (RunOnPrem sent the envelope; on-prem only), then the runtime's own — ``started``
  (the stage's process began), ``inputs_staged``, ``model_loaded``, ``first_step`` (the first
  denoising step done), ``generation_done`` (output persisted). Not every attempt has every mark
  (no inputs, a cloud run, a stop before the end).
- The runtime records its marks with the details :data:`DETAILS` (``model_cache`` ``hit``/``miss``, or
  ``resident`` when a warm worker had the model loaded: then there is no ``model_loaded`` mark and no
  ``model_load`` phase, and ``first_step`` runs from the last earlier mark,
  ``model_bytes`` fetched, ``steps`` run, ``mean_step_s``; ``gpu_busy``, the share of the compute loop's
  time the attempt's GPUs were busy as NVML sampled it, with ``gpu_busy_samples``: absent when not
  measured, on a CPU or without NVML, never guessed, :mod:`gpufleet.runtime.gpuutil`) and
  ``batch_members`` / ``batch_gpu_s`` (a job that ran in a denoising batch: the most members a round of
  its had, and its share of the rounds' GPU time, :mod:`gpufleet.batching`) and
  ``checkpoint_stall`` (:data:`STALL_PHASE`: the seconds the compute loop waited on checkpoints, taking a
  snapshot, a synchronous upload or draining the writer, :class:`gpufleet.runtime.checkpoint.LoopCheckpoints`)
  as ``phases`` on its attempt item, in one
  fenced write when the generate stage ends (``gpufleet.store.jobitem.JobItem.record_attempt``; on an
  on-prem node through the node API's ``phases`` operation). :func:`parse` validates such a record
  (unknown names, non-numbers and out-of-order marks are refused: a ``ValueError``).
- :func:`durations` turns marks into the seconds of each :data:`PHASES` entry, a phase lasting from
  its start mark to its end mark when both are present: ``queued`` is not here (the job's
  ``pending_since`` to ``placed`` is the scheduler's ``QueueWaitSeconds``). The recorded
  ``checkpoint_stall`` is a phase of its own there (it lies within ``steps``, at no recorded moment).
- ``finalize`` (:data:`FINALIZE_PHASE`) is timed by the control plane, from CompleteRun to Publish.
- :func:`attempt_marks` reads every mark off an attempt item; :func:`summary` is what CompleteRun puts
  in the FINALIZING status event's ``detail.phases`` (so ``/events`` and ``gpufleet events`` show it)
  and emits as ``PhaseSeconds`` by ``Phase`` (:mod:`gpufleet.metrics.catalog`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from gpufleet.clock import epoch_seconds

MARKS = ("placed", "dispatched", "started", "inputs_staged", "model_loaded", "first_step", "generation_done")
#: runtime details recorded with the marks: name -> type
DETAILS: dict[str, type] = {"model_cache": str, "model_bytes": int, "steps": int, "mean_step_s": float,
                            "gpu_busy": float, "gpu_busy_samples": int, "batch_members": int, "batch_gpu_s": float}
MODEL_CACHE = ("hit", "miss", "resident")

#: the seconds the compute loop waited on checkpoints: recorded as a total, a phase within ``steps``
STALL_PHASE = "checkpoint_stall"
#: recorded values that are seconds or shares (floats)
_FLOATS = ("mean_step_s", "gpu_busy", "batch_gpu_s", STALL_PHASE)

#: phase -> (start mark, end mark); several starts: the first present one
PHASES: dict[str, tuple[tuple[str, ...], str]] = {
    "dispatch": (("placed",), "dispatched"),
    "start": (("dispatched", "placed"), "started"),
    "staging": (("started",), "inputs_staged"),
    "model_load": (("inputs_staged", "started"), "model_loaded"),
    "first_step": (("model_loaded", "inputs_staged", "started"), "first_step"),
    "steps": (("first_step",), "generation_done"),
    "run": (("started",), "generation_done"),
}


#: the phase the control plane times itself: CompleteRun (FINALIZING) to Publish (finalize stage or output
#: collection, and publishing); not a runtime mark
FINALIZE_PHASE = "finalize"
#: every phase name (the ``Phase`` dimension of ``PhaseSeconds``)
PHASE_NAMES = (*PHASES, STALL_PHASE, FINALIZE_PHASE)


def parse(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A validated phases record (see module contract)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name in MARKS or name in _FLOATS:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
                raise ValueError(f"phase {name} must be a number, got {value!r}")
            if float(value) < 0:
                raise ValueError(f"phase {name} must not be negative")
            if name == "gpu_busy" and float(value) > 1:
                raise ValueError("gpu_busy is a share: at most 1")
            out[name] = float(value)
        elif name in ("model_bytes", "steps", "gpu_busy_samples", "batch_members"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
            out[name] = int(value)
        elif name == "model_cache":
            if value not in MODEL_CACHE:
                raise ValueError(f"model_cache must be one of {MODEL_CACHE}, got {value!r}")
            out[name] = value
        else:
            raise ValueError(f"unknown phase {name!r}; known: {MARKS + tuple(DETAILS) + (STALL_PHASE,)}")
    present = [out[m] for m in MARKS if m in out]
    if present != sorted(present):
        raise ValueError("phase marks must not go back in time")
    return out


def durations(marks: Mapping[str, Any]) -> dict[str, float]:
    """Seconds of each phase whose start and end marks are both in ``marks`` (see :data:`PHASES`)."""
    out: dict[str, float] = {}
    for phase, (starts, end) in PHASES.items():
        start = next((marks[s] for s in starts if s in marks), None)
        if start is not None and end in marks:
            out[phase] = max(0.0, float(marks[end]) - float(start))
    if isinstance(marks.get(STALL_PHASE), int | float):
        out[STALL_PHASE] = float(marks[STALL_PHASE])
    return out


def attempt_marks(attempt: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every mark and detail of an attempt item: ``placed`` (its ``created_at``, ISO 8601), ``dispatched``
    (``dispatched_at``) and the runtime's ``phases`` record. Unreadable values are left out."""
    if not attempt:
        return {}
    out: dict[str, Any] = {}
    created = attempt.get("created_at")
    if isinstance(created, str) and (placed := epoch_seconds(created)) is not None:
        out["placed"] = placed
    if attempt.get("dispatched_at") is not None:
        out["dispatched"] = float(attempt["dispatched_at"])
    for k, v in (attempt.get("phases") or {}).items():
        out[k] = float(v) if k in MARKS or k in _FLOATS else int(v) if k in DETAILS and DETAILS[k] is int else v
    return out


def summary(marks: Mapping[str, Any]) -> dict[str, Any]:
    """What an attempt's timeline shows: ``durations`` (seconds per phase, rounded to ms) and the details."""
    out: dict[str, Any] = {"durations": {k: round(v, 3) for k, v in durations(marks).items()}}
    for k in DETAILS:
        if k in marks:
            out[k] = round(marks[k], 3) if isinstance(marks[k], float) else marks[k]
    return out


class PhaseRecorder:
    """Collects an attempt's runtime marks and details against ``now`` (a clock's ``now``)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.record: dict[str, Any] = {}

    def mark(self, name: str, **details: Any) -> None:
        """Mark ``name`` now (once: a later mark of the same name is ignored), with ``details``."""
        if name not in MARKS:
            raise ValueError(f"unknown phase mark {name!r}")
        self.record.setdefault(name, float(self._now()))
        self.record.update(details)

    def as_item(self) -> dict[str, Any]:
        return parse(self.record)
