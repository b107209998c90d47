"""A BLOCKED job's raw generated output: moved by finalize to ``quarantine/`` in the outputs bucket, which no
role but the finalize stage's Batch job role (writing it) reaches, and which a lifecycle rule expires."""

from __future__ import annotations

import json

import pytest
from iam_matcher import Request, Template, allowed_by

from gpufleet.runtime.finalize import QUARANTINE_PREFIX
from infra.config import InfraConfig
from tests.infra.test_infra_template import as_list, policy_statements

pytestmark = pytest.mark.xdist_group("cdk-synth")

REGION, ACCOUNT = "us-east-1", "123456789012"
RAW = "jobs/job_00000000000000000000000000/generated/e0001.npz"


@pytest.fixture(scope="module")
def t(tpl) -> Template:
    return Template(tpl, REGION, ACCOUNT)


def _outputs(t: Template) -> str:
    (lid,) = [k for k, r in t.resources.items() if r["Type"] == "AWS::S3::Bucket" and k.startswith("DataOutputs")]
    return lid


def _roles_of(t: Template, rid: str) -> list[str]:
    r = t.resources[rid]
    if r["Type"] == "AWS::IAM::Role":
        return [rid]
    return [x["Ref"] for x in r["Properties"].get("Roles", []) if isinstance(x, dict) and "Ref" in x]


def test_the_outputs_bucket_expires_the_quarantine_prefix(t):
    rules = t.resources[_outputs(t)]["Properties"]["LifecycleConfiguration"]["Rules"]
    (rule,) = [r for r in rules if r.get("Id") == "quarantine"]
    assert rule["Prefix"] == QUARANTINE_PREFIX == "quarantine/" and rule["Status"] == "Enabled"
    assert rule["ExpirationInDays"] == InfraConfig().quarantine_retention_days
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 1


def test_only_the_finalize_roles_write_quarantined_output_and_no_role_reads_it(t):
    bucket = t.name(_outputs(t))
    held = f"arn:aws:s3:::{bucket}/{QUARANTINE_PREFIX}{RAW}"
    outputs = _outputs(t)
    reach: dict[str, list] = {}  # role -> its raw statements that name the outputs bucket or any resource
    for rid, stmt in policy_statements(t.resources and {"Resources": t.resources}):
        text = json.dumps(stmt.get("Resource", ""))
        if outputs in text or '"*"' in text or "arn:aws:s3:::*" in text:
            s3 = [a for a in as_list(stmt["Action"]) if a.startswith("s3:") or a in ("*", "s3:*")]
            if s3:
                for role in _roles_of(t, rid):
                    reach.setdefault(role, []).append(stmt)
    assert any(r.startswith("ComputeFinalizeJobRole") for r in reach) and any(r.startswith("Api") or "Api" in r for r in reach)
    writers = set()
    for role in reach:
        statements = t.role_statements(role)
        for action in ("s3:GetObject", "s3:GetObjectVersion", "s3:DeleteObject", "s3:DeleteObjectVersion",
                       "s3:PutObjectTagging", "s3:GetObjectTagging"):
            assert allowed_by(statements, Request(action, held)) == [], f"{role} may {action} quarantined output"
        if allowed_by(statements, Request("s3:PutObject", held)):
            writers.add(role)
    # the finalize stage's two roles: its CPU Batch job's and FinalizeLambda's
    assert len(writers) == 2 and {w for w in writers if w.startswith("ComputeFinalizeJobRole")} and {
        w for w in writers if w.startswith("FunctionsFinalizeServiceRole")}
    # the move deletes exactly the raw output's version under jobs/, nothing else of the job
    for job_role in writers:
        statements = t.role_statements(job_role)
        assert allowed_by(statements, Request("s3:DeleteObjectVersion", f"arn:aws:s3:::{bucket}/{RAW}"))
        assert allowed_by(statements, Request("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{RAW}"))  # unversioned
        for other in ("jobs/j/video.mp4", "jobs/j/finalize.json", "jobs/j/video.c2pa"):
            assert not allowed_by(statements, Request("s3:DeleteObjectVersion", f"arn:aws:s3:::{bucket}/{other}"))
            assert not allowed_by(statements, Request("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{other}"))
