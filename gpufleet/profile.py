"""The CLI/SDK profile: where the API is and how to sign requests to it.

A profile is a small JSON file. ``gpufleet dev`` writes one for the embedded stack
(``<state dir>/profile.json``, mode 0600); for a deployed stack write it yourself (or set
``GPUFLEET_ENDPOINT`` and let botocore's credential chain find credentials).

Resolution (first match wins), implemented by :func:`resolve_profile_path`:

1. an explicit path (``--profile`` / ``Client(profile=...)``),
2. ``$GPUFLEET_PROFILE``,
3. ``./.gpufleet/profile.json`` (the embedded stack started from this directory),
4. ``~/.gpufleet/profile.json``.

``GPUFLEET_ENDPOINT`` and ``GPUFLEET_REGION`` override the file's values. Credentials in the
file are optional: without them the SDK uses botocore's chain (env vars, shared files, SSO,
instance roles), optionally a named AWS profile (``aws_profile``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.errors import ConfigError

DEFAULT_STATE_DIR = ".gpufleet"
PROFILE_NAME = "profile.json"


class Profile(BaseModel):
    """Endpoint and signing settings for one gpufleet API."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(..., description="base URL of the API, e.g. http://127.0.0.1:8642")
    region: str = "us-east-1"
    service: str = Field("execute-api", description="SigV4 service name")
    aws_profile: str | None = Field(None, description="named profile for botocore's credential chain")
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    trust_anchors: str | None = Field(None, description="PEM file of C2PA trust anchors used by `gpufleet output`")
    watermark_keys: str | None = Field(None, description="watermark key file (the platform's secret; the embedded "
                                       "stack's development key) `gpufleet output` checks the watermark with")
    state_dir: str | None = Field(None, description="state directory of the embedded stack that wrote this profile")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("endpoint must start with http:// or https://")
        return v.rstrip("/")


def resolve_profile_path(explicit: str | os.PathLike[str] | None = None, *, cwd: Path | None = None) -> Path | None:
    """The profile file to use, or ``None`` when there is none (see the module docstring)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("GPUFLEET_PROFILE")
    if env:
        return Path(env)
    for candidate in (
        (cwd or Path.cwd()) / DEFAULT_STATE_DIR / PROFILE_NAME,
        Path.home() / DEFAULT_STATE_DIR / PROFILE_NAME,
    ):
        if candidate.is_file():
            return candidate
    return None


def load_profile(explicit: str | os.PathLike[str] | None = None) -> Profile:
    """Load the profile, applying ``GPUFLEET_ENDPOINT`` / ``GPUFLEET_REGION`` overrides.

    Raises :class:`ConfigError` (one clear line) when nothing says where the API is, or when
    the file is unreadable or invalid.
    """
    path = resolve_profile_path(explicit)
    data: dict = {}
    if path is not None:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"profile {path} does not exist (start the local stack with `gpufleet dev`)")
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"cannot read profile {path}: {err}")
        if not isinstance(data, dict):
            raise ConfigError(f"profile {path} must hold a JSON object")
    if os.environ.get("GPUFLEET_ENDPOINT"):
        data["endpoint"] = os.environ["GPUFLEET_ENDPOINT"]
    if os.environ.get("GPUFLEET_REGION"):
        data["region"] = os.environ["GPUFLEET_REGION"]
    if "endpoint" not in data:
        raise ConfigError(
            "no gpufleet endpoint configured: start the local stack with `gpufleet dev`, "
            "or set GPUFLEET_ENDPOINT, or pass --profile"
        )
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "profile"
        raise ConfigError(f"invalid profile {path or '(environment)'}: {where}: {first['msg']}")


def write_profile(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` atomically with mode 0600 (it may hold credentials)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(profile.model_dump_json(indent=2, exclude_none=True))
    os.replace(tmp, target)
    return target
