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
- a failed invocation is logged and counted (``errors``), not retried (EventBridge retries; the
  scheduler's timer is the backstop here);
- :meth:`stop` restores moto's method and ends the thread.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from gpufleet.local.background import EventedDelivery

log = logging.getLogger("gpufleet.devstack.events")


class AsyncEventDelivery(EventedDelivery):
    name = "event delivery"
    thread_name = "eventbridge-lambda-delivery"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, Any]] = {}  # function ARN -> latest event, in arrival order
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
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                with self._lock:
                    if not self._pending:
                        break
                    arn = next(iter(self._pending))
                    event = self._pending.pop(arn)
                self._invoke(arn, event)

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
