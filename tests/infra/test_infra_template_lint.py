"""Linters on the synthesized template: cfn-lint reports no error; no IAM statement grants a
constrainable action on ``*`` (checkov's CKV_AWS_111, "write access without constraints", re-implemented
here, stricter: any action on ``*``, not only write actions, must be one that IAM cannot scope).

checkov itself is not a dependency: it pins ``boto3==1.35.49`` and ``networkx<2.7``, which conflict with
the project's pinned boto3/botocore and networkx. Its rule reads each ``AWS::IAM::Policy`` /
``ManagedPolicy`` / ``Role`` / ``User`` / ``Group`` policy document and fails on Allow statements with
``Resource: "*"`` whose write-level actions support resource-level permissions (cloudsplaining's
``write_actions_without_constraints``); :data:`UNSCOPABLE` lists the actions on ``*`` this template
holds, each of which IAM's service authorization reference lists without a resource type.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("cdk-synth")

#: actions that take no resource-level permissions (Resource must be "*"), and who holds them
UNSCOPABLE = {
    "xray:PutTraceSegments": "every function and the workflow (active tracing)",
    "xray:PutTelemetryRecords": "same",
    "xray:GetSamplingRules": "the workflow (tracing)",
    "xray:GetSamplingTargets": "the workflow (tracing)",
    "logs:CreateLogDelivery": "the workflow's vended log delivery (CDK)",
    "logs:GetLogDelivery": "same",
    "logs:UpdateLogDelivery": "same",
    "logs:DeleteLogDelivery": "same",
    "logs:ListLogDeliveries": "same",
    "logs:PutResourcePolicy": "same",
    "logs:DescribeResourcePolicies": "same",
    "logs:DescribeLogGroups": "same",
    "ecr:GetAuthorizationToken": "Batch containers pulling the GPU image",
    "batch:ListJobs": "the API finds a cancelled job's Batch jobs by name",
    "batch:DescribeJobs": "the workflow's RunCloudGang polls its multi-node parallel job",
    "batch:DescribeJobDefinitions": "RunCloudContainer's dispatch finds an image's registered definition",
    "dynamodb:ListStreams": "stream event sources (outbox, webhook events); returns stream ARNs only",
}

#: where cfn-lint checks the template (regions with the GPU instance types and services the stack uses)
LINT_REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]

IAM_TYPES = ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group")


def _documents(resource: dict) -> list[dict]:
    props = resource.get("Properties", {})
    if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        return [props["PolicyDocument"]]
    return [p["PolicyDocument"] for p in props.get("Policies", [])]


def _listed(x) -> list:
    return x if isinstance(x, list) else [x]


def unconstrained(tpl: dict) -> list[str]:
    """``<logical id>: <action>`` for every Allow of a scopable action on ``*`` (CKV_AWS_111, stricter)."""
    out = []
    for lid, r in tpl["Resources"].items():
        if r["Type"] not in IAM_TYPES:
            continue
        for doc in _documents(r):
            for s in _listed(doc["Statement"]):
                if s.get("Effect", "Allow") != "Allow" or "*" not in _listed(s.get("Resource", [])):
                    continue
                if "NotAction" in s or "NotResource" in s:
                    out.append(f"{lid}: NotAction/NotResource")
                out += [f"{lid}: {a}" for a in _listed(s.get("Action", [])) if a not in UNSCOPABLE]
    return out


def test_no_iam_statement_allows_a_scopable_action_on_everything(tpl):
    assert unconstrained(tpl) == []


def test_the_rule_flags_write_access_without_constraints():
    tpl = {"Resources": {
        "P": {"Type": "AWS::IAM::Policy", "Properties": {"PolicyDocument": {"Statement": [
            {"Effect": "Allow", "Action": ["batch:SubmitJob", "xray:PutTraceSegments"], "Resource": "*"},
            {"Effect": "Allow", "Action": "dynamodb:PutItem", "Resource": ["arn:aws:dynamodb:r:1:table/t", "*"]},
            {"Effect": "Allow", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::b/*"}]}}},
        "R": {"Type": "AWS::IAM::Role", "Properties": {"Policies": [{"PolicyDocument": {"Statement": [
            {"Effect": "Allow", "Action": "states:StartExecution", "Resource": "*"}]}}]}},
    }}
    assert unconstrained(tpl) == ["P: batch:SubmitJob", "P: dynamodb:PutItem", "R: states:StartExecution"]


@pytest.mark.parametrize("action", ["states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"])
def test_answering_task_tokens_on_everything_is_flagged(action):
    # task tokens are answered by the scheduler and the node API on the workflow's ARN only; a grant of these
    # on "*" (the on-prem agent's, before the node API) would let its holder answer any execution's token
    tpl = {"Resources": {"P": {"Type": "AWS::IAM::Policy", "Properties": {"PolicyDocument": {"Statement": [
        {"Effect": "Allow", "Action": action, "Resource": "*"}]}}}}}
    assert unconstrained(tpl) == [f"P: {action}"]


def test_cfn_lint_reports_no_error(assembly_dir):
    from cfnlint.api import ManualArgs, lint

    from infra.config import STACK_NAME

    # errors only, in three GPU regions: warnings and informational findings are not failures (W3005: CDK's
    # DependsOn on a role it also references by GetAtt; W3045: the access-log bucket's ACL-based delivery), and
    # every region cfn-lint knows (``lint_all``) cost 2.7x the CPU (36 s against 13 s) for the same errors
    matches = lint((assembly_dir / f"{STACK_NAME}.template.json").read_text(),
                   config=ManualArgs(regions=LINT_REGIONS, ignore_checks=["W", "I"]))
    errors = [f"{m.rule.id}: {m.message}" for m in matches if m.rule.id.startswith("E")]
    assert errors == [], "\n".join(errors)


def test_cfn_lint_finds_an_error_it_is_asked_for():
    # the configuration above still reports errors: a property the resource type does not have
    from cfnlint.api import ManualArgs, lint

    bad = '{"Resources": {"B": {"Type": "AWS::S3::Bucket", "Properties": {"NoSuchProperty": 1}}}}'
    ids = {m.rule.id for m in lint(bad, config=ManualArgs(regions=LINT_REGIONS, ignore_checks=["W", "I"]))}
    assert any(i.startswith("E") for i in ids), ids
