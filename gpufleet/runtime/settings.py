"""Runtime settings (pydantic), read once at start-up from ``GPUFLEET_*`` environment variables.

An explicit argument beats an environment variable: tests build
:class:`RuntimeSettings` directly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.models.limits import TINY_SIDE_MAX


def _default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "gpufleet")


class RuntimeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state_dir: str = Field(default_factory=_default_state_dir, description="dev keys, scratch")
    cache_dir: str | None = Field(None, description="node-wide cache (models, inputs); default <state_dir>/cache")
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
    container_grace_s: float = Field(30.0, ge=0)
    signing_key: str | None = Field(None, description="PKCS#8 PEM private key (ES256) for C2PA")
    signing_chain: str | None = Field(None, description="PEM chain, end-entity first")
    moderation_backend: str = "skin"
    node_id: str | None = Field(None, description="on-prem node running this job (set by the agent); its "
                                "uploads are tagged gpufleet:node=<node_id>, as the agent role requires. None on Batch")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="torch device for generation: auto (cuda when visible), cpu, cuda, "
                        "cuda:N (gpufleet.runtime.device)")
    torch_threads: int | None = Field(None, ge=1, description="CPU threads for torch (None = torch's default)")

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir or Path(self.state_dir) / "cache")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RuntimeSettings:
        env = dict(os.environ if env is None else env)
        values = {}
        for name in cls.model_fields:
            raw = env.get(f"GPUFLEET_{name.upper()}")
            if raw is not None:
                values[name] = raw
        return cls.model_validate(values)
