"""The per-attempt object scope a node's runtime works in (pure): an IAM session policy.

Contract: :func:`session_policy` returns the inline session policy the node API passes to
``sts:AssumeRole`` of the node-job role when it vends an attempt's credentials. The effective
permissions are the intersection of the role's policy and this one, so the credentials can only:
- put objects under ``jobs/<job_id>/`` of the checkpoints, outputs and logs buckets;
- get objects (and versions) under ``jobs/<job_id>/`` of the checkpoints and outputs buckets, and the
  job's declared inputs (each named exactly; when the policy would exceed :data:`MAX_POLICY_CHARS`
  the inputs of one bucket collapse to their longest common key prefix);
- list the checkpoints bucket under ``jobs/<job_id>/`` only;
- with ``models`` (the deployment's ``GPUFLEET_MODEL_S3_ROOT``, ``s3://bucket/prefix/``), get objects under that
  prefix: the published models, platform content any attempt may read (never write, never list). An empty
  ``models`` adds nothing; a value that is not an ``s3://bucket/prefix/`` URI is refused (ValueError): a
  bucket-wide or malformed grant is never made.
Nothing bucket-wide, nothing of another job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

#: AWS's limit on the plain-text size of an inline session policy
MAX_POLICY_CHARS = 2048


def _inputs(uris: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for uri in uris:
        base = uri.split("?versionId=")[0]
        if not base.startswith("s3://"):
            continue
        bucket, _, key = base[len("s3://"):].partition("/")
        if bucket and key:
            out.setdefault(bucket, []).append(key)
    return out


def models_statement(models: str, partition: str = "aws") -> dict[str, Any] | None:
    """Read-only access to the published models under ``models`` (``s3://bucket/prefix/``); None when empty."""
    if not models:
        return None
    bucket, _, prefix = models.removeprefix("s3://").partition("/") if models.startswith("s3://") else ("", "", "")
    if not bucket or not prefix or not prefix.endswith("/") or "*" in models or "?" in models:
        raise ValueError(f"models root must be s3://bucket/prefix/, got {models!r}")
    return {"Sid": "ReadPublishedModels", "Effect": "Allow", "Action": ["s3:GetObject"],
            "Resource": [f"arn:{partition}:s3:::{bucket}/{prefix}*"]}


def session_policy(job_id: str, *, checkpoints: str, outputs: str, logs: str,
                   inputs: Iterable[str] = (), partition: str = "aws", models: str = "",
                   extra: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """The session policy of one attempt of ``job_id`` (see module); ``extra`` statements are appended (and
    counted when deciding whether the inputs collapse)."""
    read_models = models_statement(models, partition)
    extra = ([read_models] if read_models else []) + list(extra)
    arn = f"arn:{partition}:s3:::"
    prefix = f"jobs/{job_id}/"
    by_bucket = _inputs(inputs)

    def build(collapse: bool) -> dict[str, Any]:
        reads = [f"{arn}{checkpoints}/{prefix}*", f"{arn}{outputs}/{prefix}*"]
        for bucket, keys in sorted(by_bucket.items()):
            if collapse and len(keys) > 1:
                reads.append(f"{arn}{bucket}/{os.path.commonprefix(keys)}*")
            else:
                reads += [f"{arn}{bucket}/{k}" for k in sorted(set(keys))]
        return {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "WriteAttemptObjects", "Effect": "Allow", "Action": ["s3:PutObject", "s3:PutObjectTagging"],
                 "Resource": [f"{arn}{b}/{prefix}*" for b in (checkpoints, outputs, logs)]},
                {"Sid": "ReadAttemptObjects", "Effect": "Allow", "Action": ["s3:GetObject", "s3:GetObjectVersion"],
                 "Resource": list(dict.fromkeys(reads))},
                {"Sid": "ListAttemptCheckpoints", "Effect": "Allow", "Action": ["s3:ListBucket"],
                 "Resource": [f"{arn}{checkpoints}"], "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}},
                *extra,
            ],
        }

    policy = build(False)
    if len(json.dumps(policy, separators=(",", ":"))) > MAX_POLICY_CHARS:
        policy = build(True)
    return policy
