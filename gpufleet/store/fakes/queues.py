"""In-memory :class:`~gpufleet.store.queues.MessageQueue`: one standard SQS queue on an injected clock.

What the code relies on, as SQS does it: a sent message is received once at a time; a receive hides it for the
visibility timeout and counts the receive (``ApproximateReceiveCount``); each receive hands out a new receipt
handle; :meth:`retry_later` (``ChangeMessageVisibility``) makes a received message visible again after the delay
(0: now; at most 12 hours); a handle that was never issued, or whose message was deleted, is refused as the
adapter refuses it (:class:`~gpufleet.errors.TransientError`). No ordering is promised (a standard queue).
:meth:`receive` and :meth:`delete` are the consumer's side (the Lambda event source's ReceiveMessage and
DeleteMessage), for tests.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from dataclasses import dataclass, field

from gpufleet.clock import Clock
from gpufleet.errors import TransientError

MAX_VISIBILITY_S = 12 * 3600


@dataclass(frozen=True)
class Received:
    message_id: str
    body: str
    receipt_handle: str
    receive_count: int


@dataclass
class _Message:
    message_id: str
    body: str
    visible_at: float = 0.0
    receive_count: int = 0
    handles: set[str] = field(default_factory=set)


class MemoryMessageQueue:
    def __init__(self, clock: Clock, url: str = "memory://queue", visibility_timeout_s: int = 30) -> None:
        self.clock = clock
        self.url = url
        self.visibility_timeout_s = visibility_timeout_s
        self._messages: dict[str, _Message] = {}
        self._lock = threading.Lock()
        self._seq = itertools.count(1)

    def send(self, body: str) -> str:
        with self._lock:
            message = _Message(str(uuid.uuid4()), body)
            self._messages[message.message_id] = message
            return message.message_id

    def _holding(self, handle: str) -> _Message:
        found = next((m for m in self._messages.values() if handle in m.handles), None)
        if found is None:
            raise TransientError(f"could not delay a message of {self.url}: ReceiptHandleIsInvalid")
        return found

    def retry_later(self, receipt_handle: str, delay_s: int) -> None:
        with self._lock:
            if not 0 <= delay_s <= MAX_VISIBILITY_S:
                raise TransientError(f"could not delay a message of {self.url}: InvalidParameterValue")
            self._holding(receipt_handle).visible_at = self.clock.now() + delay_s

    # ------------------------------------------------------------ the consumer's side

    def receive(self, max_messages: int = 10, visibility_timeout_s: int | None = None) -> list[Received]:
        """Up to ``max_messages`` visible messages, each hidden for the visibility timeout and counted."""
        hide = self.visibility_timeout_s if visibility_timeout_s is None else visibility_timeout_s
        now = self.clock.now()
        out = []
        with self._lock:
            for m in self._messages.values():
                if len(out) == max_messages:
                    break
                if m.visible_at > now:
                    continue
                m.visible_at, m.receive_count = now + hide, m.receive_count + 1
                handle = f"{m.message_id}#{next(self._seq)}"
                m.handles.add(handle)
                out.append(Received(m.message_id, m.body, handle, m.receive_count))
        return out

    def delete(self, receipt_handle: str) -> None:
        with self._lock:
            self._messages.pop(self._holding(receipt_handle).message_id)
