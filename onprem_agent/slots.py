"""GPU slot accounting on one node (pure; no I/O).

Contract:
- Each device has 1000 milli-GPUs. A request is ``(indices, milli)``: with
  ``milli >= 1000`` it takes ``ceil(milli / 1000)`` whole devices; below 1000 it
  takes ``milli`` of one device (fractional GPU, shared with other small jobs).
- When the placement names ``indices`` the job gets exactly those (the scheduler
  chose them); otherwise the allocator picks the best-fitting free devices, and for several whole GPUs
  the free set with the best common links when the node's NVML topology is known
  (:func:`gpufleet.topology.choose`; unknown: the lowest free indices).
- :meth:`GpuSlots.acquire` is all-or-nothing and returns ``None`` when the
  devices are busy right now (try again when a job ends); it raises
  :class:`gpufleet.errors.BadRequest` for a request this node can never satisfy.
- Holds never exceed capacity: the sum of milli held on a device is ≤ 1000.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.errors import BadRequest
from gpufleet.topology import Topology, choose

MILLI = 1000


@dataclass(frozen=True)
class Request:
    indices: tuple[int, ...] = ()
    milli: int = MILLI

    def per_device(self) -> int:
        return min(self.milli, MILLI)

    def device_count(self) -> int:
        return max(1, math.ceil(self.milli / MILLI))


class GpuSlots:
    def __init__(self, indices: list[int] | tuple[int, ...], topology: Topology | None = None) -> None:
        self._free: dict[int, int] = {i: MILLI for i in indices}
        self.topology = topology
        self._held: dict[str, dict[int, int]] = {}

    @property
    def indices(self) -> list[int]:
        return sorted(self._free)

    def free_milli(self) -> dict[int, int]:
        return dict(self._free)

    def whole_free(self) -> int:
        return sum(1 for m in self._free.values() if m == MILLI)

    def holders(self) -> list[str]:
        return list(self._held)

    def check(self, req: Request) -> None:
        """Raise BadRequest if ``req`` can never fit on this node."""
        if req.milli <= 0:
            raise BadRequest("a job needs a positive GPU share")
        unknown = [i for i in req.indices if i not in self._free]
        if unknown:
            raise BadRequest(f"placed on GPUs {unknown} that this node does not have")
        if req.indices and len(req.indices) != req.device_count():
            raise BadRequest(f"placement names {len(req.indices)} GPUs for a request of {req.milli} milli")
        if req.device_count() > len(self._free):
            raise BadRequest(f"request needs {req.device_count()} GPUs; this node has {len(self._free)}")

    def acquire(self, holder: str, req: Request) -> list[int] | None:
        """Reserve devices for ``holder``; ``None`` if they are busy now. Idempotent per holder."""
        if holder in self._held:
            return sorted(self._held[holder])
        self.check(req)
        need = req.per_device()
        if req.indices:
            chosen = list(req.indices)
            if any(self._free[i] < need for i in chosen):
                return None
        else:
            fits = [i for i, m in self._free.items() if m >= need]
            if len(fits) < req.device_count():
                return None
            if req.device_count() > 1:  # whole GPUs: the best-linked free set
                fits = list(choose(fits, req.device_count(), self.topology))
            # best fit: the fullest devices that still fit (keeps whole GPUs free for big jobs)
            fits.sort(key=lambda i: (self._free[i], i))
            chosen = sorted(fits[: req.device_count()])
        for i in chosen:
            self._free[i] -= need
        self._held[holder] = {i: need for i in chosen}
        return chosen

    def release(self, holder: str) -> list[int]:
        """Return ``holder``'s devices; releasing an unknown holder is a no-op."""
        held = self._held.pop(holder, {})
        for i, m in held.items():
            self._free[i] = min(MILLI, self._free[i] + m)
        return sorted(held)
