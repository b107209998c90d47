"""Whether a node may act on an attempt (pure): the decision the node API makes before every call.

Contract: :func:`check_assignment` raises, in this order,
- :class:`gpufleet.errors.NotAllowed` (403) when the attempt does not exist or its placement does not
  name ``node`` (its ``node`` or a gang member) — another node's attempt, or one never placed;
- :class:`gpufleet.errors.StaleEpoch` (409) when the attempt is this node's but ``epoch`` is not the
  job's ``current_epoch`` (an older attempt: the node was fenced off);
and returns ``None`` when the node may act. Ownership is decided first, so a node learns nothing
about the epochs of jobs that are not its own. The node id is the caller's identity, established by
the server from the request's IAM principal (:func:`gpufleet.nodeapi.identity.node_of`), never a
value the caller sends.

:func:`checked_key` keeps the pointers a node writes (checkpoint, generated output) inside the job's
own ``jobs/<job_id>/`` prefix (a key, or a prefix ending in ``/``: a container job's output directory).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gpufleet.errors import NotAllowed, StaleEpoch, ValidationFailed
from gpufleet.placement import Placement


def attempt_nodes(attempt: Mapping[str, Any] | None) -> frozenset[str] | None:
    """The nodes an attempt item's placement names, or ``None`` when there is no attempt item."""
    if attempt is None:
        return None
    placement = Placement.parse(attempt.get("placement"))
    return placement.nodes if placement is not None else frozenset()


def check_assignment(node: str, epoch: int, *, current_epoch: int, nodes: Collection[str] | None) -> None:
    """Refuse unless the attempt at ``epoch`` is assigned to ``node`` and ``epoch`` is current (see module)."""
    if not node or nodes is None or node not in nodes:
        raise NotAllowed(f"attempt {epoch} is not assigned to node {node!r}")
    if int(epoch) != int(current_epoch):
        raise StaleEpoch(f"epoch {epoch} is stale (current {current_epoch})", current_epoch=int(current_epoch))


def checked_key(job_id: str, key: Any, field: str) -> str:
    """``key`` if it is a plain key under ``jobs/<job_id>/``; otherwise :class:`ValidationFailed`."""
    prefix = f"jobs/{job_id}/"
    if not isinstance(key, str) or not key.startswith(prefix) or any(  # a trailing "/" names a prefix
            seg in ("", ".", "..") for seg in key[len(prefix):].removesuffix("/").split("/")):
        raise ValidationFailed(f"{field} must be a key under {prefix}", field=field)
    return key
