"""The web console in AWS: its files in a private bucket behind CloudFront, and who may sign in.

Contract (built only with the context flag ``gpufleet:console_hosting=true``; the local stack serves the
console itself, docs/console.md):
- :attr:`ConsoleHosting.bucket` is private (all public access blocked, TLS only, S3-managed encryption,
  access logs to the stack's access-log bucket); only the distribution reads it, through an origin
  access control (SigV4-signed by CloudFront, the bucket policy names this distribution).
- :attr:`ConsoleHosting.distribution` redirects HTTP to HTTPS, logs to the access-log bucket, and answers
  with :attr:`ConsoleHosting.headers`: the console's Content-Security-Policy
  (:func:`gpufleet.webconsole.csp`, API calls to the API and Cognito only, media from the outputs
  bucket), HSTS (two years, subdomains, preload), ``nosniff``, ``DENY`` framing, ``no-referrer``.
- Users sign in to :attr:`ConsoleHosting.user_pool` (no self sign-up, MFA required, strong passwords;
  the operator federates it with their IdP). :attr:`ConsoleHosting.identity_pool` admits only
  authenticated identities of that pool's console client and hands them short-lived credentials:
  a user pool group's role (``cognito:preferred_role``: one role per principal the API knows, created
  and registered by the operator), and nobody without one (ambiguous → Deny). Its default
  authenticated role, :attr:`ConsoleHosting.users_role`, allows ``execute-api:Invoke`` on the jobs
  API's paths only, nothing else.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudfront as cloudfront
from aws_cdk import aws_cloudfront_origins as origins
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3deploy
from constructs import Construct

from gpufleet.webconsole import CONFIG_KEY, csp, site
from infra.config import InfraConfig

#: Strict-Transport-Security max-age (two years, the preload list's minimum is one)
HSTS_MAX_AGE = Duration.days(730)
#: the request headers a browser's SigV4-signed API call carries (what the API's CORS preflight allows)
SIGNED_HEADERS = ("authorization", "content-type", "idempotency-key", "x-amz-content-sha256", "x-amz-date",
                  "x-amz-security-token")
#: the methods the console calls the API with
API_METHODS = ("GET", "POST", "PUT", "DELETE")


def stage_site(into: Path) -> Path:
    """Copy the console's files into ``into`` laid out as the site serves them (:func:`gpufleet.webconsole.site`)."""
    for key, src in site().items():
        dest = into / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    return into


def cors_origin(distribution: cloudfront.IDistribution) -> str:
    """The console's origin (``https://<distribution domain>``): what the API and the outputs bucket admit."""
    return f"https://{distribution.distribution_domain_name}"


class ConsoleHosting(Construct):
    def __init__(self, scope: Construct, cid: str, *, config: InfraConfig, rest_api: apigw.IRestApi,
                 stage: str, paths: tuple[str, ...], access_logs: s3.IBucket, media_origins: list[str]) -> None:
        super().__init__(scope, cid)
        stack = Stack.of(self)
        removal = RemovalPolicy.RETAIN if config.removal == "retain" else RemovalPolicy.DESTROY
        self.bucket = s3.Bucket(
            self, "Assets", encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, enforce_ssl=True,
            server_access_logs_bucket=access_logs, server_access_logs_prefix="console/", removal_policy=removal)
        api_origin = f"https://{rest_api.rest_api_id}.execute-api.{stack.region}.{stack.url_suffix}"
        self.user_pool = cognito.UserPool(
            self, "Users",
            self_sign_up_enabled=False,
            sign_in_aliases=cognito.SignInAliases(email=True),
            mfa=cognito.Mfa.REQUIRED,
            mfa_second_factor=cognito.MfaSecondFactor(otp=True, sms=False),
            password_policy=cognito.PasswordPolicy(min_length=14, require_digits=True, require_lowercase=True,
                                                   require_uppercase=True, require_symbols=True),
            account_recovery=cognito.AccountRecovery.EMAIL_ONLY,
            feature_plan=cognito.FeaturePlan.PLUS,
            standard_threat_protection_mode=cognito.StandardThreatProtectionMode.FULL_FUNCTION,
            removal_policy=removal,
        )
        prefix = config.console_domain_prefix or f"{config.prefix}-console-{stack.account}"
        #: the hosted UI (sign-in, federation with the operator's IdP) and its OAuth endpoints
        self.domain = self.user_pool.add_domain(
            "HostedUi", cognito_domain=cognito.CognitoDomainOptions(domain_prefix=prefix))
        self.hosted_ui = self.domain.base_url()
        identity_origin = f"https://cognito-identity.{stack.region}.amazonaws.com"
        self.api_url = f"{api_origin}/{stage}"
        self.csp = csp(media_origins, [api_origin, self.hosted_ui, identity_origin])
        self.headers = cloudfront.ResponseHeadersPolicy(
            self, "Headers",
            comment="gpufleet console: strict CSP, HSTS, nosniff, no framing, no referrer",
            security_headers_behavior=cloudfront.ResponseSecurityHeadersBehavior(
                content_security_policy=cloudfront.ResponseHeadersContentSecurityPolicy(
                    content_security_policy=self.csp, override=True),
                strict_transport_security=cloudfront.ResponseHeadersStrictTransportSecurity(
                    access_control_max_age=HSTS_MAX_AGE, include_subdomains=True, preload=True, override=True),
                content_type_options=cloudfront.ResponseHeadersContentTypeOptions(override=True),
                frame_options=cloudfront.ResponseHeadersFrameOptions(
                    frame_option=cloudfront.HeadersFrameOption.DENY, override=True),
                referrer_policy=cloudfront.ResponseHeadersReferrerPolicy(
                    referrer_policy=cloudfront.HeadersReferrerPolicy.NO_REFERRER, override=True),
            ),
        )
        self.distribution = cloudfront.Distribution(
            self, "Cdn",
            comment="gpufleet web console",
            default_root_object="index.html",
            default_behavior=cloudfront.BehaviorOptions(
                origin=origins.S3BucketOrigin.with_origin_access_control(self.bucket),
                viewer_protocol_policy=cloudfront.ViewerProtocolPolicy.REDIRECT_TO_HTTPS,
                response_headers_policy=self.headers,
                cache_policy=cloudfront.CachePolicy.CACHING_OPTIMIZED,
            ),
            enable_logging=True, log_bucket=access_logs, log_file_prefix="console-cdn/",
            minimum_protocol_version=cloudfront.SecurityPolicyProtocol.TLS_V1_2_2021,
        )
        self.origin = cors_origin(self.distribution)
        # a public client (no secret: the page cannot keep one), authorization code flow only; the page sends
        # a PKCE challenge (S256) with every authorization request (gpufleet/webconsole/signin_flow.js)
        self.client = self.user_pool.add_client(
            "Console", generate_secret=False, auth_flows=cognito.AuthFlow(user_srp=True),
            o_auth=cognito.OAuthSettings(
                flows=cognito.OAuthFlows(authorization_code_grant=True, implicit_code_grant=False),
                scopes=[cognito.OAuthScope.OPENID, cognito.OAuthScope.EMAIL],
                callback_urls=[f"{self.origin}/"], logout_urls=[f"{self.origin}/"]),
            prevent_user_existence_errors=True,
            access_token_validity=Duration.hours(1), id_token_validity=Duration.hours(1),
            refresh_token_validity=Duration.hours(12),
        )
        self.identity_pool = cognito.CfnIdentityPool(
            self, "Identities",
            allow_unauthenticated_identities=False,
            cognito_identity_providers=[cognito.CfnIdentityPool.CognitoIdentityProviderProperty(
                client_id=self.client.user_pool_client_id,
                provider_name=self.user_pool.user_pool_provider_name,
                server_side_token_check=True)],
        )
        self.paths, self.stage = paths, stage
        self.invoke_arns = [rest_api.arn_for_execute_api("*", path, stage) for path in paths]
        self.users_role = iam.Role(
            self, "UsersRole",
            description="gpufleet console users (Cognito identity pool, authenticated): the jobs API only",
            assumed_by=iam.FederatedPrincipal(
                "cognito-identity.amazonaws.com",
                conditions={"StringEquals": {"cognito-identity.amazonaws.com:aud": self.identity_pool.ref},
                            "ForAnyValue:StringLike": {"cognito-identity.amazonaws.com:amr": "authenticated"}},
                assume_role_action="sts:AssumeRoleWithWebIdentity"),
            max_session_duration=Duration.hours(1),
            inline_policies={"invoke": iam.PolicyDocument(statements=[iam.PolicyStatement(
                sid="JobsApi", actions=["execute-api:Invoke"], resources=self.invoke_arns)])},
        )
        provider = f"{self.user_pool.user_pool_provider_name}:{self.client.user_pool_client_id}"
        cognito.CfnIdentityPoolRoleAttachment(
            self, "Roles", identity_pool_id=self.identity_pool.ref,
            roles={"authenticated": self.users_role.role_arn},
            role_mappings={"console": cognito.CfnIdentityPoolRoleAttachment.RoleMappingProperty(
                type="Token", ambiguous_role_resolution="Deny", identity_provider=provider)},
        )
        #: what the page reads at /console/config.json: where to sign in and which API to sign requests for
        self.page_config = {
            "region": stack.region, "service": "execute-api", "api_url": self.api_url,
            "user_pool_client_id": self.client.user_pool_client_id, "hosted_ui": self.hosted_ui,
            "identity_pool_id": self.identity_pool.ref, "user_pool_provider": self.user_pool.user_pool_provider_name,
        }
        # the files and config.json, revalidated on every load (no-cache) so a deploy shows at once without
        # a CloudFront invalidation (and without granting one); files no longer in the console are pruned
        self.deployment = s3deploy.BucketDeployment(
            self, "Files",
            sources=[s3deploy.Source.asset(str(stage_site(Path(tempfile.mkdtemp(prefix="gpufleet-console-"))))),
                     s3deploy.Source.json_data(CONFIG_KEY, self.page_config)],
            destination_bucket=self.bucket,
            cache_control=[s3deploy.CacheControl.no_cache()],
            memory_limit=256,
        )
        #: the deployment's function (one per stack, CDK's own code: copies the sources into the bucket)
        self.deployment_function = next(
            c for c in stack.node.children if c.node.id.startswith("Custom::CDKBucketDeployment"))
        self.api = None

    def admit(self, api) -> None:
        """Let the page on :attr:`origin` call ``api`` (an ``infra.api.Api``: CORS preflight, the answers'
        headers). The outputs bucket needs no CORS rule: the player's ``<video src>`` and the file links load
        presigned URLs without CORS (no ``crossorigin``); a rule naming the distribution would also close a
        cycle (the CSP's ``media-src`` names the outputs bucket, the distribution serves that CSP)."""
        self.api = api
        api.allow_origin(self.origin, headers=SIGNED_HEADERS, methods=API_METHODS)


def acknowledge(console: ConsoleHosting, api_id: str) -> None:
    """cdk-nag acknowledgements of the console's constructs (each names its exact finding). ``api_id``: how
    the REST API's id renders in findings (``<AWS::AccountId>:<logical id>`` in the stack)."""
    from infra.nag import ack

    ack(console.distribution, "AwsSolutions-CFR1", "The console is open to every country; access needs a sign-in.")
    ack(console.distribution, "AwsSolutions-CFR2", "Static files only; the API behind it is SigV4-authorized and "
        "throttled, and the operator may attach a web ACL.")
    ack(console.distribution, "AwsSolutions-CFR4", "The default CloudFront certificate (TLS 1.2 minimum with a "
        "custom domain: minimum_protocol_version is set for when the operator adds one).")
    for method in getattr(console.api, "preflights", []):
        ack(method, "AwsSolutions-APIG4", "The CORS preflight (OPTIONS, a mock integration answering the allowed "
            "origin, methods and headers) is unauthenticated by design: browsers send it without credentials.")
        ack(method, "AwsSolutions-COG4", "The CORS preflight carries no credentials (browsers send none).")
    fn = console.deployment_function
    ack(fn, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
        "Write-only CloudWatch Logs permissions for the deployment function's own log group.")
    ack(fn, "AwsSolutions-L1", "CDK's BucketDeployment function: its runtime is chosen by aws-cdk-lib.")
    for rule in ("Action::s3:GetObject*", "Action::s3:GetBucket*", "Action::s3:List*", "Action::s3:DeleteObject*",
                 "Action::s3:Abort*",
                 "Resource::arn:<AWS::Partition>:s3:::cdk-hnb659fds-assets-<AWS::AccountId>-<AWS::Region>/*",
                 f"Resource::<{Stack.of(console).get_logical_id(console.bucket.node.default_child)}.Arn>/*"):
        ack(fn, f"AwsSolutions-IAM5[{rule}]", "BucketDeployment's grant: read the console's asset from the CDK "
            "assets bucket, write and prune the console's own bucket (only that bucket: it holds nothing else).")
    for path in console.paths:
        ack(console.users_role, f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:"
            f"{api_id}/{console.stage}/*{path}]",
            "Invoke of the jobs API (any method of these paths); the API scopes every job to the caller's tenant.")
