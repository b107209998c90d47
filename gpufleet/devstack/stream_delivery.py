"""Deliver DynamoDB stream records to Lambda after the write, as AWS's stream pollers do.

moto 5.2.5 invokes a table's stream event-source mappings synchronously inside the write
request, once per item — in a ``TransactWriteItems`` that is *before* the transaction's other
items exist. The jobs table's stream is gpufleet's transactional outbox, so with moto's
behaviour the workflow can start (and CheckPrompt read the job) before the job is committed,
and the API request waits for every Lambda the stream triggers.

:class:`AsyncStreamDelivery` (a context manager / component; it lives with the other moto patches in
:mod:`gpufleet.local.moto_patches` and is re-exported here for the dev stack) replaces
``moto.dynamodb.models.table.StreamShard.add`` so that a write only appends its record; a
background thread delivers each shard's records in order, in batches, once no new record has
arrived for ``settle_s`` (the write, or the whole transaction, has returned). Delivered
records are removed from the shard as moto does. :meth:`stop` delivers what is pending and
restores moto. ``tests/functional/cli/test_devstack_streams.py`` fails if moto's own behaviour
changes (so the patch can go).
"""

from __future__ import annotations

from gpufleet.local.moto_patches import AsyncStreamDelivery

__all__ = ["AsyncStreamDelivery"]
