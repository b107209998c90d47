"""Per-attempt object credentials for on-prem runtimes: ``sts:AssumeRole`` with a session policy.

Contract: :class:`StsCredentialVendor` assumes the node-job role (``role_arn``) with the inline
session policy it is given (:func:`gpufleet.nodeapi.scope.session_policy`), a session name naming the
node and the attempt, and ``duration_s``; it returns ``{"access_key_id", "secret_access_key",
"session_token", "expiration"}`` (expiration as epoch seconds). AWS errors become
:mod:`gpufleet.errors` (throttling and 5xx: TransientError; anything else: DependencyFailed).
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from gpufleet.store.dynamo import translate_errors

_SESSION = re.compile(r"[^\w+=,.@-]")


def role_session_name(name: str) -> str:
    """``name`` as an STS role session name: characters outside ``[\\w+=,.@-]`` become ``-``, at most 64."""
    return _SESSION.sub("-", name)[:64]


class CredentialVendor(Protocol):
    def vend(self, *, session_name: str, policy: dict[str, Any]) -> dict[str, Any]: ...


class StsCredentialVendor:
    def __init__(self, client, role_arn: str, duration_s: int = 3600) -> None:
        self.client = client
        self.role_arn = role_arn
        self.duration_s = duration_s

    def vend(self, *, session_name: str, policy: dict[str, Any]) -> dict[str, Any]:
        with translate_errors():
            resp = self.client.assume_role(
                RoleArn=self.role_arn, RoleSessionName=role_session_name(session_name),
                Policy=json.dumps(policy, separators=(",", ":")), DurationSeconds=self.duration_s,
            )
        c = resp["Credentials"]
        return {"access_key_id": c["AccessKeyId"], "secret_access_key": c["SecretAccessKey"],
                "session_token": c["SessionToken"], "expiration": c["Expiration"].timestamp()}
