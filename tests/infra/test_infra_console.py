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

OUTPUTS = "https://outputs-bucket.s3.us-east-1.amazonaws.com"
DOMAIN_PREFIX = "acme-gpufleet"


@pytest.fixture(scope="module")
def tpl() -> dict:
    return synth()


def synth() -> dict:
    """The console's constructs wired to the real API construct (over stand-in functions), with cdk-nag on."""
    import aws_cdk as cdk
    import cdk_nag
    from aws_cdk import aws_lambda as lambda_
    from aws_cdk import aws_logs as logs
    from aws_cdk import aws_s3 as s3

    from infra.api import STAGE_NAME, TENANT_PATHS, Api
    from infra.config import InfraConfig
    from infra.console import ConsoleHosting, acknowledge
    from infra.nag import ack

    app = cdk.App()
    stack = cdk.Stack(app, "ConsoleOnly")  # environment-agnostic, as the app's stack
    logs_bucket = s3.Bucket(stack, "AccessLogs", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
                            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED)
    ack(logs_bucket, "AwsSolutions-S1", "test scaffolding: the stack's access-log bucket (infra/data.py) in its place")
    # the real API construct over stand-in functions (the app's are built from the Lambda asset)
    fns = {k: lambda_.Function(stack, f"Fn{k}", runtime=lambda_.Runtime.PYTHON_3_12, handler="index.handler",
                               code=lambda_.Code.from_inline("def handler(e, c): pass"))
           for k in ("api", "register", "node", "admin", "lookup")}
    api = Api(stack, "Api", config=InfraConfig(), api_function=fns["api"], register_function=fns["register"],
              node_api_function=fns["node"], admin_api_function=fns["admin"], lookup_function=fns["lookup"],
              log_retention=logs.RetentionDays.ONE_WEEK)
    console = ConsoleHosting(stack, "Console", config=InfraConfig(console_domain_prefix=DOMAIN_PREFIX),
                             rest_api=api.rest_api, stage=STAGE_NAME, paths=TENANT_PATHS, access_logs=logs_bucket,
                             media_origins=[OUTPUTS])
    console.admit(api)
    acknowledge(console, f"<AWS::AccountId>:<{stack.get_logical_id(api.rest_api.node.default_child)}>")
    # the scaffolding's own findings, acknowledged as the app does (infra/nag.py)
    for rule in ("AwsSolutions-APIG2", "AwsSolutions-APIG3", "AwsSolutions-COG4", "AwsSolutions-IAM4[Policy::arn:"
                 "<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs]"):
        ack(api, rule, "test scaffolding: acknowledged for the app's API in infra/nag.py")
    for fn in fns.values():
        for rule in ("AwsSolutions-L1", "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
                     "service-role/AWSLambdaBasicExecutionRole]"):
            ack(fn, rule, "test scaffolding: a stand-in for the app's functions")
    cdk.Validations.of(app).add_plugins(cdk_nag.AwsSolutionsChecks(app, verbose=True))
    return app.synth().get_stack_by_name("ConsoleOnly").template


def _of_type(tpl: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in tpl["Resources"].items() if r["Type"] == kind}


def _flat(value) -> str:
    """A CloudFormation string value with its intrinsics written ``{Ref:X}`` / ``{X.Attr}``."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        return "".join(_flat(v) for v in value["Fn::Join"][1])
    if "Ref" in value:
        return f"{{Ref:{value['Ref']}}}"
    if "Fn::GetAtt" in value:
        return "{" + ".".join(value["Fn::GetAtt"]) + "}"
    raise AssertionError(value)


def _connect_src(csp) -> list[str]:
    (directive,) = [d.strip() for d in _flat(csp).split(";") if d.strip().startswith("connect-src ")]
    return directive.split()[1:]


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
                      "base-uri 'none'", OUTPUTS):
        assert directive in text, directive
    connect = _connect_src(csp["ContentSecurityPolicy"])
    # connect-src: the page, the API's execute-api origin, the hosted UI (token endpoint), cognito-identity
    assert connect == ["'self'", f"https://{{Ref:{_logical(tpl, 'AWS::ApiGateway::RestApi', 'ApiRestApi')}}}"
                       ".execute-api.{Ref:AWS::Region}.{Ref:AWS::URLSuffix}",
                       f"https://{{Ref:{_logical(tpl, 'AWS::Cognito::UserPoolDomain', 'ConsoleUsersHostedUi')}}}"
                       ".auth.{Ref:AWS::Region}.amazoncognito.com",
                       "https://cognito-identity.{Ref:AWS::Region}.amazonaws.com"], connect
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
    api_ref = f"{{Ref:{_logical(tpl, 'AWS::ApiGateway::RestApi', 'ApiRestApi')}}}"
    resources = [_flat(r) for s in statements for r in s["Resource"]]
    # each the jobs API's path under any method of stage v1: nothing of /v1/admin or /v1/node, no whole-API wildcard
    assert sorted(r.split(api_ref, 1)[1] for r in resources) == sorted(f"/v1/*{p}" for p in TENANT_PATHS)
    console_roles = {k for k in _of_type(tpl, "AWS::IAM::Role") if k.startswith("Console")}
    assert console_roles == {role_name}  # no other role in the console's constructs
    (users,) = _of_type(tpl, "AWS::Cognito::UserPool").values()
    assert users["Properties"]["MfaConfiguration"] == "ON"
    assert users["Properties"]["AdminCreateUserConfig"]["AllowAdminCreateUserOnly"] is True


def _origin(tpl: dict) -> str:
    return f"https://{{{_logical(tpl, 'AWS::CloudFront::Distribution', 'ConsoleCdn')}.DomainName}}"


def test_the_hosted_ui_and_a_public_code_flow_client_for_the_distribution(tpl):
    (domain,) = _of_type(tpl, "AWS::Cognito::UserPoolDomain").values()
    assert domain["Properties"]["Domain"] == DOMAIN_PREFIX  # from configuration (console_domain_prefix)
    (client,) = _of_type(tpl, "AWS::Cognito::UserPoolClient").values()
    props = client["Properties"]
    assert props["GenerateSecret"] is False  # a public client: the page proves itself with PKCE
    assert props["AllowedOAuthFlows"] == ["code"] and props["AllowedOAuthFlowsUserPoolClient"] is True
    assert "openid" in props["AllowedOAuthScopes"]
    assert [_flat(u) for u in props["CallbackURLs"]] == [_origin(tpl) + "/"]
    assert [_flat(u) for u in props["LogoutURLs"]] == [_origin(tpl) + "/"]


def test_the_api_admits_the_consoles_origin(tpl):
    from infra.console import API_METHODS, SIGNED_HEADERS

    methods = _of_type(tpl, "AWS::ApiGateway::Method").values()
    preflights = [m["Properties"] for m in methods if m["Properties"]["HttpMethod"] == "OPTIONS"]
    others = [m["Properties"] for m in methods if m["Properties"]["HttpMethod"] != "OPTIONS"]
    # every resource the page calls (the jobs API's proxy, the admin resources) has a preflight; the node API not
    page = {m["ResourceId"]["Ref"] for m in others if m["HttpMethod"] == "ANY" and "v1node" not in m["ResourceId"]["Ref"]}
    assert {m["ResourceId"]["Ref"] for m in preflights} == page and len(page) == len(preflights) == 15
    for m in preflights:
        assert m["AuthorizationType"] == "NONE" and m["Integration"]["Type"] == "MOCK"
        (answer,) = m["Integration"]["IntegrationResponses"]
        params = {k.rsplit(".", 1)[1]: _flat(v) for k, v in answer["ResponseParameters"].items()}
        assert params["Access-Control-Allow-Origin"] == f"'{_origin(tpl)}'"
        assert set(params["Access-Control-Allow-Headers"].strip("'").split(",")) == set(SIGNED_HEADERS)
        assert set(params["Access-Control-Allow-Methods"].strip("'").split(",")) == set(API_METHODS)
    # only the preflights and the cloud supervisor's token exchange (test_infra_template) are unauthenticated
    assert [m["HttpMethod"] for m in others if m["AuthorizationType"] != "AWS_IAM"] == ["POST"]
    # a refused signature reaches the page as a 403 (the gateway's own answers name the origin too)
    kinds = {r["Properties"]["ResponseType"]: r["Properties"] for r in _of_type(tpl, "AWS::ApiGateway::GatewayResponse").values()}
    assert set(kinds) == {"DEFAULT_4XX", "DEFAULT_5XX"}
    for resp in kinds.values():
        assert _flat(resp["ResponseParameters"]["gatewayresponse.header.Access-Control-Allow-Origin"]) == \
            f"'{_origin(tpl)}'"
    # the functions behind the page's calls answer with the origin (gpufleet/api/cors.py)
    envs = {k: (f["Properties"].get("Environment") or {}).get("Variables", {})
            for k, f in _of_type(tpl, "AWS::Lambda::Function").items() if k.startswith("Fn")}
    assert {k for k, v in envs.items() if _flat(v.get("GPUFLEET_CORS_ORIGIN", "")) == _origin(tpl)} == {
        _logical(tpl, "AWS::Lambda::Function", "Fnapi"), _logical(tpl, "AWS::Lambda::Function", "Fnadmin")}


def test_the_files_and_config_json_are_deployed_to_the_consoles_bucket_only(tpl):
    (deploy,) = _of_type(tpl, "Custom::CDKBucketDeployment").values()
    props = deploy["Properties"]
    bucket = _logical(tpl, "AWS::S3::Bucket", "ConsoleAssets")
    assert props["DestinationBucketName"] == {"Ref": bucket} and "DestinationBucketKeyPrefix" not in props
    assert props["SystemMetadata"] == {"cache-control": "no-cache"} and props["Prune"] is True
    # config.json: the page's region, API (with its stage), client, hosted UI and identity pool, from the stack
    (markers,) = [m for m in props["SourceMarkers"] if m]
    values = {_flat(v).strip('"') for v in markers.values()}
    client = _logical(tpl, "AWS::Cognito::UserPoolClient", "ConsoleUsersConsole")
    pool = _logical(tpl, "AWS::Cognito::IdentityPool", "ConsoleIdentities")
    assert {"{Ref:AWS::Region}", f"{{Ref:{client}}}", f"{{Ref:{pool}}}"} <= values
    assert any(v.endswith(".execute-api.{Ref:AWS::Region}.{Ref:AWS::URLSuffix}/v1") for v in values), values
    assert any(v.endswith(".auth.{Ref:AWS::Region}.amazoncognito.com") for v in values), values
    # its function may write the console's bucket and read the CDK assets bucket, nothing else
    handler = props["ServiceToken"]["Fn::GetAtt"][0]
    role = tpl["Resources"][handler]["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [p["Properties"]["PolicyDocument"] for p in _of_type(tpl, "AWS::IAM::Policy").values()
                 if {"Ref": role} in p["Properties"]["Roles"]]
    writes = [s for s in policy["Statement"] if any(a.startswith(("s3:Put", "s3:Delete")) for a in s["Action"])]
    assert writes and all(_flat(r).startswith(f"{{{bucket}.Arn}}") for s in writes for r in s["Resource"])
    others = [s for s in policy["Statement"] if s not in writes]
    assert all(a.startswith(("s3:Get", "s3:List")) for s in others for a in s["Action"])
    assert all("cdk-hnb659fds-assets-" in json.dumps(s["Resource"]) for s in others)


def test_the_site_layout_and_config_key_match_the_page():
    from gpufleet.webconsole import ASSETS, CONFIG_KEY, site
    from infra.console import stage_site

    files = site()
    assert files["index.html"] == ASSETS / "index.html"
    assert "assets/app.js" in files and "assets/signin_flow.js" in files and "assets/style.css" in files
    html = (ASSETS / "index.html").read_text()
    assert 'src="/assets/app.js"' in html and 'href="/assets/style.css"' in html
    assert f'"/{CONFIG_KEY}"' in (ASSETS / "api.js").read_text()  # where the page reads its configuration
    import tempfile
    from pathlib import Path

    staged = stage_site(Path(tempfile.mkdtemp()))
    assert sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()) == sorted(files)
