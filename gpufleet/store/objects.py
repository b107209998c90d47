"""S3 adapter for what the API serves from buckets: log chunks and presigned output links.

Contract:
- Log chunks live at ``jobs/<job_id>/attempt-<epoch:04d>/<seq:08d>.log`` (JSON
  lines, docs/contracts.md). A *position* ``<epoch:04d>/<seq:08d>`` names one
  chunk; :func:`read_log_chunks` returns the lines of the chunks strictly after
  a position, in key order (attempt, then sequence), and the position of the
  last chunk read (or the given one when nothing is new), so callers follow a
  job's logs by passing it back. A malformed position is a BadRequest.
- :func:`presign_get` returns a GET URL valid for at most 15 minutes; build the
  client with :func:`s3_client` (SigV4 query signing, ``X-Amz-Expires``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from gpufleet.errors import BadRequest
from gpufleet.store.dynamo import error_code

MAX_PRESIGN_S = 900
_POSITION = re.compile(r"^\d{4}/\d{8}$")
_CHUNK = re.compile(r"attempt-(\d{4})/(\d{8})\.log$")


def s3_client(region: str | None = None):
    """An S3 client that presigns with SigV4 (honours ``AWS_ENDPOINT_URL`` like every boto3 client)."""
    import os

    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    cfg = Config(signature_version="s3v4", retries={"max_attempts": 5, "mode": "standard"})
    return boto3.client("s3", region_name=region, config=cfg)


def log_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/"


def chunk_key(job_id: str, epoch: int, seq: int) -> str:
    return f"jobs/{job_id}/attempt-{epoch:04d}/{seq:08d}.log"


def _parse_line(raw: str) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError:
        return {"msg": raw}
    return obj if isinstance(obj, dict) else {"msg": raw}


def read_log_chunks(
    s3, bucket: str, job_id: str, after: str | None = None, max_chunks: int = 20
) -> tuple[list[dict[str, Any]], str | None]:
    """(lines, next position) for the chunks after ``after`` (see module doc)."""
    if after is not None and not _POSITION.match(after):
        raise BadRequest("`after` must be a position returned by this endpoint (<epoch:4>/<seq:8>)", param="after")
    prefix = log_prefix(job_id)
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": max_chunks}
    if after:
        epoch, seq = after.split("/")
        kwargs["StartAfter"] = f"{prefix}attempt-{epoch}/{seq}.log"
    try:
        listing = s3.list_objects_v2(**kwargs)
    except ClientError as err:
        if error_code(err) == "NoSuchBucket":
            return [], after
        raise
    lines: list[dict[str, Any]] = []
    position = after
    for obj in listing.get("Contents", []):
        m = _CHUNK.search(obj["Key"])
        if not m:
            continue
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read().decode("utf-8", "replace")
        lines += [_parse_line(raw) for raw in body.splitlines() if raw.strip()]
        position = f"{m.group(1)}/{m.group(2)}"
    return lines, position


def presign_get(s3, bucket: str, key: str, ttl_s: int) -> str:
    """A presigned GET URL for ``s3://bucket/key`` valid for ``min(ttl_s, 900)`` seconds."""
    return s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=min(int(ttl_s), MAX_PRESIGN_S)
    )
