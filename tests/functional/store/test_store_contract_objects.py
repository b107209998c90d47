"""Contract of :class:`gpufleet.store.objects.Checkpoints`, :class:`gpufleet.store.objects.JobOutputs` and
:class:`gpufleet.store.credentials.CredentialVendor`, on the fakes and on moto (S3, STS).

- ``mark_ended`` tags every object of the job (``jobs/<job_id>/``, not ``jobs/<job_id>0/``) with
  ``gpufleet:job-ended=true``, keeps their other tags, and counts only those it tagged now (a second call: 0).
- ``list`` gives ``(key, size)`` under a ``jobs/`` prefix in key order, at most ``limit`` + 1 (so the caller sees
  that there are more); any other prefix is refused.
- ``vend`` asks for the role with the session policy and a session name STS accepts (other characters become
  ``-``, at most 64), and returns fresh keys expiring after the configured duration.
"""

from __future__ import annotations

import time

import pytest
from store_backends import ROLE_ARN

from gpufleet.store.fakes.credentials import Vend


def test_mark_ended_tags_the_jobs_objects_once_keeping_their_tags(objects):
    objects.put("checkpoints", "jobs/j1/attempt-0001/ckpt-000010.pt", b"x" * 10, {"team": "a"})
    objects.put("checkpoints", "jobs/j1/attempt-0002/ckpt-000020.pt", b"y", {"gpufleet:job-ended": "false"})
    objects.put("checkpoints", "jobs/j10/attempt-0001/ckpt-000010.pt", b"z")
    assert objects.checkpoints.mark_ended("j1") == 2
    assert objects.tags("checkpoints", "jobs/j1/attempt-0001/ckpt-000010.pt") == {
        "team": "a",
        "gpufleet:job-ended": "true",
    }
    assert objects.tags("checkpoints", "jobs/j1/attempt-0002/ckpt-000020.pt") == {"gpufleet:job-ended": "true"}
    assert objects.tags("checkpoints", "jobs/j10/attempt-0001/ckpt-000010.pt") == {}
    assert objects.checkpoints.mark_ended("j1") == 0
    objects.put("checkpoints", "jobs/j1/attempt-0003/ckpt-000030.pt", b"w")  # written after the first call
    assert objects.checkpoints.mark_ended("j1") == 1
    assert objects.checkpoints.mark_ended("nobody") == 0


def test_outputs_are_listed_in_key_order_up_to_one_past_the_limit(objects):
    for name, size in (("b.png", 3), ("a.png", 5), ("sub/c.txt", 0), ("a.png.json", 2)):
        objects.put("outputs", f"jobs/j1/output/e1/{name}", b"." * size)
    objects.put("outputs", "jobs/j1/output/e2/old.png", b"..")
    objects.put("outputs", "jobs/j10/output/e1/x.png", b".")
    everything = [
        ("jobs/j1/output/e1/a.png", 5),
        ("jobs/j1/output/e1/a.png.json", 2),
        ("jobs/j1/output/e1/b.png", 3),
        ("jobs/j1/output/e1/sub/c.txt", 0),
    ]
    assert objects.outputs.list("jobs/j1/output/e1/", 10) == everything
    assert objects.outputs.list("jobs/j1/output/e1/", 2) == everything[:3]  # limit + 1: "there are more"
    assert objects.outputs.list("jobs/j1/output/e9/", 10) == []
    with pytest.raises(ValueError):
        objects.outputs.list("other/j1/", 10)


def test_vend_asks_for_the_role_with_the_policy_and_a_valid_session_name(objects):
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::inputs/jobs/j1/*"}],
    }
    first = objects.vendor.vend(session_name="node:gpu-01/job j1 e1", policy=policy)
    second = objects.vendor.vend(session_name="n" * 80, policy={})
    assert {k: type(v) for k, v in first.items()} == {
        "access_key_id": str,
        "secret_access_key": str,
        "session_token": str,
        "expiration": float,
    }
    assert first["access_key_id"] != second["access_key_id"] and first["session_token"] != second["session_token"]
    assert abs(first["expiration"] - (time.time() + 900)) < 60
    assert objects.vended() == [Vend(ROLE_ARN, "node-gpu-01-job-j1-e1", policy, 900), Vend(ROLE_ARN, "n" * 64, {}, 900)]
