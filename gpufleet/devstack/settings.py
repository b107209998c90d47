"""Settings of the embedded stack (validated at start-up; explicit arguments beat defaults).

Contract: every path the stack writes lies under ``state_dir``. Ports 0 pick free ports; the
chosen ones are reported in the ready banner, ``<state_dir>/stack.json`` and the profile.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DEV_ACCOUNT = "123456789012"


class DevSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path = Field(Path(".gpufleet"), description="all state of the stack lives here")
    host: str = Field("127.0.0.1", pattern=r"^127\.0\.0\.1$|^localhost$", description="loopback only")
    api_port: int = Field(8642, ge=0, le=65535, description="gateway port; 0 picks a free one")
    moto_port: int = Field(0, ge=0, le=65535, description="moto server port; 0 picks a free one")
    region: str = "us-east-1"
    tenant: str = "dev"
    team: str = "local"
    user: str = "developer"
    node_id: str = "dev-node-1"
    agent: bool = Field(True, description="start an on-prem agent")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="what the agent runs jobs on")
    scheduler_interval_s: float = Field(1.0, gt=0, le=60, description="period of the scheduler pass timer")
    heartbeat_seconds: int = Field(
        20, ge=5, description="HeartbeatSeconds of the Run state (CDK context): how long a silent agent is trusted"
    )
    access_key_id: str = Field(default_factory=lambda: "AKIADEV" + secrets.token_hex(6).upper())
    secret_access_key: str = Field(default_factory=lambda: secrets.token_urlsafe(30))

    def cdk_context(self) -> dict[str, Any]:
        """CDK context over ``gpufleet.local.synth.LOCAL_CONTEXT`` for the dev stack's template.

        The test-sized 3 s heartbeat of LOCAL_CONTEXT is too tight for a developer machine that is
        also running torch on its CPUs; a dead agent is still noticed within ``heartbeat_seconds``.
        """
        return {"gpufleet:heartbeat_seconds": self.heartbeat_seconds}

    @property
    def principal_arn(self) -> str:
        return f"arn:aws:iam::{DEV_ACCOUNT}:user/{self.user}"

    @property
    def state(self) -> Path:
        return self.state_dir.resolve()

    def path(self, *parts: str) -> Path:
        return self.state.joinpath(*parts)
