"""A gang attempt's member states and the verdict the node API draws from them (pure).

Contract (the attempt item of a gang, written by :class:`gpufleet.store.runs.DynamoRunStore`):
- ``gang``: member node → ``dispatched`` (RunOnPrem's dispatch sent its envelope) → ``ready`` (its agent
  holds its GPUs and heartbeats: it waits at the start barrier) → ``succeeded``; ``gang_ready`` and
  ``gang_succeeded`` count the moves (each move is conditional on the member's previous state, so each
  member counts once); ``gang_beats``: member node → its last heartbeat (epoch seconds);
  ``gang_gpu_seconds``: the sum of the members' reported GPU-seconds; ``gang_failed``:
  ``{"node", "reason"}`` of the first failure (set once).
- :attr:`GangState.released`: every member is ready (or already done) — the barrier opens and every
  member's agent starts its process. Never earlier, so a gang is never partially started.
- :func:`members_view`: each member's ``{"node", "rank", "gpus", "state"}`` (``GET /v1/jobs/{id}``'s
  ``members``, shown by ``gpufleet status``): ``state`` is the member state above, except that once the gang
  failed the member it blames is ``failed`` and every other member not ``succeeded`` is ``stopped``.
- :func:`verdict` says why the gang must fail now, or ``None``: the barrier is still closed
  ``barrier_timeout_s`` after dispatch (a member never arrived: the whole gang is released and retried),
  or, once released, a running member has been silent for ``silence_s`` (its agent or host died).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.placement import Placement

DISPATCHED, READY, SUCCEEDED = "dispatched", "ready", "succeeded"
#: attempt-item attributes of a gang (what the node API reads and writes besides the single-node ones)
GANG_FIELDS = ("gang", "gang_ready", "gang_succeeded", "gang_beats", "gang_gpu_seconds", "gang_failed")


@dataclass(frozen=True)
class GangState:
    nodes: tuple[str, ...]
    states: Mapping[str, str] = field(default_factory=dict)
    beats: Mapping[str, float] = field(default_factory=dict)
    dispatched_at: float | None = None
    failed: Mapping[str, Any] | None = None
    #: member node → the GPU indices it was placed on
    gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, attempt: Mapping[str, Any] | None) -> GangState | None:
        """The gang of an attempt item, or ``None`` for a single-node attempt."""
        p = Placement.parse((attempt or {}).get("placement"))
        if p is None or not p.members or len(p.members) < 2:
            return None
        a = attempt or {}
        at = a.get("dispatched_at")
        return cls(nodes=tuple(str(m.node) for m in p.members),
                   states={str(k): str(v) for k, v in (a.get("gang") or {}).items()},
                   beats={str(k): float(v) for k, v in (a.get("gang_beats") or {}).items()},
                   dispatched_at=float(at) if at is not None else None, failed=a.get("gang_failed") or None,
                   gpus={str(m.node): tuple(int(i) for i in m.gpu_indices) for m in p.members})

    def state(self, node: str) -> str:
        return self.states.get(node, DISPATCHED)

    @property
    def released(self) -> bool:
        return all(self.state(n) in (READY, SUCCEEDED) for n in self.nodes)

    def rank(self, node: str) -> int:
        return self.nodes.index(node)


def members_view(g: GangState) -> list[dict[str, Any]]:
    """Each member, rank order: ``{"node", "rank", "gpus", "state"}`` (see module)."""

    def state(n: str) -> str:
        s = g.state(n)
        if g.failed and s != SUCCEEDED:
            return "failed" if n == str(g.failed.get("node")) else "stopped"
        return s

    return [{"node": n, "rank": r, "gpus": list(g.gpus.get(n, ())), "state": state(n)} for r, n in enumerate(g.nodes)]


def culprits(g: GangState, now: float, *, silence_s: float) -> list[str]:
    """The members to blame: those not ready at a closed barrier, else the silent running ones (the
    failure's ``node``, so the retry avoids them rather than the member that noticed)."""
    if not g.released:
        return [n for n in g.nodes if g.state(n) == DISPATCHED]
    return [n for n in g.nodes if g.state(n) == READY and now - g.beats.get(n, now) > silence_s]


def verdict(g: GangState, now: float, *, silence_s: float, barrier_timeout_s: float) -> str | None:
    """Why the gang must fail at ``now`` (see module), or ``None``."""
    if g.failed:
        return str(g.failed.get("reason") or "a member failed")
    if not g.released:
        if g.dispatched_at is not None and now - g.dispatched_at > barrier_timeout_s:
            missing = culprits(g, now, silence_s=silence_s)
            return f"start barrier timed out after {barrier_timeout_s:g}s; not ready: {', '.join(missing)}"
        return None
    silent = culprits(g, now, silence_s=silence_s)
    if silent:
        return f"gang member silent for over {silence_s:g}s: {', '.join(silent)}"
    return None
