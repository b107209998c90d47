"""The one error hierarchy of gpufleet.

Every error a caller can act on derives from :class:`GpufleetError`. Each
carries an HTTP status and a stable ``type`` slug so the API layer maps it to
an RFC 9457 problem document in exactly one place, and the CLI maps it to a
one-line message and an exit code. Adapters translate provider errors (e.g.
botocore ``ClientError``) into these; the core never sees boto3 exceptions.
"""

from __future__ import annotations

from typing import Any


class GpufleetError(Exception):
    """Base class. ``status`` is the HTTP status, ``type_slug`` names the problem type."""

    status: int = 500
    type_slug: str = "internal"
    title: str = "Internal error"

    def __init__(self, detail: str = "", **extra: Any) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.extra = extra

    def problem(self, instance: str | None = None) -> dict[str, Any]:
        """Return the RFC 9457 problem+json body for this error."""
        body: dict[str, Any] = {
            "type": f"https://gpufleet.dev/problems/{self.type_slug}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        body.update(self.extra)
        return body


class ValidationFailed(GpufleetError):
    status, type_slug, title = 400, "validation", "Request validation failed"


class BadRequest(GpufleetError):
    status, type_slug, title = 400, "bad-request", "Bad request"


class PayloadTooLarge(GpufleetError):
    status, type_slug, title = 413, "payload-too-large", "Request body too large"


class LengthRequired(GpufleetError):
    """A request body without a ``Content-Length`` (e.g. chunked): refused before it is read."""

    status, type_slug, title = 411, "length-required", "Content-Length required"


class UnsupportedMediaType(GpufleetError):
    """A request body in a media type the API does not take (it takes ``application/json``)."""

    status, type_slug, title = 415, "unsupported-media-type", "Unsupported media type"


class TooManyRequests(GpufleetError):
    """The tenant's request rate limit is spent; ``retry_after`` seconds until a request is allowed."""

    status, type_slug, title = 429, "rate-limited", "Request rate limit exceeded"

    def __init__(self, detail: str = "", retry_after: int = 1, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after = retry_after


class Unauthorized(GpufleetError):
    status, type_slug, title = 403, "forbidden", "Forbidden"


class NotAllowed(Unauthorized):
    """Refused by a site policy at admission (image allowlist, input ownership); ``field`` names the field."""

    type_slug, title = "not-allowed", "Not allowed by site policy"


class NotRegistered(NotAllowed):
    """The node API's caller is no registered node (never registered, or deregistered by an operator): the same
    403 ``not-allowed`` to the caller; told apart in the node API's refusal metric."""


class NotFound(GpufleetError):
    status, type_slug, title = 404, "not-found", "Not found"


class Conflict(GpufleetError):
    status, type_slug, title = 409, "conflict", "Conflict"


class LimitReached(Conflict):
    """A per-tenant count limit is reached (e.g. webhook endpoints); ``limit`` says how many are allowed."""

    type_slug, title = "limit-reached", "Limit reached"


class IdempotencyInFlight(Conflict):
    type_slug, title = "idempotency-in-flight", "A request with this Idempotency-Key is still in progress"


class IdempotencyMismatch(GpufleetError):
    status, type_slug, title = 422, "idempotency-mismatch", "Idempotency-Key reused with a different payload"


class InvalidTransition(Conflict):
    type_slug, title = "invalid-transition", "Job is not in a state that allows this"


class QuotaExceeded(GpufleetError):
    status, type_slug, title = 429, "quota-exceeded", "Quota exceeded"

    def __init__(self, detail: str = "", retry_after: int = 30, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after = retry_after


class StaleEpoch(GpufleetError):
    """A write carried an epoch that is no longer the job's current one.

    The worker that receives this has been fenced off (declared dead, or
    superseded by a newer attempt) and must stop at once.
    """

    status, type_slug, title = 409, "stale-epoch", "Attempt has been fenced off"


class TaskGone(GpufleetError):
    """The workflow no longer waits on an attempt's task (it timed out, or was completed)."""

    status, type_slug, title = 410, "task-gone", "Task token is no longer valid"


class Cancelled(GpufleetError):
    status, type_slug, title = 409, "cancelled", "Job was cancelled"


class OutputTooLarge(GpufleetError):
    """A job left more under its output directory than the per-job cap allows: the job's own failure
    (the lifecycle classifies it USER; the workflow's CollectOutputs raises it)."""

    status, type_slug, title = 422, "output-too-large", "Job output exceeds the per-job cap"


class ConfigError(GpufleetError):
    status, type_slug, title = 500, "config", "Invalid configuration"


class TransientError(GpufleetError):
    """A dependency failed in a way that is worth retrying."""

    status, type_slug, title = 503, "unavailable", "Temporarily unavailable"


class DependencyFailed(GpufleetError):
    """A dependency (DynamoDB, S3, SQS, Step Functions, ...) refused a request for a reason retrying
    will not fix (access denied, a missing resource, a malformed request): an operator's problem."""

    status, type_slug, title = 502, "dependency", "A platform dependency failed"


class WaitTimeout(GpufleetError):
    """A client gave up waiting (e.g. ``Client.wait``) before the job reached a terminal status."""

    status, type_slug, title = 504, "wait-timeout", "Timed out waiting for the job"
