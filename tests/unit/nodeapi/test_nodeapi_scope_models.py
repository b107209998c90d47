"""The published models in an attempt's session policy (pure): with the deployment's models root, the session may
read (only ``s3:GetObject``) the objects under it and nothing else is new; without one, nothing changes."""

from __future__ import annotations

import json

import pytest

from gpufleet.nodeapi import supervisor
from gpufleet.nodeapi.scope import MAX_POLICY_CHARS, models_statement, session_policy

ROOT = "s3://gf-models/models/"
BUCKETS = {"checkpoints": "ck", "outputs": "out", "logs": "lg"}
READ_MODELS = {"Sid": "ReadPublishedModels", "Effect": "Allow", "Action": ["s3:GetObject"],
               "Resource": ["arn:aws:s3:::gf-models/models/*"]}
API = "arn:aws:execute-api:us-east-1:123456789012:api1"


def _size(policy: dict) -> int:
    return len(json.dumps(policy, separators=(",", ":")))


def test_a_models_root_adds_one_read_only_statement_on_its_prefix_and_nothing_else():
    inputs = ["s3://out/tenants/t/a.bin"]
    plain = session_policy("j1", **BUCKETS, inputs=inputs)
    with_models = session_policy("j1", **BUCKETS, inputs=inputs, models=ROOT)
    new = [s for s in with_models["Statement"] if s not in plain["Statement"]]
    assert new == [READ_MODELS]
    assert [s for s in with_models["Statement"] if s != READ_MODELS] == plain["Statement"]


def test_without_a_models_root_the_policy_names_no_models():
    plain = session_policy("j1", **BUCKETS, inputs=["s3://out/tenants/t/a.bin"])
    assert [s["Sid"] for s in plain["Statement"]] == ["WriteAttemptObjects", "ReadAttemptObjects",
                                                      "ListAttemptCheckpoints"]
    assert "models" not in json.dumps(plain)
    assert session_policy("j1", **BUCKETS, models="") == session_policy("j1", **BUCKETS)


@pytest.mark.parametrize("partition", ["aws", "aws-cn"])
def test_the_models_statement_follows_the_partition(partition):
    policy = session_policy("j1", **BUCKETS, models=ROOT, partition=partition)
    (read,) = [s for s in policy["Statement"] if s["Sid"] == "ReadPublishedModels"]
    assert read["Resource"] == [f"arn:{partition}:s3:::gf-models/models/*"]


@pytest.mark.parametrize("n", range(0, 90, 3))
def test_the_models_statement_counts_toward_the_size_limit(n):
    """Inputs collapse when the policy with the models statement would exceed AWS's limit (not only without it)."""
    inputs = [f"s3://out/tenants/t/in/{i:03d}.bin" for i in range(n)]
    policy = session_policy("j1", **BUCKETS, inputs=inputs, models=ROOT)
    assert READ_MODELS in policy["Statement"]
    assert _size(policy) <= MAX_POLICY_CHARS


def test_collapse_happens_sooner_with_the_models_statement():
    """Some number of inputs fits without the models statement but not with it: then the inputs collapse."""
    def named(policy: dict) -> int:
        return sum(1 for s in policy["Statement"] for r in s["Resource"] if "/tenants/t/in/" in r)

    for n in range(2, 200):  # two or more inputs: one input is named once either way
        inputs = [f"s3://out/tenants/t/in/{i:03d}.bin" for i in range(n)]
        plain, with_models = (session_policy("j1", **BUCKETS, inputs=inputs),
                              session_policy("j1", **BUCKETS, inputs=inputs, models=ROOT))
        if named(plain) == n and named(with_models) == 1:
            break
    else:
        raise AssertionError("the models statement never changed the collapse decision")
    assert _size(with_models) <= MAX_POLICY_CHARS


@pytest.mark.parametrize("root", ["s3://gf-models", "s3://gf-models/", "s3://gf-models/models", "gf-models/models/",
                                  "https://gf-models/models/", "s3://gf-models/*/", "s3:///models/"])
def test_a_root_that_is_not_a_bucket_prefix_is_refused(root):
    with pytest.raises(ValueError, match="models root"):
        models_statement(root)
    with pytest.raises(ValueError):
        session_policy("j1", **BUCKETS, models=root)


def test_the_cloud_supervisors_session_reads_the_models_too():
    plain = supervisor.session_policy("job-1", 3, **BUCKETS, api_arn=API)
    with_models = supervisor.session_policy("job-1", 3, **BUCKETS, api_arn=API, models=ROOT)
    assert [s for s in with_models["Statement"] if s not in plain["Statement"]] == [READ_MODELS]
    assert "models" not in json.dumps(plain)
    # its routes are still its attempt's only
    (invoke,) = [s for s in with_models["Statement"] if s["Sid"] == "InvokeAttemptRoutes"]
    assert invoke["Resource"] == [f"{API}/*/POST/v1/node/jobs/job-1/attempts/3/*"]
