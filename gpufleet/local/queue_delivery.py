"""SQS → Lambda event-source mappings delivered after the send, as Lambda's pollers do (dev stack).

Why: moto invokes a queue's Lambda event-source mappings synchronously inside ``SendMessage``. In
the dev stack's server mode the in-process Lambda runner serialises invocations with a lock
(:mod:`gpufleet.local.lambda_runner`), so a Lambda that sends to such a queue over HTTP (Notify →
the webhook queue → the webhook sender) waits for its ``SendMessage`` while the consumer waits for
the lock held by the sender: a deadlock.

Contract of :class:`AsyncQueueDelivery` (a dev-stack component: ``start``/``stop``/``describe``):
- while started, ``SendMessage`` only enqueues (moto's ``Queue.add_message`` runs with the queue's
  mappings hidden, under a lock); the queue is remembered;
- a background thread polls every remembered queue each ``poll_s``: for each enabled mapping it
  receives up to ``BatchSize`` visible messages (delayed ones only once their delay is over) and
  invokes the function with them; a batch the function processed is deleted, a failed one stays
  invisible for the queue's visibility timeout and is then delivered again (the redrive policy's
  dead-letter queue applies as in AWS);
- :meth:`stop` restores moto's method and ends the thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpufleet.local.background import EventedDelivery

log = logging.getLogger("gpufleet.devstack.queues")


class AsyncQueueDelivery(EventedDelivery):
    name = "queue delivery"
    thread_name = "sqs-lambda-delivery"

    def __init__(self, poll_s: float = 0.2) -> None:
        super().__init__()
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._queues: dict[int, Any] = {}

    def target(self) -> tuple[type, str]:
        from moto.sqs.models import Queue

        return Queue, "add_message"

    def patch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        delivery = self

        def add_message(queue: Any, message: Any) -> None:
            with delivery._lock:
                mappings = queue.lambda_event_source_mappings
                queue.lambda_event_source_mappings = {}
                try:
                    original(queue, message)
                finally:
                    queue.lambda_event_source_mappings = mappings
                if mappings:
                    delivery._queues[id(queue)] = queue
            if mappings:
                delivery._wake.set()

        return add_message

    def loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            with self._lock:
                queues = list(self._queues.values())
            for queue in queues:
                if self._stop.is_set():
                    return
                self._drain(queue)

    def _drain(self, queue: Any) -> None:
        from moto.awslambda.utils import get_backend
        from moto.sqs.models import sqs_backends

        backend = sqs_backends[queue.account_id][queue.region]
        for arn, mapping in list(queue.lambda_event_source_mappings.items()):
            if not mapping.enabled:
                continue
            while not self._stop.is_set():
                messages = backend.receive_message(queue.name, mapping.batch_size, 0, queue.visibility_timeout)
                if not messages:
                    break
                try:
                    ok = get_backend(queue.account_id, arn.split(":")[3]).send_sqs_batch(arn, messages, queue.queue_arn)
                except Exception as err:  # noqa: BLE001 - logged and counted; the messages come back later
                    self.errors += 1
                    log.exception("delivery from %s to %s failed: %s", queue.name, arn, err)
                    ok = False
                self.batches += 1
                if not ok:
                    break  # the batch reappears after the visibility timeout, as in AWS
                for m in messages:
                    backend.delete_message(queue.name, m.receipt_handle)
