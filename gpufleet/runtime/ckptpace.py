"""Pacing of asynchronous checkpoint uploads against an overhead budget (pure logic, no I/O).

An asynchronous upload still costs the compute loop something wherever the
writer's work shares the host with it: CPU cores (or SMT siblings), memory
bandwidth, the GIL. On a GPU host that cost is close to nothing and every
snapshot can be uploaded; on a CPU-bound host, uploading every step can slow
the loop by half. :class:`UploadPacer` measures that cost on the loop itself
and spaces uploads so that it stays within a budget (CheckFreq's idea, online);
what adapts is how far the recovery point lags, never the step time.

Contract (the caller serialises calls; the clock is injectable for tests):
- The loop calls :meth:`tick` once after every step. The first tick starts
  the clock; each later one times the step since the previous tick and
  classifies it *overlapped* when an upload was in flight at any moment
  during it, else *clean*.
- Baseline = lower quartile of the last ``window`` clean steps: timing noise
  only ever adds time (another tenant, a frequency dip), so the low end is
  the loop's undisturbed step time. Each overlapped step is charged
  ``duration - baseline`` (signed), the time the upload cost the loop.
  Every step earns ``budget * duration`` of credit. Credit is capped at
  ``budget * window * baseline`` so a long quiet stretch cannot fund a burst.
- :meth:`may_start` is true when the credit is not negative (pay after:
  an upload's cost is known only once it has overlapped the loop), the last
  step was clean (so the baseline keeps being measured between uploads) and
  ``min_clean`` clean steps have been seen; and in any case once
  ``max_lag_s`` has passed since the last upload started, so the recovery
  point never lags longer than that. ``budget <= 0`` disables pacing.
- Bound: over any run, the charged cost is at most ``budget`` times the loop
  time plus the cost of one upload plus what the max-lag rule forces.
- The writer calls :meth:`started` when an upload begins and :meth:`finished`
  when it ends; at most one upload is in flight.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable


class UploadPacer:
    def __init__(self, budget: float, max_lag_s: float, clock: Callable[[], float] = time.monotonic,
                 window: int = 16, min_clean: int = 1) -> None:
        if budget < 0 or max_lag_s <= 0 or window < 1 or not 1 <= min_clean <= window:
            raise ValueError("budget must be >= 0, max_lag_s > 0 and 1 <= min_clean <= window")
        self.budget = budget
        self.max_lag_s = max_lag_s
        self.clock = clock
        self.window = window
        self.min_clean = min_clean
        self.credit = 0.0
        self.charged = 0.0  # total loop seconds attributed to uploads
        self.loop_s = 0.0  # total loop seconds seen
        self.forced = 0  # uploads started by the max-lag rule while in debt
        self._clean: deque[float] = deque(maxlen=window)
        self._inflight = False
        self._overlap = False
        self._last_clean = False
        self._last_tick: float | None = None
        self._last_start = clock()

    @property
    def baseline(self) -> float | None:
        """Lower quartile of the durations of recent clean steps (None before the first)."""
        if len(self._clean) < 2:
            return self._clean[0] if self._clean else None
        return statistics.quantiles(self._clean, n=4, method="inclusive")[0]

    def tick(self) -> None:
        """A loop step just ended."""
        now = self.clock()
        last, self._last_tick = self._last_tick, now
        overlapped, self._overlap = self._overlap, self._inflight
        self._last_clean = not overlapped
        if last is None:
            return  # the first tick only starts the clock
        duration = max(0.0, now - last)
        self.loop_s += duration
        if overlapped:
            base = self.baseline
            cost = duration - base if base is not None else 0.0
            self.credit -= cost
            self.charged += cost
        else:
            self._clean.append(duration)
        self.credit += self.budget * duration
        base = self.baseline
        if base is not None:
            self.credit = min(self.credit, self.budget * self.window * base)

    def may_start(self) -> bool:
        """Whether an upload may begin now (see the module contract)."""
        if self.budget <= 0:
            return True
        if self.clock() - self._last_start >= self.max_lag_s:
            return True
        return self._budget_allows()

    def _budget_allows(self) -> bool:
        return len(self._clean) >= self.min_clean and self._last_clean and self.credit >= 0.0

    def started(self) -> None:
        if self.budget > 0 and not self._budget_allows():
            self.forced += 1  # allowed by the max-lag rule (or forced by a flush), not by the budget
        self._inflight = self._overlap = True
        self._last_start = self.clock()

    def finished(self) -> None:
        self._inflight = False

    def seconds_until_lag(self) -> float:
        """Seconds until the max-lag rule allows an upload regardless of credit (0 if it does now)."""
        return max(0.0, self.max_lag_s - (self.clock() - self._last_start))


def blocked_wait_s(pacer: UploadPacer | None) -> float | None:
    """How long a writer whose pending snapshot the pacer holds back sleeps before looking again: until
    the max-lag rule fires (a ``tick`` that lets the upload start wakes it sooner); None (until
    notified) without a pacer."""
    return None if pacer is None else max(0.01, pacer.seconds_until_lag())
