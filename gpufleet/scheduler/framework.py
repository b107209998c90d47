"""The validated scheduler configuration and the :class:`Framework` of plugins built from it.

- :class:`SchedulerConfig` (pydantic, frozen): the :class:`~gpufleet.scheduler.context.PassSettings`
  tunables plus the name of every plugin a pass runs. Names are checked against
  :mod:`gpufleet.scheduler.registry`. The ``allowlist`` scope is always on: a configuration
  that leaves it out of ``scopes`` gets it added in front, so a job is never placed outside
  its pool allowlist whatever the configuration says.
- :class:`Framework`: the plugin instances of one pass, built by :meth:`Framework.from_config`
  (the cycle builds one per pass from a config, or is handed one).
- :func:`load_config`: the deployment's configuration from ``GPUFLEET_SCHEDULER_CONFIG``
  (a JSON object of :class:`SchedulerConfig` fields; absent = the defaults), read once
  at an entry point and passed down.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError, field_validator, model_validator

from gpufleet.errors import ConfigError
from gpufleet.scheduler import registry
from gpufleet.scheduler.context import PackingPolicy, PassSettings
from gpufleet.scheduler.plugins import Filter, Preempt, QueueSort, Reserve, Scope, Score

#: deployment setting holding the scheduler configuration (JSON object)
CONFIG_ENV = "GPUFLEET_SCHEDULER_CONFIG"
#: the scope every configuration includes (a job's pool allowlist is a hard guarantee)
ALWAYS_ON_SCOPE = "allowlist"


class SchedulerConfig(PassSettings):
    """Validated scheduler configuration (names refer to :data:`gpufleet.scheduler.registry.REGISTRY`)."""

    queue_sort: str = "drf-aging"
    scopes: tuple[str, ...] = (ALWAYS_ON_SCOPE,)
    filters: tuple[str, ...] = ("gpu-type", "residency", "fits-ever", "quota")
    #: filters deciding whether a job that fits nowhere now could fit if quota and capacity
    #: allowed (UNSCHEDULABLE, and preemption is tried in those pools) or not
    static_filters: tuple[str, ...] = ("gpu-type", "residency", "fits-ever")
    reserve: str = "gang"
    preempt: str | None = "reclaim"
    packing: str = "frag-aware"

    @field_validator("scopes")
    @classmethod
    def _allowlist_always_on(cls, scopes: tuple[str, ...]) -> tuple[str, ...]:
        return scopes if ALWAYS_ON_SCOPE in scopes else (ALWAYS_ON_SCOPE, *scopes)

    @model_validator(mode="after")
    def _names(self) -> SchedulerConfig:
        checks = [("queue_sort", self.queue_sort), ("score", self.default_policy), ("reserve", self.reserve)]
        checks += [("scope", s) for s in self.scopes]
        checks += [("filter", f) for f in (*self.filters, *self.static_filters)]
        checks.append(("packing", self.packing))
        if self.preempt is not None:
            checks.append(("preempt", self.preempt))
        for kind, name in checks:
            why = registry.unknown(kind, name)
            if why is not None:
                raise ValueError(why)
        return self


def parse_config(raw: str | Mapping[str, Any]) -> SchedulerConfig:
    """Validate a JSON object (string or already parsed) of :class:`SchedulerConfig` fields."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        return SchedulerConfig(**data)
    except (ValueError, TypeError, ValidationError) as err:
        raise ConfigError(f"invalid scheduler configuration ({CONFIG_ENV}): {err}") from err


def load_config(env: Mapping[str, str]) -> SchedulerConfig:
    """The configuration in ``env[GPUFLEET_SCHEDULER_CONFIG]``, or the defaults when unset or empty."""
    raw = env.get(CONFIG_ENV)
    return parse_config(raw) if raw else SchedulerConfig()


@dataclass
class Framework:
    """The plugins one pass runs. Scores are built on first use, by policy name."""

    config: SchedulerConfig
    queue_sort: QueueSort
    scopes: tuple[Scope, ...]
    filters: tuple[Filter, ...]
    static_filters: tuple[Filter, ...]
    reserve: Reserve
    preempt: Preempt | None
    packer: PackingPolicy
    scores: dict[str, Score] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: SchedulerConfig | None = None) -> Framework:
        """Build every plugin ``config`` names (the defaults when None)."""
        config = config or SchedulerConfig()
        return cls(
            config=config,
            queue_sort=registry.build("queue_sort", config.queue_sort),
            scopes=tuple(registry.build("scope", s) for s in config.scopes),
            filters=tuple(registry.build("filter", f) for f in config.filters),
            static_filters=tuple(registry.build("filter", f) for f in config.static_filters),
            reserve=registry.build("reserve", config.reserve),
            preempt=registry.build("preempt", config.preempt) if config.preempt else None,
            packer=registry.build("packing", config.packing),
        )

    def score(self, policy: str) -> Score:
        """The score plugin of pool policy ``policy`` (ConfigError when there is none)."""
        if policy not in self.scores:
            self.scores[policy] = registry.build("score", policy)
        return self.scores[policy]
