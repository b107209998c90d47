"""S3 adapter for what the API serves from buckets (log chunks, presigned output links) and for the
checkpoint retention tag the lifecycle sets when a job ends.

Contract:
- Log chunks live at ``jobs/<job_id>/attempt-<epoch:04d>/<seq:08d>.log`` (JSON
  lines, docs/contracts.md). A *position* ``<epoch:04d>/<seq:08d>`` names one
  chunk; :func:`read_log_chunks` returns the lines of the chunks strictly after
  a position, in key order (attempt, then sequence), and the position of the
  last chunk read (or the given one when nothing is new), so callers follow a
  job's logs by passing it back. A malformed position is a BadRequest.
- :func:`presign_get` returns a GET URL valid for at most 15 minutes; build the
  client with :func:`s3_client` (SigV4 query signing, ``X-Amz-Expires``).
- :func:`mark_checkpoints_ended` (:class:`S3Checkpoints`) tags a terminal job's checkpoint objects
  ``gpufleet:job-ended=true`` so the bucket's lifecycle rule expires them. Called by every terminal
  writer of the lifecycle (Publish, MarkRejected/MarkFailed, ClassifyFailure's terminal branch).
- :class:`S3JobOutputs` (:class:`JobOutputs`) lists the files a container job published under its
  ``jobs/<id>/output/e<epoch>/`` prefix (CollectOutputs counts them against the per-job cap, the API
  lists them with presigned links).
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpufleet.errors import BadRequest
from gpufleet.store.clients import client
from gpufleet.store.dynamo import error_code, reraise, translate_errors

MAX_PRESIGN_S = 900
_POSITION = re.compile(r"^\d{4}/\d{8}$")
_CHUNK = re.compile(r"attempt-(\d{4})/(\d{8})\.log$")


def s3_client(region: str | None = None):
    """An S3 client that presigns with SigV4 (honours ``AWS_ENDPOINT_URL`` like every boto3 client)."""
    return client("s3", region=region, signature_version="s3v4")


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
        reraise(err)
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


#: the tag the checkpoints bucket's lifecycle rule expires objects by (see infra/data.py)
ENDED_TAG = ("gpufleet:job-ended", "true")


def mark_checkpoints_ended(s3, bucket: str, job_id: str) -> int:
    """Tag every object under ``jobs/<job_id>/`` in ``bucket`` with :data:`ENDED_TAG`, keeping their
    other tags, so the bucket's lifecycle rule expires them. Idempotent; returns how many it tagged."""
    key, value = ENDED_TAG
    tagged = 0
    kwargs = {"Bucket": bucket, "Prefix": log_prefix(job_id)}
    while True:
        page = s3.list_objects_v2(**kwargs)
        for obj in page.get("Contents", []):
            tags = s3.get_object_tagging(Bucket=bucket, Key=obj["Key"]).get("TagSet", [])
            if {"Key": key, "Value": value} in tags:
                continue
            tags = [t for t in tags if t["Key"] != key] + [{"Key": key, "Value": value}]
            s3.put_object_tagging(Bucket=bucket, Key=obj["Key"], Tagging={"TagSet": tags})
            tagged += 1
        if not page.get("IsTruncated"):
            return tagged
        kwargs["ContinuationToken"] = page["NextContinuationToken"]


class Checkpoints(Protocol):
    """A job's checkpoint objects, as the lifecycle's terminal writers see them."""

    def mark_ended(self, job_id: str) -> int: ...


class S3Checkpoints:
    """:class:`Checkpoints` in the checkpoints bucket (:func:`mark_checkpoints_ended`)."""

    def __init__(self, s3, bucket: str) -> None:
        self.s3 = s3
        self.bucket = bucket

    def mark_ended(self, job_id: str) -> int:
        return mark_checkpoints_ended(self.s3, self.bucket, job_id)


class JobOutputs(Protocol):
    """The files a container job left in the outputs bucket, as the lifecycle collects and the API lists them."""

    def list(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """``(key, size)`` under ``prefix`` in key order, at most ``limit`` + 1 (so a caller sees "more")."""
        ...


class S3JobOutputs:
    """:class:`JobOutputs` in the outputs bucket (``ListObjectsV2`` under a ``jobs/<id>/`` prefix)."""

    def __init__(self, s3, bucket: str) -> None:
        self.s3 = s3
        self.bucket = bucket

    def list(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        if not prefix.startswith("jobs/"):
            raise ValueError(f"output prefix {prefix!r} is not under jobs/")
        out: list[tuple[str, int]] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        with translate_errors():
            while len(out) <= limit:
                page = self.s3.list_objects_v2(**kwargs)
                out += [(o["Key"], int(o["Size"])) for o in page.get("Contents", [])]
                if not page.get("IsTruncated"):
                    break
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
        return out[: limit + 1]
