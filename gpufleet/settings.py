"""Process settings: one style for every entry point.

Contract:
- Every process-level settings class (the API, the lifecycle task Lambdas, the job runtime, the
  on-prem agent, the dev stack) is a :class:`Settings`: a frozen pydantic-settings model read from
  ``GPUFLEET_<FIELD>`` environment variables (upper case; lists, maps and nested models as JSON).
- :meth:`Settings.load` is called once per process at its entry point, which then passes the
  settings (and what is built from them) down explicitly; nothing below an entry point reads the
  environment. Precedence, lowest first: field defaults < ``file`` values (a settings file the
  entry point read, e.g. the agent's TOML) < environment < explicit overrides (``None`` overrides
  are ignored). ``env`` replaces ``os.environ`` (tests pass a mapping).
- An invalid or missing value raises :class:`gpufleet.errors.ConfigError` naming the field, at
  start-up, never mid-request.
- :class:`StorageSettings` holds the table and bucket names every deployed process shares
  (``GPUFLEET_JOBS_TABLE``, ``GPUFLEET_OUTPUTS_BUCKET``, ...); :attr:`StorageSettings.tables` is
  the :class:`gpufleet.tables.TableNames` the stores take. :class:`PoolSettings` holds the
  configured pools (``GPUFLEET_POOLS``, a JSON list; unset or empty: the default pools);
  :class:`ImageAllowlistSettings` the site image allowlist (``GPUFLEET_IMAGE_ALLOWLIST``).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Annotated, Any, ClassVar, Self

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)
from pydantic_settings.sources import EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from gpufleet.errors import ConfigError
from gpufleet.images import check_allowlist_entry
from gpufleet.ownership import InputOwnership
from gpufleet.pools import DEFAULT_POOLS, Pool, parse_pools
from gpufleet.tables import TableNames

ENV_PREFIX = "GPUFLEET_"

#: the environment :meth:`Settings.load` reads instead of ``os.environ`` (None: ``os.environ``)
_ENV: ContextVar[Mapping[str, str] | None] = ContextVar("gpufleet_settings_env", default=None)
#: values below the environment (a settings file) for :meth:`Settings.load`
_FILE: ContextVar[Mapping[str, Any] | None] = ContextVar("gpufleet_settings_file", default=None)


class Settings(BaseSettings):
    """Base of every process's settings: ``GPUFLEET_<FIELD>`` environment variables, frozen."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    #: how a validation error names these settings ("invalid <label>: <field>: <message>")
    config_label: ClassVar[str] = "settings"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _ENV.get()
        if env is not None and isinstance(env_settings, EnvSettingsSource):
            env_settings.env_vars = parse_env_vars(
                env, env_settings.case_sensitive, env_settings.env_ignore_empty, env_settings.env_parse_none_str
            )
        file = _FILE.get()
        if file:
            return init_settings, env_settings, InitSettingsSource(settings_cls, init_kwargs=dict(file))
        return init_settings, env_settings

    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, *, file: Mapping[str, Any] | None = None, **overrides: Any
    ) -> Self:
        """The settings of this process: ``overrides`` (None ignored) > ``env`` (default ``os.environ``) >
        ``file`` > defaults; ConfigError naming the first invalid field."""
        env_token, file_token = _ENV.set(env), _FILE.set(file)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as err:
            raise config_error(cls.config_label, err) from err
        except SettingsError as err:  # a malformed value of a list, map or nested setting
            raise ConfigError(f"invalid {cls.config_label}: {err} (lists and maps must be JSON)") from err
        finally:
            _ENV.reset(env_token)
            _FILE.reset(file_token)


def config_error(label: str, err: ValidationError) -> ConfigError:
    """One-line ConfigError of the first error of ``err``: ``invalid <label>: <field>: <message>``."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    return ConfigError(f"invalid {label}: {where}: {msg}" if where else f"invalid {label}: {msg}")


class StorageSettings(Settings):
    """The tables and buckets of a deployment (the CDK stacks set these variables on every process)."""

    jobs_table: str = TableNames.jobs
    control_table: str = TableNames.control
    ledger_table: str = TableNames.ledger
    outputs_bucket: str = "gpufleet-outputs"
    checkpoints_bucket: str = "gpufleet-checkpoints"
    logs_bucket: str = "gpufleet-logs"

    @property
    def tables(self) -> TableNames:
        return TableNames(jobs=self.jobs_table, control=self.control_table, ledger=self.ledger_table)


class InputOwnershipSettings(StorageSettings):
    """Where tenants' inputs may live (:mod:`gpufleet.ownership`): the API checks a spec's ``data.inputs`` with it
    at submission, the node API again when it vends an attempt's object credentials."""

    #: Platform data buckets besides the outputs bucket where tenant t's inputs live under tenants/<t>/.
    input_buckets: list[str] = Field(default_factory=list)
    #: Buckets registered to a tenant (every key readable by that tenant's jobs): {tenant: [bucket, ...]}.
    tenant_buckets: dict[str, list[str]] = Field(default_factory=dict)

    def data_buckets(self) -> set[str]:
        """Buckets where tenant t's inputs live under ``tenants/<t>/``."""
        return {self.outputs_bucket, *self.input_buckets}

    def input_ownership(self) -> InputOwnership:
        return InputOwnership.of(self.data_buckets(), self.tenant_buckets)


class PoolSettings(Settings):
    """The configured pools (the scheduler pass places on them; the API reports them)."""

    pools: Annotated[tuple[Pool, ...], NoDecode] = Field(default_factory=lambda: parse_pools(list(DEFAULT_POOLS)))

    @field_validator("pools", mode="before")
    @classmethod
    def _pools(cls, v: Any) -> Any:
        return parse_pools(v or list(DEFAULT_POOLS)) if isinstance(v, str | list) else v


class ImageAllowlistSettings(Settings):
    """The site image allowlist (:mod:`gpufleet.images`): registry/repository prefixes and sha256 digests a
    container job may name. ``GPUFLEET_IMAGE_ALLOWLIST`` as JSON, e.g. ``["localhost/", "registry.example.com/ml"]``;
    default: images in the nodes' local stores only. The API checks it at submission, the runtime again
    before it starts a container."""

    image_allowlist: list[str] = Field(default_factory=lambda: ["localhost/"])

    @field_validator("image_allowlist")
    @classmethod
    def _images(cls, v: list[str]) -> list[str]:
        return [check_allowlist_entry(e) for e in v]
