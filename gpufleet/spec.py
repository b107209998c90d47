"""The job specification submitted by users (pydantic v2).

Contract: a ``JobSpec`` that validates is safe to persist and schedule. Every
limit is a named constant in :data:`LIMITS` (documented in docs/api.md) and is
enforced here, nowhere else. Unknown fields are rejected.

- Every string and list is bounded, and the whole spec serialized (canonical
  JSON, as stored) is at most ``spec_max_bytes`` (64 KiB): a job item always
  fits a DynamoDB item, whatever the combination of fields.
- ``video.generate``: frames 4k+1, sides multiples of 16, and frames, sides and
  steps within what the named model can generate (:mod:`gpufleet.models.limits`).
- ``container``: ``env`` names match ``[A-Z][A-Z0-9_]*`` and are neither a
  reserved name (:data:`RESERVED_ENV_NAMES`) nor start with a reserved prefix
  (:data:`RESERVED_ENV_PREFIXES`): the runtime owns the process environment
  (loader, interpreter, platform identity and credentials, job contract, GPUs).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpufleet.models.limits import ModelLimits, limits_for

#: Every user-visible limit, in one place.
LIMITS: dict[str, int | float] = {
    "prompt_max_chars": 2000,
    "negative_prompt_max_chars": 2000,
    "frames_min": 1,
    "frames_max": 257,
    "width_min": 64,
    "width_max": 1920,
    "height_min": 64,
    "height_max": 1920,
    "resolution_multiple": 16,
    "steps_min": 1,
    "steps_max": 200,
    "guidance_max": 30.0,
    "seed_max": 2**32 - 1,
    "labels_max": 32,
    "label_key_max_chars": 63,
    "label_value_max_chars": 256,
    "command_max_args": 256,
    "command_arg_max_chars": 4096,
    "env_max_vars": 64,
    "env_value_max_chars": 4096,
    "env_key_max_chars": 128,
    "image_max_chars": 512,
    "gpus_max": 64,
    "nodes_max": 64,
    "cpu_max": 512,
    "memory_gb_max": 4096,
    "gpu_memory_gb_max": 1024,
    "inputs_max": 64,
    "input_uri_max_chars": 1024,
    "residency_max": 16,
    "residency_max_chars": 64,
    "checkpoint_dir_max_chars": 1024,
    "spec_max_bytes": 65536,
    "priority_min": 0,
    "priority_max": 1000,
    "checkpoint_interval_min_s": 10,
    "checkpoint_interval_max_s": 86400,
    "webhook_url_max_chars": 2048,
    "model_max_chars": 256,
    "pools_max": 16,
    "pool_name_max_chars": 64,
}

GPU_TYPES = ("any", "A10G", "L4", "L40S", "A100", "H100", "H200", "T4", "V100", "P100", "G1", "G2", "G3")
#: memory (GB) of the smallest variant of each GPU model: ``resources.gpu_memory_gb`` is honoured through the
#: model (the scheduler places by model), so a request names a model with at least that much (docs/api.md)
GPU_MEMORY_GB: dict[str, float] = {"T4": 16, "V100": 16, "P100": 16, "A10G": 24, "L4": 24, "A100": 40, "L40S": 48,
                                   "H100": 80, "H200": 141}


def gpu_models_with(memory_gb: float) -> list[str]:
    """The GPU models with at least ``memory_gb`` GB, smallest first."""
    return sorted((t for t, m in GPU_MEMORY_GB.items() if m >= memory_gb), key=lambda t: (GPU_MEMORY_GB[t], t))

_LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]*[a-z0-9])?$")
_ENV_KEY = re.compile(r"^[A-Z][A-Z0-9_]*$")
#: env names a spec may not set: the runtime sets them, or they change how the loader/interpreter runs
RESERVED_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "HOSTNAME", "PWD", "TMPDIR",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
})
#: env name prefixes a spec may not use (credentials, the dynamic loader, the interpreter, the job contract)
RESERVED_ENV_PREFIXES = ("AWS_", "LD_", "PYTHON", "GPUFLEET_")
#: an OCI image reference: [registry[:port]/]path[:tag][@sha256:digest]
_IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)*(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?"
                        r"(@sha256:[0-9a-f]{64})?$")
#: container paths the runtime mounts; a checkpoint_dir may not be (under) one of them
_RESERVED_DIRS = ("/proc", "/sys", "/dev", "/job", "/tmp", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64")
#: the pool-name pattern of :class:`gpufleet.pools.Pool` (pools.py imports this module, so it lives here)
POOL_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]/\S+$")

PoolName = Annotated[
    str, StringConstraints(min_length=1, max_length=int(LIMITS["pool_name_max_chars"]), pattern=POOL_NAME_PATTERN)
]
Prompt = Annotated[str, StringConstraints(min_length=1, max_length=int(LIMITS["prompt_max_chars"]))]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlacementPolicy(StrEnum):
    COST = "cost"
    LATENCY = "latency"
    LOCALITY = "locality"


class WebhookEvent(StrEnum):
    STARTED = "started"
    PROGRESS = "progress"
    COMPLETED = "completed"


class VideoGenerate(_Strict):
    """Text-to-video generation with a diffusers Wan pipeline."""

    kind: Literal["video.generate"] = "video.generate"
    prompt: Prompt
    negative_prompt: str = Field("", max_length=int(LIMITS["negative_prompt_max_chars"]))
    model: str = Field("wan-tiny", min_length=1, max_length=int(LIMITS["model_max_chars"]))
    frames: int = Field(9, ge=int(LIMITS["frames_min"]), le=int(LIMITS["frames_max"]))
    width: int = Field(256, ge=int(LIMITS["width_min"]), le=int(LIMITS["width_max"]))
    height: int = Field(256, ge=int(LIMITS["height_min"]), le=int(LIMITS["height_max"]))
    steps: int = Field(10, ge=int(LIMITS["steps_min"]), le=int(LIMITS["steps_max"]))
    seed: int = Field(0, ge=0, le=int(LIMITS["seed_max"]))
    guidance: float = Field(5.0, ge=0.0, le=float(LIMITS["guidance_max"]))

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("prompt must not be blank")
        if any(ord(c) < 32 and c not in "\n\t" for c in v):
            raise ValueError("prompt must not contain control characters")
        return v

    # Field validators (not one model validator) so that a problem names the field; ``model`` is
    # declared before these fields, so it is in ``info.data`` when it is valid.
    @field_validator("frames")
    @classmethod
    def _frames(cls, v: int, info: ValidationInfo) -> int:
        # Wan's temporal VAE compresses 4 frames: frame counts are 4k+1.
        if (v - 1) % 4:
            raise ValueError("frames must be of the form 4k+1 (1, 5, 9, 13, ...)")
        model = info.data.get("model", "")
        most = _model_limits(model).frames_max
        if v > most:
            raise ValueError(f"model {model!r} generates at most {most} frames")
        return v

    @field_validator("width", "height")
    @classmethod
    def _side(cls, v: int, info: ValidationInfo) -> int:
        m = int(LIMITS["resolution_multiple"])
        if v % m:
            raise ValueError(f"width and height must be multiples of {m}")
        model = info.data.get("model", "")
        most = _model_limits(model).side_max
        if v > most:
            raise ValueError(f"model {model!r} generates at most {most} px a side")
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: int, info: ValidationInfo) -> int:
        model = info.data.get("model", "")
        most = _model_limits(model).steps_max
        if v > most:
            raise ValueError(f"model {model!r} runs at most {most} steps")
        return v


def _model_limits(model: str) -> ModelLimits:
    return limits_for(model, int(LIMITS["frames_max"]), min(int(LIMITS["width_max"]), int(LIMITS["height_max"])),
                      int(LIMITS["steps_max"]))


class ContainerJob(_Strict):
    """A generic container job (training, batch inference)."""

    kind: Literal["container"] = "container"
    image: str = Field(..., min_length=1, max_length=int(LIMITS["image_max_chars"]),
                       description="OCI image reference; the site's image allowlist decides which may run")
    command: list[Annotated[str, StringConstraints(max_length=int(LIMITS["command_arg_max_chars"]))]] = Field(
        ..., min_length=1, max_length=int(LIMITS["command_max_args"])
    )
    env: dict[str, Annotated[str, StringConstraints(max_length=int(LIMITS["env_value_max_chars"]))]] = Field(
        default_factory=dict
    )
    checkpoint_dir: str | None = Field(None, max_length=int(LIMITS["checkpoint_dir_max_chars"]),
                                       description="where the job's checkpoint directory is mounted in the container "
                                       "(default /job/checkpoint)")
    checkpoint_interval_s: int = Field(
        600, ge=int(LIMITS["checkpoint_interval_min_s"]), le=int(LIMITS["checkpoint_interval_max_s"])
    )

    @field_validator("image")
    @classmethod
    def _image_ref(cls, v: str) -> str:
        if not _IMAGE_REF.match(v):
            raise ValueError(f"invalid image reference {v!r} (expected [registry/]path[:tag][@sha256:<digest>])")
        return v

    @field_validator("env")
    @classmethod
    def _env_keys(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > int(LIMITS["env_max_vars"]):
            raise ValueError(f"at most {LIMITS['env_max_vars']} environment variables")
        for k in v:
            if len(k) > int(LIMITS["env_key_max_chars"]) or not _ENV_KEY.match(k):
                raise ValueError(f"invalid environment variable name {k[:64]!r}: names match [A-Z][A-Z0-9_]* "
                                 f"(at most {LIMITS['env_key_max_chars']} characters)")
            if k in RESERVED_ENV_NAMES:
                raise ValueError(f"environment variable {k!r} is reserved (set by the runtime)")
            prefix = next((p for p in RESERVED_ENV_PREFIXES if k.startswith(p)), None)
            if prefix is not None:
                raise ValueError(f"environment variable {k!r} is reserved: names starting with {prefix} are "
                                 "not allowed")
        return v

    @field_validator("checkpoint_dir")
    @classmethod
    def _abs_dir(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/"):
            raise ValueError("checkpoint_dir must be an absolute path")
        parts = v.split("/")
        if any(p in (".", "..") for p in parts) or "//" in v or "\0" in v or ":" in v or "," in v:
            raise ValueError("checkpoint_dir must be a normalized path without '.', '..', ':' or ','")
        norm = v.rstrip("/") or "/"
        if norm == "/" or any(norm == d or norm.startswith(d + "/") for d in _RESERVED_DIRS):
            raise ValueError(f"checkpoint_dir may not be / or under {', '.join(_RESERVED_DIRS)}")
        return norm


Workload = Annotated[Union[VideoGenerate, ContainerJob], Field(discriminator="kind")]


class Resources(_Strict):
    """What one node of the job needs. ``gpus`` may be fractional below 1 (a GPU share)."""

    gpus: float = Field(1, gt=0, le=int(LIMITS["gpus_max"]))
    gpu_type: str = Field("any")
    gpu_memory_gb: float | None = Field(None, gt=0, le=int(LIMITS["gpu_memory_gb_max"]))
    cpu: float = Field(1, gt=0, le=int(LIMITS["cpu_max"]))
    memory_gb: float = Field(4, gt=0, le=int(LIMITS["memory_gb_max"]))
    nodes: int = Field(1, ge=1, le=int(LIMITS["nodes_max"]))

    @field_validator("gpus")
    @classmethod
    def _gpu_shape(cls, v: float) -> float:
        if v > 1 and v != int(v):
            raise ValueError("gpus above 1 must be a whole number")
        if v < 1 and round(v * 1000) != v * 1000:
            raise ValueError("fractional gpus are in steps of 0.001")
        return v

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, v: str) -> str:
        if v not in GPU_TYPES:
            raise ValueError(f"gpu_type must be one of {', '.join(GPU_TYPES)}")
        return v

    @model_validator(mode="after")
    def _gpu_memory(self) -> Resources:
        """``gpu_memory_gb`` is honoured through the GPU model: it must name one with that much memory."""
        want = self.gpu_memory_gb
        if want is None:
            return self
        fits = gpu_models_with(want)
        if not fits:
            raise ValueError(f"gpu_memory_gb {want:g}: no GPU model has that much memory (largest: "
                             f"{max(GPU_MEMORY_GB.values()):g} GB)")
        if self.gpu_type == "any":
            raise ValueError(f"gpu_memory_gb {want:g} needs a gpu_type with that much memory: one of "
                             f"{', '.join(fits)} (the scheduler places by GPU model)")
        have = GPU_MEMORY_GB.get(self.gpu_type)
        if have is None or have < want:
            raise ValueError(f"gpu_type {self.gpu_type} has {'unknown' if have is None else f'{have:g} GB'} memory; "
                             f"gpu_memory_gb {want:g} needs one of {', '.join(fits)}")
        return self

    @property
    def gpu_milli(self) -> int:
        """GPU request in thousandths of a GPU, per node."""
        return int(round(self.gpus * 1000))


class Data(_Strict):
    inputs: list[Annotated[str, StringConstraints(max_length=int(LIMITS["input_uri_max_chars"]))]] = Field(
        default_factory=list, max_length=int(LIMITS["inputs_max"]),
        description="s3:// objects staged read-only into the job's input directory; only the tenant's own "
        "prefix (s3://<bucket>/tenants/<tenant>/...) or buckets registered to the tenant")
    residency: list[Annotated[str, StringConstraints(min_length=1, max_length=int(LIMITS["residency_max_chars"]))]] = (
        Field(default_factory=list, max_length=int(LIMITS["residency_max"]), description="allowed regions/sites"))

    @field_validator("inputs")
    @classmethod
    def _s3(cls, v: list[str]) -> list[str]:
        for uri in v:
            base = uri.split("?versionId=")[0]
            if not _S3_URI.match(base):
                raise ValueError(f"input must be an s3:// URI: {uri!r}")
        return v


class Webhook(_Strict):
    url: AnyHttpUrl
    events: list[WebhookEvent] = Field(default_factory=lambda: [WebhookEvent.COMPLETED], min_length=1,
                                       max_length=len(WebhookEvent))

    @field_validator("url")
    @classmethod
    def _len(cls, v: AnyHttpUrl) -> AnyHttpUrl:
        if len(str(v)) > int(LIMITS["webhook_url_max_chars"]):
            raise ValueError("webhook url too long")
        return v


class JobSpec(_Strict):
    """A job as submitted to ``POST /v1/jobs``."""

    workload: Workload
    resources: Resources = Field(default_factory=Resources)
    priority: int = Field(100, ge=int(LIMITS["priority_min"]), le=int(LIMITS["priority_max"]))
    placement_policy: PlacementPolicy | None = None
    data: Data = Field(default_factory=Data)
    deadline: datetime | None = None
    #: the longest one attempt may run (seconds from its start on a worker); past it the attempt is stopped
    #: and the job ends FAILED with outcome TIMED_OUT (docs/lifecycle.md). None: the deployment's run timeout.
    max_run_seconds: int | None = Field(None, ge=1, le=604800)
    webhook: Webhook | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    pools: list[PoolName] = Field(
        default_factory=list,
        max_length=int(LIMITS["pools_max"]),
        description="pool allowlist: the job runs only on these pools (as listed by GET /v1/pools); empty = any pool",
    )

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > int(LIMITS["labels_max"]):
            raise ValueError(f"at most {LIMITS['labels_max']} labels")
        for k, val in v.items():
            if len(k) > int(LIMITS["label_key_max_chars"]) or not _LABEL_KEY.match(k):
                raise ValueError(f"invalid label key {k!r}")
            if len(val) > int(LIMITS["label_value_max_chars"]):
                raise ValueError(f"label {k!r} value too long")
        return v

    @field_validator("deadline")
    @classmethod
    def _tz(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("deadline must include a timezone")
        return v

    @model_validator(mode="after")
    def _size(self) -> JobSpec:
        cap = int(LIMITS["spec_max_bytes"])
        data = self.model_dump(mode="json", exclude_none=True)
        size = _json_size(data)
        if size > cap:
            raise ValueError(f"the job spec is {size} bytes serialized; at most {cap} (spec_max_bytes); "
                             f"largest field: {_largest_field(data)}")
        return self

    def fingerprint(self) -> str:
        """Stable SHA-256 of the canonical JSON form (used for idempotency payload checks)."""
        return payload_hash(self.model_dump(mode="json"))


def payload_hash(payload: Any) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _json_size(value: Any) -> int:
    return len(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())


def _largest_field(data: dict[str, Any], prefix: str = "") -> str:
    """Dotted path of the largest field (descending into objects), so a size problem names it."""
    name, value = max(data.items(), key=lambda kv: _json_size(kv[1]))
    path = f"{prefix}{name}"
    if isinstance(value, dict) and value and path.count(".") < 2:
        return _largest_field(value, path + ".")
    return path
