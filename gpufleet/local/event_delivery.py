"""EventBridge rules' Lambda targets invoked after the put, as EventBridge does (dev stack).

Why: moto 5.2.5 delivers a rule's matching events to log groups, archives, SQS queues and other buses,
and fails ``PutEvents`` (``NotImplementedError``) for a rule with a Lambda target. The template's
``SchedulerOnEvents`` rule (``JobPending``, ``CapacityFreed`` → the scheduler) then makes every such put
fail locally, and a job waits for the timer's pass.

Contract of :class:`AsyncEventDelivery` (a dev-stack component: ``start``/``stop``/``describe``):
- while started, a rule that matches an event remembers each Lambda target's function ARN; moto
  delivers its other targets as before (it is handed the rule without its Lambda targets);
- a background thread invokes each remembered function asynchronously (``InvocationType=Event``,
  through moto's Lambda backend, so the harness's Lambda runner runs it) with the matched event, in
  arrival order per function. Events that arrive for a function while an earlier one waits are
  delivered as one invocation with the latest event (a trigger: the scheduler reads the tables, not
  the event), so a burst costs one pass, not one per event; an event arriving during an invocation
  gets one more;
- with ``pace`` (the dev stack's: :data:`DEV_PACE`), a function's next invocation starts no sooner than
  ``pace`` times its last invocation's duration after that one ended (events meanwhile fold into it as
  above): a trigger whose work grows with the backlog (a scheduler pass reads every pending job) then takes
  at most ``1 / (1 + pace)`` of the time however fast events arrive, instead of running back to back; a
  quick invocation (a pass over a few jobs: tens of ms) delays the next by as little. On AWS the
  function's reserved concurrency and the async queue's retries space passes instead;
- a failed invocation is logged and counted (``errors``), not retried (EventBridge retries; the
  scheduler's timer is the backstop here);
- :meth:`stop` restores moto's method and ends the thread.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpufleet.local.background import EventedDelivery

log = logging.getLogger("gpufleet.devstack.events")

#: the dev stack's pace: a function's invocations take at most a third of the time (see the module docstring)
DEV_PACE = 2.0


class AsyncEventDelivery(EventedDelivery):
    name = "event delivery"
    thread_name = "eventbridge-lambda-delivery"

    def __init__(self, pace: float = 0.0) -> None:
        super().__init__()
        if pace < 0:
            raise ValueError(f"pace must be >= 0, not {pace}")
        self.pace = pace
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, Any]] = {}  # function ARN -> latest event, in arrival order
        self._not_before: dict[str, float] = {}  # function ARN -> monotonic time its next invocation may start
        self.invocations = 0

    def target(self) -> tuple[type, str]:
        from moto.events.models import Rule

        return Rule, "send_to_targets"

    def patch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        delivery = self

        def send_to_targets(rule: Any, original_event: Any, transform_input: bool = True) -> None:
            arns = [t["Arn"] for t in rule.targets if t["Arn"].startswith("arn:aws:lambda:")]
            others = copy.copy(rule)
            others.targets = [t for t in rule.targets if t["Arn"] not in arns]
            original(others, original_event, transform_input)
            if not arns or not rule.event_pattern.matches_event(original_event):
                return
            if arns:
                with delivery._lock:
                    for arn in arns:
                        delivery._pending.pop(arn, None)
                        delivery._pending[arn] = dict(original_event)
                delivery._wake.set()

        return send_to_targets

    def loop(self) -> None:
        timeout: float | None = None
        while not self._stop.is_set():
            self._wake.wait(timeout)
            self._wake.clear()
            timeout = None
            while not self._stop.is_set():
                with self._lock:
                    now = time.monotonic()
                    ready = [arn for arn in self._pending if self._not_before.get(arn, 0.0) <= now]
                    if not ready:  # nothing, or every pending function still paced: sleep until the first is due
                        if self._pending:
                            timeout = max(0.0, min(self._not_before[arn] for arn in self._pending) - now)
                        break
                    arn = ready[0]
                    event = self._pending.pop(arn)
                began = time.monotonic()
                self._invoke(arn, event)
                ended = time.monotonic()
                if self.pace:
                    self._not_before[arn] = ended + self.pace * (ended - began)

    def _invoke(self, arn: str, event: dict[str, Any]) -> None:
        from moto.awslambda.models import lambda_backends

        parts = arn.split(":")  # arn:aws:lambda:<region>:<account>:function:<name>[:qualifier]
        try:
            fn = lambda_backends[parts[4]][parts[3]].get_function(arn)
            fn.invoke(json.dumps(event, default=str), {"x-amz-invocation-type": "Event"}, {})
            self.invocations += 1
        except Exception as err:  # noqa: BLE001 - logged and counted; the scheduler's timer is the backstop
            self.errors += 1
            log.warning("event delivery to %s failed: %s", arn, err)
        self.batches += 1
