"""Contract of :class:`gpufleet.store.queues.MessageQueue` (a standard SQS queue), on the fake and on moto, both on
an injected clock.

What the webhook sender and the on-prem dispatch rely on: a sent message is received once at a time (a receive
hides it for the visibility timeout and counts the receive, with a new receipt handle each time);
``retry_later`` makes a received message visible again after its delay; a deleted message never comes back; a
handle that names no message in flight, or a delay beyond 12 hours, is a TransientError. No order is promised.
"""

from __future__ import annotations

import pytest
from store_backends import QUEUE_VISIBILITY_S

from gpufleet.errors import TransientError


def _visible(side) -> list[tuple[str, int]]:
    """(body, receive count) of every message visible now (each is hidden again by this receive)."""
    return sorted((m.body, m.receive_count) for m in side.receive())


def test_a_received_message_is_hidden_for_the_visibility_timeout(queue_side, clock):
    ids = {queue_side.queue.send("a"), queue_side.queue.send("b")}
    assert len(ids) == 2 and "" not in ids
    first = queue_side.receive()
    assert sorted((m.body, m.receive_count) for m in first) == [("a", 1), ("b", 1)]
    assert {m.message_id for m in first} == ids
    assert queue_side.receive() == []
    clock.advance(QUEUE_VISIBILITY_S - 1)
    assert queue_side.receive() == []
    clock.advance(2)
    again = queue_side.receive()
    assert sorted((m.body, m.receive_count) for m in again) == [("a", 2), ("b", 2)]
    assert not {m.receipt_handle for m in again} & {m.receipt_handle for m in first}


def test_retry_later_redelivers_after_the_delay(queue_side, clock):
    queue_side.queue.send("a")
    (m,) = queue_side.receive()
    queue_side.queue.retry_later(m.receipt_handle, 0)  # now (a clock that stands still: a millisecond later)
    clock.advance(0.001)
    (m,) = queue_side.receive()
    assert m.receive_count == 2
    queue_side.queue.retry_later(m.receipt_handle, 120)  # longer than the queue's timeout
    clock.advance(QUEUE_VISIBILITY_S + 1)
    assert queue_side.receive() == []
    clock.advance(120 - QUEUE_VISIBILITY_S - 2)
    assert queue_side.receive() == []
    clock.advance(2)
    assert _visible(queue_side) == [("a", 3)]


def test_a_deleted_message_never_comes_back_and_bad_handles_are_refused(queue_side, clock):
    queue_side.queue.send("a")
    queue_side.queue.send("b")
    received = {m.body: m for m in queue_side.receive()}
    queue_side.delete(received["a"].receipt_handle)
    with pytest.raises(TransientError):  # its message is gone
        queue_side.queue.retry_later(received["a"].receipt_handle, 0)
    with pytest.raises(TransientError):
        queue_side.queue.retry_later("not-a-receipt-handle", 0)
    with pytest.raises(TransientError):  # beyond SQS's 12 hours
        queue_side.queue.retry_later(received["b"].receipt_handle, 12 * 3600 + 1)
    clock.advance(QUEUE_VISIBILITY_S + 1)
    assert _visible(queue_side) == [("b", 2)]
