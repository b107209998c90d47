"""Settings of the embedded stack (validated at start-up; explicit arguments beat defaults).

Contract: every path the stack writes lies under ``state_dir``. Ports 0 pick free ports; the
chosen ones are reported in the ready banner, ``<state_dir>/stack.json`` and the profile.
:func:`load` builds settings and turns a validation error into one-line
:class:`gpufleet.errors.ConfigError`; :func:`parse_assignments` reads ``KEY=VALUE`` arguments.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gpufleet.errors import ConfigError
from gpufleet.settings import Settings

DEV_ACCOUNT = "123456789012"

#: Runtime settings the stack sets itself (per agent, per job): not accepted in ``runtime_env``.
RESERVED_RUNTIME_ENV = {
    "GPUFLEET_STATE_DIR": "the stack keeps the runtime's state under <state>/runtime",
    "GPUFLEET_CACHE_DIR": "each agent gives its jobs its own cache",
    "GPUFLEET_IMDS_ENDPOINT": "use --imds-endpoint (spot-pool jobs only)",
    "GPUFLEET_JOBS_TABLE": "the stack names its own tables",
}


def runtime_setting_names() -> list[str]:
    """``GPUFLEET_<FIELD>`` of every :class:`gpufleet.runtime.settings.RuntimeSettings` field."""
    from gpufleet.runtime.settings import RuntimeSettings

    return sorted(f"GPUFLEET_{name.upper()}" for name in RuntimeSettings.model_fields)


class DevSettings(Settings):
    """The stack's own settings: the command line's values only. The ``GPUFLEET_*`` environment belongs to
    the processes the stack starts (it hands them their own), so none of it is read here."""

    model_config = SettingsConfigDict(extra="forbid")
    config_label: ClassVar[str] = "dev stack setting"

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource, **_: PydanticBaseSettingsSource
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    state_dir: Path = Field(Path(".gpufleet"), description="all state of the stack lives here")
    host: str = Field("127.0.0.1", pattern=r"^127\.0\.0\.1$|^localhost$", description="loopback only")
    api_port: int = Field(8642, ge=0, le=65535, description="gateway port; 0 picks a free one")
    console_port: int = Field(8643, ge=0, le=65535, description="web console port; 0 picks a free one")
    moto_port: int = Field(0, ge=0, le=65535, description="moto server port; 0 picks a free one")
    region: str = "us-east-1"
    tenant: str = "dev"
    team: str = "local"
    user: str = "developer"
    node_id: str = Field("dev-node-1", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=120)
    agent: bool = Field(True, description="start the on-prem agents")
    agents: int = Field(1, ge=1, le=8, description="how many on-prem agent processes (nodes); see node_ids()")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="what the agents run jobs on")
    warm_workers: bool = Field(
        True, description="the agents run the generate stage on warm workers (the agent's warm_workers setting: the "
        "stack stays imported and the last model loaded between jobs); tenant containers always get a fresh process")
    scheduler_interval_s: float = Field(1.0, gt=0, le=60, description="period of the scheduler pass timer")
    scheduler_idle_max_s: float = Field(
        8.0, gt=0, le=300, description="the timer's longest period: each pass that finds nothing to do doubles the "
        "period up to this (JobPending/CapacityFreed passes still run at once); below scheduler_interval_s: no backoff")
    heartbeat_seconds: int = Field(
        20, ge=5, description="HeartbeatSeconds of the Run state (CDK context): how long a silent agent is trusted"
    )
    finalize_lambda_max_pixels: int | None = Field(
        None, ge=0, description="FinalizeRoute's bound (CDK context gpufleet:finalize_lambda_max_pixels): clips of at "
        "most this many frames x delivered pixels finalize in the warm FinalizeLambda, larger ones in the local Batch "
        "runner; None: the deployment default (gpufleet.finalize_route.LAMBDA_MAX_PIXELS)")
    runtime_env: dict[str, str] = Field(
        default_factory=dict,
        description="extra GPUFLEET_<runtime setting> values for every job (agents and the local Batch runner)",
    )
    imds_endpoint: str | None = Field(
        None, description="loopback instance metadata service given to spot-pool jobs (spot interruption notices)"
    )
    access_key_id: str = Field(default_factory=lambda: "AKIADEV" + secrets.token_hex(6).upper())
    secret_access_key: str = Field(default_factory=lambda: secrets.token_urlsafe(30))

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env(cls, v: dict[str, str]) -> dict[str, str]:
        known = set(runtime_setting_names())
        for key in v:
            if key in RESERVED_RUNTIME_ENV:
                raise ValueError(f"{key} cannot be set here: {RESERVED_RUNTIME_ENV[key]}")
            if key not in known:
                raise ValueError(
                    f"{key} is not a runtime setting (GPUFLEET_ + a gpufleet.runtime.settings.RuntimeSettings "
                    f"field: {', '.join(sorted(known - set(RESERVED_RUNTIME_ENV)))})"
                )
        from gpufleet.runtime.settings import RuntimeSettings

        try:
            RuntimeSettings.model_validate({k[len("GPUFLEET_") :].lower(): val for k, val in v.items()})
        except ValidationError as err:
            first = err.errors()[0]
            name = "GPUFLEET_" + ".".join(str(p) for p in first["loc"]).upper()
            raise ValueError(f"{name}={v.get(name)!r}: {first['msg']}") from None
        return v

    @field_validator("imds_endpoint")
    @classmethod
    def _imds(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        host = parts.hostname or ""
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if parts.scheme != "http" or not loopback:
            raise ValueError(f"{v!r} is not a loopback http URL (e.g. http://127.0.0.1:8999)")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as err:
            raise ValueError(f"{v!r}: {err}") from err
        return v.rstrip("/")

    def node_ids(self) -> list[str]:
        """The agents' node ids: ``[node_id]`` for one agent; for ``agents`` = N > 1, ``node_id``
        without a trailing ``-<number>``, then ``-1`` .. ``-N`` (default: ``dev-node-1`` .. ``dev-node-N``)."""
        if self.agents == 1:
            return [self.node_id]
        base = re.sub(r"-\d+$", "", self.node_id)
        return [f"{base}-{i}" for i in range(1, self.agents + 1)]

    def cdk_context(self) -> dict[str, Any]:
        """CDK context over ``gpufleet.local.synth.LOCAL_CONTEXT`` for the dev stack's template.

        The test-sized 3 s heartbeat of LOCAL_CONTEXT is too tight for a developer machine that is
        also running torch on its CPUs; a dead agent is still noticed within ``heartbeat_seconds``. A cloud
        container job's supervisor (RunCloudContainer) is a fresh process that must start and exchange its token
        before its first beat: at least 30 s.
        """
        context: dict[str, Any] = {"gpufleet:heartbeat_seconds": self.heartbeat_seconds,
                                   "gpufleet:cloud_heartbeat_seconds": max(30, self.heartbeat_seconds)}
        # the deployment default unless given (LOCAL_CONTEXT's is test-sized)
        from gpufleet.finalize_route import LAMBDA_MAX_PIXELS

        context["gpufleet:finalize_lambda_max_pixels"] = (LAMBDA_MAX_PIXELS if self.finalize_lambda_max_pixels is None
                                                          else self.finalize_lambda_max_pixels)
        return context

    @property
    def principal_arn(self) -> str:
        return f"arn:aws:iam::{DEV_ACCOUNT}:user/{self.user}"

    @property
    def state(self) -> Path:
        return self.state_dir.resolve()

    def path(self, *parts: str) -> Path:
        return self.state.joinpath(*parts)


def load(**values: Any) -> DevSettings:
    """:class:`DevSettings` from ``values``; an invalid value raises one-line ConfigError naming the field."""
    return DevSettings.load(**values)


def parse_assignments(items: list[str] | None, *, option: str = "--runtime-env") -> dict[str, str]:
    """``["K=V", ...]`` → ``{K: V}`` (the value may contain ``=``; a later K wins); ConfigError otherwise."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} takes KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out
