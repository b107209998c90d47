"""CloudWatch embedded metric format (EMF): one JSON log line per data point group, pure.

Contract:
- :func:`record` builds the EMF document of one metric (:class:`~gpufleet.metrics.catalog.MetricDef`)
  with one value or a list of values (at most :data:`MAX_VALUES`; CloudWatch computes percentiles over
  them) and the dimensions its ``dimension_sets`` name — exactly those: a missing or extra
  dimension, an empty dimension value or too many values is a ``ValueError`` (a programming error,
  never data).
- :class:`Metrics` writes records as single lines to a writer (default: the process's current
  ``sys.stdout``, looked up at every write, flushed), which in a Lambda is the function's CloudWatch
  Logs stream; CloudWatch extracts the metrics from it (no ``PutMetricData``, no IAM grant). A write
  failure is logged and swallowed: metrics never fail the code path they describe.
- :meth:`Metrics.log` writes a plain structured log line (``{"event": ..., **fields}``, no metrics) to
  the same writer: reports that belong next to their metrics (the scheduler pass's).
- :class:`RecordingMetrics` keeps the records in memory (tests, the simulator).
- :func:`parse_line` reads a line back (``None`` if it is not EMF); the acceptance test and the
  local tools use it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpufleet.metrics.catalog import NAMESPACE, MetricDef

MAX_VALUES = 100
_log = logging.getLogger(__name__)


def record(metric: MetricDef, value: float | Iterable[float], dims: Mapping[str, str] | None = None, *,
           timestamp_ms: int | None = None) -> dict[str, Any]:
    """The EMF document of ``metric`` = ``value`` under ``dims`` (see module contract)."""
    dims = dict(dims or {})
    given, wanted = set(dims), set(metric.dimension_names)
    if given != wanted:
        raise ValueError(f"{metric.name} takes dimensions {sorted(wanted)}, got {sorted(given)}")
    for k, v in dims.items():
        if not isinstance(v, str) or not v:
            raise ValueError(f"{metric.name}: dimension {k} needs a non-empty string, got {v!r}")
    values: float | list[float]
    if isinstance(value, int | float):
        values = float(value)
    else:
        values = [float(v) for v in value]
        if not values or len(values) > MAX_VALUES:
            raise ValueError(f"{metric.name}: 1..{MAX_VALUES} values per record, got {len(values)}")
    ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    return {
        "_aws": {
            "Timestamp": ts,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [list(ds) for ds in metric.dimension_sets],
                "Metrics": [{"Name": metric.name, "Unit": metric.unit}],
            }],
        },
        **dims,
        metric.name: values,
    }


def parse_line(line: str) -> list[tuple[str, str, frozenset[tuple[str, str]], list[float]]]:
    """``[(namespace, metric name, dimension set as (name, value) pairs, values)]`` of one EMF line
    (one entry per metric and dimension set it publishes); ``[]`` for any other line."""
    line = line.strip()
    if not line.startswith("{") or '"_aws"' not in line:
        return []
    try:
        doc = json.loads(line)
        out = []
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for m in directive["Metrics"]:
                raw = doc[m["Name"]]
                values = [float(v) for v in raw] if isinstance(raw, list) else [float(raw)]
                for ds in directive["Dimensions"]:
                    pairs = frozenset((d, str(doc[d])) for d in ds)
                    out.append((directive["Namespace"], m["Name"], pairs, values))
        return out
    except (ValueError, KeyError, TypeError):
        return []


class Metrics:
    """Writes EMF lines (see module contract). ``write``: a function taking one line (no newline)."""

    def __init__(self, write: Callable[[str], None] | None = None) -> None:
        self._write = write

    def _emit(self, line: str) -> None:
        if self._write is not None:
            self._write(line)
            return
        out = sys.stdout
        out.write(line + "\n")
        out.flush()

    def put(self, metric: MetricDef, value: float | Iterable[float], dims: Mapping[str, str] | None = None) -> None:
        doc = record(metric, value, dims)  # a ValueError here is the caller's bug: let it surface
        try:
            self._emit(json.dumps(doc, separators=(",", ":")))
        except (OSError, ValueError) as err:  # a closed or broken stream must not fail the job's step
            _log.warning("metric %s not written: %s", metric.name, err)


    def log(self, event: str, fields: Mapping[str, Any]) -> None:
        try:
            self._emit(json.dumps({"event": event, **fields}, separators=(",", ":"), default=str))
        except (OSError, ValueError) as err:
            _log.warning("log line %s not written: %s", event, err)


class RecordingMetrics(Metrics):
    """Keeps every record in :attr:`records` (and :attr:`lines`) instead of writing them."""

    def __init__(self) -> None:
        super().__init__(write=self._keep)
        self.lines: list[str] = []

    def _keep(self, line: str) -> None:
        self.lines.append(line)

    @property
    def events(self) -> list[dict[str, Any]]:
        """The :meth:`log` lines, parsed."""
        return [d for d in (json.loads(x) for x in self.lines) if "event" in d and "_aws" not in d]

    @property
    def records(self) -> list[tuple[str, str, frozenset[tuple[str, str]], list[float]]]:
        return [r for line in self.lines for r in parse_line(line)]

    def values(self, name: str, **dims: str) -> list[float]:
        """Every value of ``name`` published under exactly ``dims``."""
        want = frozenset(dims.items())
        return [v for _, n, d, vs in self.records if n == name and d == want for v in vs]
