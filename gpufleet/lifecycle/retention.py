"""Checkpoint retention (I/O): tag a terminal job's checkpoint objects so the bucket's lifecycle
rule expires them (``gpufleet:job-ended=true``, see infra/data.py).

Contract: :func:`mark_checkpoints_ended` tags every object under ``jobs/<job_id>/`` in the
checkpoints bucket, keeping their other tags, and returns how many it tagged. Idempotent. Called by
every terminal writer (Publish, MarkRejected/MarkFailed, ClassifyFailure's terminal branch).
"""

from __future__ import annotations

ENDED_TAG = ("gpufleet:job-ended", "true")


def mark_checkpoints_ended(s3, bucket: str, job_id: str) -> int:
    key, value = ENDED_TAG
    tagged = 0
    kwargs = {"Bucket": bucket, "Prefix": f"jobs/{job_id}/"}
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
