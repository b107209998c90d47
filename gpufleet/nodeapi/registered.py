"""Whether a node may still act: the attempt routes' registration check (deregistration ends access server-side).

Contract: :meth:`RegisteredNodes.check` raises :class:`~gpufleet.errors.NotAllowed` unless ``node`` has a
registration (``NODE#<id>`` / ``REGISTRATION``). A registration found is remembered for ``ttl_s`` seconds
(this process's clock), so a node's stream of attempt calls costs one read per ``ttl_s``; an absent one is
never remembered. So an operator's deregistration (``DELETE /v1/admin/nodes/{id}``) refuses every attempt call
of the node within ``ttl_s`` in every node API process, and its heartbeats and ``self`` at once (those read
the registration on every call). ``ttl_s`` 0 reads on every call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpufleet.clock import Clock
from gpufleet.errors import NotRegistered
from gpufleet.store.nodes import NodeStore

#: default seconds a found registration is trusted before it is read again
REGISTRATION_TTL_S = 5.0


@dataclass
class RegisteredNodes:
    nodes: NodeStore
    clock: Clock
    ttl_s: float = REGISTRATION_TTL_S
    _until: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, node: str) -> None:
        now = self.clock.now()
        with self._lock:
            if self._until.get(node, float("-inf")) > now:
                return
        if self.nodes.registration(node) is None:
            with self._lock:
                self._until.pop(node, None)
            raise NotRegistered(f"node {node!r} is not registered")
        with self._lock:
            self._until[node] = now + self.ttl_s
