"""In-memory :class:`~gpufleet.store.credentials.CredentialVendor`: each vend is recorded (the role session name as
the STS adapter sends it, :func:`~gpufleet.store.credentials.role_session_name`, and the session policy) and
answered with fresh keys expiring ``duration_s`` after the clock's now."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from gpufleet.clock import Clock
from gpufleet.store.credentials import role_session_name


@dataclass(frozen=True)
class Vend:
    role_arn: str
    session_name: str
    policy: dict[str, Any]
    duration_s: int


@dataclass
class MemoryCredentialVendor:
    clock: Clock
    role_arn: str
    duration_s: int = 3600
    vended: list[Vend] = field(default_factory=list)

    def vend(self, *, session_name: str, policy: dict[str, Any]) -> dict[str, Any]:
        self.vended.append(Vend(self.role_arn, role_session_name(session_name), policy, self.duration_s))
        return {
            "access_key_id": "ASIA" + secrets.token_hex(8).upper(),
            "secret_access_key": secrets.token_urlsafe(30),
            "session_token": secrets.token_urlsafe(64),
            "expiration": self.clock.now() + self.duration_s,
        }
