"""Template assertions of the console's hosting (infra/console.py), synthesized in a small stack of its own
with cdk-nag (AwsSolutions) on: every finding is fixed or acknowledged, or synthesis fails.

- the bucket is private (all public access blocked, TLS only) and read by CloudFront only, through an
  origin access control naming this distribution;
- every answer carries the console's CSP (no inline code, API calls to the API and Cognito only) and HSTS;
- the identity pool admits authenticated identities only, and its roles allow ``execute-api:Invoke`` on the
  jobs API's paths only.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.xdist_group("cdk-synth")

API_ID = "abc123def4"
OUTPUTS = "https://outputs-bucket.s3.us-east-1.amazonaws.com"


@pytest.fixture(scope="module")
def tpl() -> dict:
    import aws_cdk as cdk
    import cdk_nag
    from aws_cdk import aws_apigateway as apigw
    from aws_cdk import aws_s3 as s3

    from infra.api import STAGE_NAME, TENANT_PATHS
    from infra.config import InfraConfig
    from infra.console import ConsoleHosting, acknowledge
    from infra.nag import ack

    app = cdk.App()
    stack = cdk.Stack(app, "ConsoleOnly")  # environment-agnostic, as the app's stack
    logs = s3.Bucket(stack, "AccessLogs", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
                     block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                     object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED)
    ack(logs, "AwsSolutions-S1", "test scaffolding: the stack's access-log bucket (infra/data.py) in its place")
    api = apigw.RestApi.from_rest_api_id(stack, "Api", API_ID)
    console = ConsoleHosting(stack, "Console", config=InfraConfig(), rest_api=api, stage=STAGE_NAME,
                             paths=TENANT_PATHS, access_logs=logs, media_origins=[OUTPUTS])
    acknowledge(console, f"<AWS::AccountId>:{API_ID}")
    cdk.Validations.of(app).add_plugins(cdk_nag.AwsSolutionsChecks(app, verbose=True))
    return app.synth().get_stack_by_name("ConsoleOnly").template


def _of_type(tpl: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in tpl["Resources"].items() if r["Type"] == kind}


def _logical(tpl: dict, kind: str, prefix: str) -> str:
    (name,) = [k for k in _of_type(tpl, kind) if k.startswith(prefix)]
    return name


def test_the_bucket_is_private_and_read_by_cloudfront_through_origin_access_control(tpl):
    bucket = _logical(tpl, "AWS::S3::Bucket", "ConsoleAssets")
    props = tpl["Resources"][bucket]["Properties"]
    assert props["PublicAccessBlockConfiguration"] == {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                                        "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    (oac,) = _of_type(tpl, "AWS::CloudFront::OriginAccessControl").values()
    assert oac["Properties"]["OriginAccessControlConfig"]["SigningBehavior"] == "always"
    assert oac["Properties"]["OriginAccessControlConfig"]["OriginAccessControlOriginType"] == "s3"
    (dist_name, dist), = _of_type(tpl, "AWS::CloudFront::Distribution").items()
    (origin,) = dist["Properties"]["DistributionConfig"]["Origins"]
    assert "OriginAccessControlId" in origin and origin["S3OriginConfig"].get("OriginAccessIdentity", "") == ""
    assert dist["Properties"]["DistributionConfig"]["DefaultCacheBehavior"]["ViewerProtocolPolicy"] == \
        "redirect-to-https"
    (policy,) = [p for p in _of_type(tpl, "AWS::S3::BucketPolicy").values()
                 if p["Properties"]["Bucket"] == {"Ref": bucket}]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    allows = [s for s in statements if s["Effect"] == "Allow"]
    assert allows and all(s["Principal"] == {"Service": "cloudfront.amazonaws.com"} for s in allows), allows
    assert all(s["Action"] == "s3:GetObject" for s in allows)
    assert all(dist_name in json.dumps(s["Condition"]) for s in allows)  # this distribution only
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in statements)


def test_every_answer_carries_the_csp_and_hsts(tpl):
    (headers,) = _of_type(tpl, "AWS::CloudFront::ResponseHeadersPolicy").values()
    sec = headers["Properties"]["ResponseHeadersPolicyConfig"]["SecurityHeadersConfig"]
    csp = sec["ContentSecurityPolicy"]
    assert csp["Override"] is True
    text = json.dumps(csp["ContentSecurityPolicy"])
    for directive in ("default-src 'none'", "script-src 'self';", "style-src 'self';", "frame-ancestors 'none'",
                      "base-uri 'none'", OUTPUTS, "https://cognito-identity.", "https://cognito-idp.", API_ID):
        assert directive in text, directive
    assert "unsafe-inline" not in text and "unsafe-eval" not in text
    hsts = sec["StrictTransportSecurity"]
    assert hsts["AccessControlMaxAgeSec"] >= 31_536_000 and hsts["IncludeSubdomains"] and hsts["Override"]
    assert sec["ContentTypeOptions"]["Override"] and sec["FrameOptions"]["FrameOption"] == "DENY"
    (dist,) = _of_type(tpl, "AWS::CloudFront::Distribution").values()
    behavior = dist["Properties"]["DistributionConfig"]["DefaultCacheBehavior"]
    assert behavior["ResponseHeadersPolicyId"] == {"Ref": next(iter(_of_type(
        tpl, "AWS::CloudFront::ResponseHeadersPolicy")))}


def test_the_identity_pools_roles_allow_only_invoking_the_jobs_api(tpl):
    from infra.api import TENANT_PATHS

    (pool,) = _of_type(tpl, "AWS::Cognito::IdentityPool").values()
    assert pool["Properties"]["AllowUnauthenticatedIdentities"] is False
    (attachment,) = _of_type(tpl, "AWS::Cognito::IdentityPoolRoleAttachment").values()
    roles = attachment["Properties"]["Roles"]
    assert set(roles) == {"authenticated"}  # no unauthenticated role
    (mapping,) = attachment["Properties"]["RoleMappings"].values()
    assert mapping["Type"] == "Token" and mapping["AmbiguousRoleResolution"] == "Deny"
    role_name = roles["authenticated"]["Fn::GetAtt"][0]
    role = tpl["Resources"][role_name]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Federated": "cognito-identity.amazonaws.com"}
    assert trust["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert trust["Condition"]["ForAnyValue:StringLike"] == {"cognito-identity.amazonaws.com:amr": "authenticated"}
    assert "cognito-identity.amazonaws.com:aud" in trust["Condition"]["StringEquals"]
    assert "ManagedPolicyArns" not in role
    statements = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
    assert {s["Action"] for s in statements} == {"execute-api:Invoke"}
    assert all(s["Effect"] == "Allow" for s in statements)
    resources = [json.dumps(r) for s in statements for r in s["Resource"]]
    # each the jobs API's path under any method of stage v1: nothing of /v1/admin or /v1/node, no whole-API wildcard
    assert sorted(r.rsplit(API_ID, 1)[1].split('"')[0] for r in resources) == sorted(f"/v1/*{p}" for p in TENANT_PATHS)
    assert set(_of_type(tpl, "AWS::IAM::Role")) == {role_name}  # no other role in the console's constructs
    (users,) = _of_type(tpl, "AWS::Cognito::UserPool").values()
    assert users["Properties"]["MfaConfiguration"] == "ON"
    assert users["Properties"]["AdminCreateUserConfig"]["AllowAdminCreateUserOnly"] is True
