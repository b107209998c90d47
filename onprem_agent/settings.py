"""Agent settings: a :class:`gpufleet.settings.Settings` loaded from a TOML file and the environment.

Contract:
- Precedence, lowest first: model defaults < TOML file < environment
  (``GPUFLEET_AGENT_<FIELD>``, upper case; lists and maps as JSON) < explicit
  overrides passed by the caller (command-line flags). :func:`load_settings` is called once, by the
  agent's entry point (``onprem_agent/main.py``), with the process environment.
- Unknown keys in the file or malformed values raise :class:`gpufleet.errors.ConfigError`
  at start-up, never later.
"""

from __future__ import annotations

import os
import signal
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from gpufleet.errors import ConfigError
from gpufleet.runtime.verified import REVERIFY_S
from gpufleet.settings import Settings

ENV_PREFIX = "GPUFLEET_AGENT_"


class AgentSettings(Settings):
    """Everything the agent needs; see onprem_agent/packaging/agent.toml for a commented example."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")
    config_label: ClassVar[str] = "agent settings"

    node_id: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    pool: str = Field(..., min_length=1, max_length=128)
    queue_url: str = Field(..., min_length=1, description="this node's SQS queue (the scheduler sends envelopes here)")
    signals_queue_url: str | None = Field(
        None, description="this node's signal queue, long-polled for cancel nudges (a cancel then reaches a running "
        "job in about a second instead of at the next heartbeat_interval_s); unset: queue_url + '_signals' (created "
        "with the node's queues at registration); '': off")
    signals_recheck_s: float = Field(300.0, gt=0, description="a missing or refused signal queue is looked for again "
                                     "this often (re-registering an older node creates it; no agent restart needed)")
    region: str = "us-east-1"
    endpoint_url: str | None = Field(None, description="AWS endpoint override (a local moto server in development)")
    node_api_url: str | None = Field(None, description="the node API (…/v1 stage URL of the REST API): every call "
                                     "about a job goes through it; required to run")
    jobs_table: str = "gpufleet-jobs"
    control_table: str = "gpufleet-control"

    state_dir: Path = Path("/var/lib/gpufleet-agent")
    cache_dir: Path = Path("/var/cache/gpufleet-agent")
    cache_max_bytes: int = Field(50 * 1024**3, ge=0)
    cache_min_age_s: float = Field(600.0, ge=0, description="entries used more recently are never evicted")
    cache_reverify_s: float = Field(
        REVERIFY_S, ge=0, description="a cached model or input unchanged since it was last hashed is not hashed again "
        "for this long, by the agent's prefetch or its jobs (passed to them); 0 hashes on every use")

    labels: dict[str, str] = Field(default_factory=dict)
    datasets: list[str] = Field(default_factory=list, description="datasets staged on this host (s3:// URIs)")
    advertise_inputs: int = Field(
        256, ge=0, le=1024, description="inputs staged in the node cache advertised as datasets (the most recently "
        "used first; with the configured datasets at most 64 KiB of URIs): the scheduler's locality")
    gpu_type: str | None = Field(None, description="override of the GPU type reported to the scheduler")
    cpu_slots: int = Field(1, ge=1, le=256, description="concurrent jobs on a host without GPUs (CPU-only fallback)")
    cpu_milli: int | None = Field(None, ge=0, description="CPU capacity to advertise (default: host cores x 1000)")
    memory_mib: int | None = Field(None, ge=0, description="memory to advertise (default: host memory)")

    runtime_command: list[str] = Field(
        default_factory=lambda: [sys.executable, "-m", "gpufleet.runtime"], min_length=1,
        description="the worker; the agent appends --envelope-file <path>",
    )
    child_env: dict[str, str] = Field(default_factory=dict, description="extra environment for jobs")
    warm_workers: bool = Field(
        False, description="run the platform's generate stage on long-lived per-GPU-set workers that keep the "
        "stack imported and the last model loaded (docs/agent.md, 'Warm workers'); tenant containers always "
        "get a fresh process")
    warm_worker_command: list[str] = Field(
        default_factory=lambda: [sys.executable, "-m", "gpufleet.runtime.worker"], min_length=1,
        description="the warm worker (gpufleet.runtime.worker protocol)")
    warm_model_budget_bytes: int = Field(
        0, ge=0, description="model bytes a warm worker keeps loaded (LRU); 0 keeps the last model only")
    batch_max_members: int = Field(
        1, ge=1, le=16, description="compatible generate jobs a warm worker runs as one denoising batch "
        "(needs warm_workers; 1: no batching)")
    batch_memory_bytes: int = Field(
        2 * 2**30, ge=0, description="on a CPU node, the memory a batch may use (GPUs: their free memory); 0: no bound")

    poll_wait_s: int = Field(20, ge=0, le=20, description="SQS long-poll wait")
    prefetch: int = Field(1, ge=0, le=10, description="messages held beyond the free GPUs, so the next job starts at once")
    prefetch_data: bool = Field(
        True, description="while a held message waits for its GPUs, fetch its inputs and model into the node cache "
        "(one job at a time, with the attempt's own credentials; best effort), so they are cache hits when it starts")
    visibility_timeout_s: int = Field(120, ge=2, le=43200)
    heartbeat_interval_s: float = Field(10.0, gt=0, description="task heartbeat, visibility extension and cancel check")
    gang_failure_hold_s: float = Field(
        110.0, ge=0, description="a gang member whose process failed by itself keeps heartbeating this long before "
        "it reports the failure: a peer lost meanwhile (its agent or host died, which the node API sees after its "
        "gang_silence_s, 90 s) fails the gang as a system error and this member reports nothing, so the gang is "
        "retried as a unit instead of failing as the survivor's error. Keep it above the node API's gang_silence_s "
        "+ heartbeat_interval_s; 0 = report at once")
    node_heartbeat_s: float = Field(15.0, gt=0)
    node_ttl_s: int = Field(60, ge=1, description="expires_at = heartbeat + this; the scheduler ignores expired nodes")
    cancel_grace_s: float = Field(
        5.0, ge=0, description="SIGTERM → SIGKILL delay when a job is cancelled: above the runtime's container cancel "
        "grace (at most 4 s), so the runtime stops its tenant container itself and reports CANCELLED instead of being "
        "killed mid-stop and leaving the container to its reaper")
    orphan_signal: str | None = Field(
        "SIGTERM", pattern=r"^SIG[A-Z0-9]+$",
        description="sent to a job if the agent process dies (Linux PR_SET_PDEATHSIG); null to disable",
    )
    drain_timeout_s: float = Field(600.0, gt=0, description="how long a drain waits for jobs to checkpoint")
    completed_retention_s: int = Field(7 * 86400, ge=60)

    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65535, description="0 picks a free port")
    metrics_enabled: bool = True
    log_level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not k or len(k) > 63:
                raise ValueError(f"invalid label key {k!r}")
        return v

    @field_validator("orphan_signal")
    @classmethod
    def _signal(cls, v: str | None) -> str | None:
        if v is not None and not isinstance(getattr(signal, v, None), signal.Signals):
            raise ValueError(f"unknown signal {v}")
        return v

    @model_validator(mode="after")
    def _heartbeats(self) -> AgentSettings:
        if self.heartbeat_interval_s * 2 > self.visibility_timeout_s:
            raise ValueError("visibility_timeout_s must be at least twice heartbeat_interval_s")
        if self.node_heartbeat_s >= self.node_ttl_s:
            raise ValueError("node_ttl_s must exceed node_heartbeat_s")
        if self.batch_max_members > 1 and not self.warm_workers:
            raise ValueError("batch_max_members > 1 needs warm_workers (batches run on warm workers)")
        return self

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "agent.pid"


def _check_env(env: Mapping[str, str]) -> None:
    """A ``GPUFLEET_AGENT_*`` variable that names no setting is a typo: refused at start-up."""
    for key in env:
        if key.upper().startswith(ENV_PREFIX) and key[len(ENV_PREFIX):].lower() not in AgentSettings.model_fields:
            raise ConfigError(f"unknown agent setting in environment: {key}")


def load_settings(
    path: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
) -> AgentSettings:
    """Build settings from ``path`` (TOML, optional), ``env`` (the process environment, read by the
    entry point) and ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError as err:
            raise ConfigError(f"agent config not found: {path}") from err
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"agent config {path} is not valid TOML: {err}") from err
        data.update(doc.get("agent", doc))
    _check_env(env)
    return AgentSettings.load(env, file=data, **(overrides or {}))
