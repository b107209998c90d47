"""Deliver DynamoDB stream records to Lambda after the write, as AWS's stream pollers do.

moto 5.2.5 invokes a table's stream event-source mappings synchronously inside the write
request, once per item — in a ``TransactWriteItems`` that is *before* the transaction's other
items exist. The jobs table's stream is gpufleet's transactional outbox, so with moto's
behaviour the workflow can start (and CheckPrompt read the job) before the job is committed,
and the API request waits for every Lambda the stream triggers.

:class:`AsyncStreamDelivery` (a context manager / component) replaces
``moto.dynamodb.models.table.StreamShard.add`` so that a write only appends its record; a
background thread delivers each shard's records in order, in batches, once no new record has
arrived for ``settle_s`` (the write, or the whole transaction, has returned). Delivered
records are removed from the shard as moto does. :meth:`stop` delivers what is pending and
restores moto. ``tests/functional/cli/test_devstack_streams.py`` fails if moto's own behaviour
changes (so the patch can go).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("gpufleet.devstack.streams")


class AsyncStreamDelivery:
    name = "stream delivery"

    def __init__(self, settle_s: float = 0.05) -> None:
        self.settle_s = settle_s
        self._cond = threading.Condition()
        self._pending: dict[int, Any] = {}
        self._stop = False
        self._thread: threading.Thread | None = None
        self._original: Any = None
        self.batches = 0
        self.errors = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> AsyncStreamDelivery:
        from moto.dynamodb.models.table import StreamRecord, StreamShard

        self._original = StreamShard.__dict__["add"]
        delivery = self

        def add(shard: Any, old: Any, new: Any) -> None:
            view = shard.table.stream_specification["StreamViewType"]
            event = "INSERT" if old is None else ("REMOVE" if new is None else "MODIFY")
            with delivery._cond:
                seq = len(shard.items) + shard.starting_sequence_number
                shard.items.append(StreamRecord(shard.table, view, event, old, new, seq))
                delivery._pending[id(shard)] = shard
                delivery._cond.notify()

        StreamShard.add = add
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="dynamodb-stream-delivery", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self._original is not None:
            from moto.dynamodb.models.table import StreamShard

            StreamShard.add = self._original
            self._original = None

    def __enter__(self) -> AsyncStreamDelivery:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def describe(self) -> dict[str, str]:
        return {}

    # ------------------------------------------------------------------ delivery
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if not self._pending and self._stop:
                    return
                # settle: wait until no record has arrived for settle_s
                while True:
                    seen = sum(len(s.items) for s in self._pending.values())
                    self._cond.wait(self.settle_s)
                    if sum(len(s.items) for s in self._pending.values()) == seen:
                        break
                shards, self._pending = list(self._pending.values()), {}
            for shard in shards:
                self._deliver(shard)

    def _deliver(self, shard: Any) -> None:
        from moto.awslambda.utils import get_backend

        with self._cond:
            batch = list(shard.items)
        if not batch:
            return
        delivered = False
        for arn, esm in list(shard.table.lambda_event_source_mappings.items()):
            region = arn.split(":")[3]
            try:
                result = get_backend(shard.account_id, region).send_dynamodb_items(arn, batch, esm.event_source_arn)
            except Exception as err:  # noqa: BLE001 - logged and counted; moto drops failed batches too
                self.errors += 1
                log.exception("stream delivery to %s failed: %s", arn, err)
                continue
            delivered = delivered or bool(result)
        self.batches += 1
        if delivered:
            with self._cond:
                del shard.items[: len(batch)]
