"""A tenant's webhook signing secrets and their rotation (pure).

Contract:
- A tenant has one *current* secret and, during a rotation's overlap window, the previous one with
  ``expires_at``. :func:`signing_secrets` is what a delivery signs with at ``now``: the current secret
  first, then every older one not yet expired (Standard Webhooks puts one ``v1,<sig>`` per secret in
  ``webhook-signature``, so a receiver that knows either secret verifies the delivery).
- :func:`rotated` makes ``new`` current and keeps the previous current one until ``now + overlap_s``
  (0: it stops signing at once); secrets already expired are dropped. ``overlap_s`` is bounded by
  :data:`MAX_OVERLAP_S`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufleet.errors import ValidationFailed

MAX_OVERLAP_S = 7 * 24 * 3600
DEFAULT_OVERLAP_S = 24 * 3600


@dataclass(frozen=True)
class WebhookKey:
    """One signing secret: ``id`` (``whk_…``), the ``secret`` (``whsec_…``), when it was made (epoch seconds) and,
    for a rotated-out secret, when it stops signing."""

    id: str
    secret: str
    created_at: float
    expires_at: float | None = None

    def live(self, now: float) -> bool:
        return self.expires_at is None or now < self.expires_at


def signing_secrets(keys: list[WebhookKey], now: float) -> list[str]:
    """The secrets a delivery at ``now`` is signed with: the current one first, then the overlapping ones."""
    live = [k for k in keys if k.live(now)]
    live.sort(key=lambda k: (k.expires_at is not None, -(k.expires_at or 0), -k.created_at))
    return [k.secret for k in live]


def current(keys: list[WebhookKey]) -> WebhookKey | None:
    found = [k for k in keys if k.expires_at is None]
    return max(found, key=lambda k: k.created_at) if found else None


def rotated(keys: list[WebhookKey], new: WebhookKey, now: float, overlap_s: int) -> list[WebhookKey]:
    """The keys after rotating to ``new`` (see the module contract)."""
    if not 0 <= overlap_s <= MAX_OVERLAP_S:
        raise ValidationFailed(f"overlap_seconds must be 0..{MAX_OVERLAP_S}", field="overlap_seconds")
    out = [new]
    for k in keys:
        if k.expires_at is None:
            k = replace(k, expires_at=now + overlap_s)
        if k.live(now) and k.id != new.id:
            out.append(k)
    return out
