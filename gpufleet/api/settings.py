"""API settings: a :class:`gpufleet.settings.Settings` validated at start-up from ``GPUFLEET_*`` env vars.

Contract: :func:`load` builds :class:`ApiSettings` from the environment with
explicit keyword arguments overriding; an invalid or missing value raises
:class:`gpufleet.errors.ConfigError` at start-up, never mid-request. The table and
bucket names are the shared :class:`gpufleet.settings.StorageSettings` fields.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from gpufleet.api.cors import CorsSettings
from gpufleet.errors import ConfigError
from gpufleet.settings import ImageAllowlistSettings, InputOwnershipSettings, PoolSettings


class RateLimit(BaseModel):
    """A tenant's request rate limit: ``rate`` requests per second (0: no limit), bursts of ``burst``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate: float = Field(ge=0, le=100_000)
    burst: int = Field(ge=1, le=1_000_000)


class ApiSettings(InputOwnershipSettings, PoolSettings, ImageAllowlistSettings, CorsSettings):
    """``GPUFLEET_*`` of the API; ``image_allowlist`` (:class:`ImageAllowlistSettings`) is enforced at
    submission (anything else is a 403)."""

    config_label: ClassVar[str] = "API settings"

    state_machine_arn: str = ""
    #: Batch job queue of the finalize stage (its jobs are terminated on cancel).
    finalize_queue: str = ""
    #: HMAC key of list cursors (at least 16 characters; rotate to invalidate all cursors).
    #: Deployed stacks give ``cursor_secret_arn`` (a Secrets Manager secret) instead; the
    #: Lambda entry point reads it at start-up and passes ``cursor_secret`` explicitly.
    cursor_secret: SecretStr | None = Field(None, min_length=16)
    cursor_secret_arn: str = ""
    #: Soft quota at submission: jobs QUEUED/PENDING/SCHEDULED per user and per team.
    queued_jobs_per_user: int = Field(100, ge=1)
    queued_jobs_per_team: int = Field(1000, ge=1)
    #: Retry-After (seconds) sent with a 429.
    quota_retry_after_s: int = Field(30, ge=1, le=3600)
    #: How long a request waits for an identical in-flight request before answering 409.
    idempotency_wait_s: float = Field(2.0, ge=0, le=25)
    #: Watermark key file (one 64-hex-digit secret a line) the provenance lookup detects with; unset: the
    #: lookup answers 409 ``not configured``.
    watermark_keys_file: str | None = None
    #: Deployed stacks: the template's watermark secret (gpufleet.provenance.keys.watermark_keys_from_secret), read on
    #: the first lookup by the Lambda entry point's wiring (the same keys both finalize paths embed with).
    watermark_secret_arn: str = ""
    #: Lifetime of presigned output URLs (capped at 15 minutes).
    presign_ttl_s: int = Field(900, ge=1, le=900)
    #: Log chunks returned per ``GET /v1/jobs/{id}/logs`` call.
    log_chunks_per_page: int = Field(20, ge=1, le=200)
    #: Webhook URL policy (gpufleet.webhooks.urlpolicy): true allows http and private/loopback targets
    #: (local development only; env GPUFLEET_WEBHOOK_ALLOW_PRIVATE, from CDK context gpufleet:webhook_allow_private).
    webhook_allow_private: bool = False
    # input_buckets / tenant_buckets: gpufleet.settings.InputOwnershipSettings

    #: The KMS key that seals tenants' webhook signing secrets (gpufleet.store.webhook_keys); without it
    #: ``/v1/webhooks/secrets`` answers 503 (the template always sets it).
    webhook_key_id: str = ""
    #: Per-tenant request rate limit, every route but the OpenAPI document (a token bucket per tenant in
    #: the control table, shared by all API containers; 429 rate-limited with Retry-After when spent):
    #: requests per second (0: no limit) and burst. Keep them below the stage throttle so that one tenant
    #: cannot spend it for all.
    tenant_rate_limit: float = Field(25.0, ge=0, le=100_000)
    tenant_burst_limit: int = Field(50, ge=1, le=1_000_000)
    #: Per-tenant overrides: {tenant: {"rate": r, "burst": b}} (env GPUFLEET_TENANT_RATE_LIMITS as JSON).
    tenant_rate_limits: dict[str, RateLimit] = Field(default_factory=dict)
    #: A second, smaller bucket per tenant for ``POST /v1/provenance/lookup`` (besides the request limit): a
    #: lookup runs the watermark detector in the API function, up to seconds of CPU for a large plane, so one
    #: tenant's lookups are held to about ``rate × (detector seconds) + burst`` functions running at once and
    #: cannot spend the account's Lambda concurrency every tenant's requests share (0: no such bucket).
    tenant_lookup_rate_limit: float = Field(0.5, ge=0, le=1_000)
    tenant_lookup_burst_limit: int = Field(5, ge=1, le=1_000)

    def rate_limit_for(self, tenant: str) -> RateLimit | None:
        """The tenant's request rate limit, or None when it has none."""
        limit = self.tenant_rate_limits.get(tenant) or RateLimit(
            rate=self.tenant_rate_limit, burst=self.tenant_burst_limit
        )
        return limit if limit.rate > 0 else None

    def lookup_limit(self) -> RateLimit | None:
        """Each tenant's provenance lookup limit, or None when lookups have no bucket of their own."""
        limit = RateLimit(rate=self.tenant_lookup_rate_limit, burst=self.tenant_lookup_burst_limit)
        return limit if limit.rate > 0 else None

    @model_validator(mode="after")
    def _secret_source(self) -> ApiSettings:
        if self.cursor_secret is None and not self.cursor_secret_arn:
            raise ValueError("set GPUFLEET_CURSOR_SECRET or GPUFLEET_CURSOR_SECRET_ARN")
        return self

    @property
    def cursor_key(self) -> bytes:
        """The cursor HMAC key; only valid once ``cursor_secret`` is set."""
        if self.cursor_secret is None:
            raise ConfigError("the cursor secret has not been loaded (GPUFLEET_CURSOR_SECRET_ARN)")
        return self.cursor_secret.get_secret_value().encode()


def load(**overrides: Any) -> ApiSettings:
    """Settings from the environment, ``overrides`` winning; ConfigError if invalid."""
    return ApiSettings.load(**overrides)
