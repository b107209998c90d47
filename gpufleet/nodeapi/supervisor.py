"""A cloud attempt's supervisor as a node API caller (pure): its one-time token, its identity, its scope.

A cloud container job's Batch task has no role (``gpufleet.batchdef``: ECS would give a task role to every
container, the tenant's included), so the platform's supervisor container starts with no AWS identity at all.
It gets one per attempt:

1. RunCloud mints a random token (:func:`mint`) and stores only its sha256 on the attempt item, fenced on the
   job's epoch (:meth:`gpufleet.store.runs.RunStore.record_cloud_dispatch`); the token itself travels only in
   the supervisor container's ``ecsPropertiesOverride`` environment (``GPUFLEET_SUPERVISOR_TOKEN``).
2. The supervisor exchanges it once at ``POST /v1/node/cloud/credentials`` ``{job_id, epoch, token}`` (the one
   node API route without IAM auth: the token is the credential) for an STS session of the cloud supervisor
   role named :func:`session_name` (``sup-e<epoch>-<job id>``) with :func:`session_policy`: the attempt's
   objects (:func:`gpufleet.nodeapi.scope.session_policy`) and ``execute-api:Invoke`` on this attempt's node
   API routes only. The exchange claims the token with a conditional write (a second exchange, a token of
   another job or epoch, a forged one: refused, nothing changed) and checks the epoch is current.
3. With that session the supervisor calls the node API's attempt operations as an on-prem node does; the
   server maps the session to :func:`principal` (``sup:<epoch>:<job id>``; a ``:`` never occurs in a node id,
   so no agent session can pose as it) and :func:`check_supervisor` allows only the bound job and epoch while
   that epoch is current. Its ``credentials`` operation renews the session (same name, same policy).

Contract: every refusal is :class:`~gpufleet.errors.NotAllowed` (403) with one message whatever the reason
(unknown job, no token, a token that does not match, already claimed), except an authentic token of a
fenced-off attempt: :class:`~gpufleet.errors.StaleEpoch` (409), after the token was checked.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from typing import Any

from gpufleet.errors import NotAllowed, StaleEpoch
from gpufleet.nodeapi.scope import session_policy as attempt_object_policy
from gpufleet.store.runs import SUPERVISOR_CLAIMED_ATTR as CLAIMED_ATTR
from gpufleet.store.runs import SUPERVISOR_TOKEN_ATTR as TOKEN_ATTR

REFUSED = "not a valid supervisor token for this attempt"
_SESSION = re.compile(r"^sup-e(?P<epoch>\d{1,9})-(?P<job>[A-Za-z0-9_.-]{1,48})$")
_PRINCIPAL = re.compile(r"^sup:(?P<epoch>\d{1,9}):(?P<job>[A-Za-z0-9_.-]{1,128})$")


def mint() -> tuple[str, str]:
    """A fresh token (256 random bits, URL-safe) and its sha256 (hex): the token for the supervisor, the hash to
    store."""
    token = secrets.token_urlsafe(32)
    return token, token_sha256(token)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_sha256: str | None) -> bool:
    """Whether ``token`` hashes to ``stored_sha256`` (constant-time comparison)."""
    if not stored_sha256 or not isinstance(token, str) or not token:
        return False
    return hmac.compare_digest(token_sha256(token), str(stored_sha256))


def session_name(job_id: str, epoch: int) -> str:
    """The STS role session name of ``job_id``'s attempt ``epoch`` (at most 64 characters)."""
    name = f"sup-e{int(epoch)}-{job_id}"
    if not _SESSION.match(name) or len(name) > 64:
        raise ValueError(f"job id {job_id!r} cannot name a supervisor session")
    return name


def principal(role_session: str) -> str | None:
    """The node API principal of a supervisor role session name (``sup:<epoch>:<job>``), or None."""
    m = _SESSION.match(role_session or "")
    return f"sup:{int(m['epoch'])}:{m['job']}" if m else None


def bound_attempt(caller: str) -> tuple[str, int] | None:
    """``(job_id, epoch)`` a supervisor principal is bound to; None for a node (or anything else)."""
    m = _PRINCIPAL.match(caller or "")
    return (m["job"], int(m["epoch"])) if m else None


def check_supervisor(caller: str, job_id: str, epoch: int, *, current_epoch: int, attempt_exists: bool) -> None:
    """Refuse unless ``caller`` is the supervisor of ``job_id``'s attempt ``epoch``, which exists and is current."""
    bound = bound_attempt(caller)
    if bound is None or bound != (job_id, int(epoch)) or not attempt_exists:
        raise NotAllowed(f"attempt {epoch} of {job_id} is not this supervisor's")
    if int(epoch) != int(current_epoch):
        raise StaleEpoch(f"epoch {epoch} is stale (current {current_epoch})", current_epoch=int(current_epoch))


def session_policy(
    job_id: str,
    epoch: int,
    *,
    checkpoints: str,
    outputs: str,
    logs: str,
    api_arn: str,
    inputs: Iterable[str] = (),
    partition: str = "aws",
    models: str = "",
) -> dict[str, Any]:
    """The attempt's object scope (the published models under ``models`` included, read only) plus
    ``execute-api:Invoke`` on ``POST /v1/node/jobs/<job>/attempts/<epoch>/*`` of the node API (``api_arn``:
    ``arn:<p>:execute-api:<region>:<account>:<api id>``; any stage)."""
    routes = f"{api_arn}/*/POST/v1/node/jobs/{job_id}/attempts/{int(epoch)}/*"
    invoke = {"Sid": "InvokeAttemptRoutes", "Effect": "Allow", "Action": ["execute-api:Invoke"], "Resource": [routes]}
    return attempt_object_policy(
        job_id, checkpoints=checkpoints, outputs=outputs, logs=logs, inputs=inputs, partition=partition,
        models=models, extra=[invoke]
    )


def claimable(attempt: dict[str, Any] | None, token: str) -> bool:
    """Whether ``attempt`` (an attempt item) holds ``token``'s hash and has not been exchanged."""
    return attempt is not None and CLAIMED_ATTR not in attempt and token_matches(token, attempt.get(TOKEN_ATTR))


def refuse() -> NotAllowed:
    return NotAllowed(REFUSED)
