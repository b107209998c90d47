"""API construct: the REST API in front of the API Lambda.

Contract:
- Every method uses ``AWS_IAM`` authorization (SigV4) but one: ``POST /v1/node/cloud/credentials``
  (:attr:`Api.supervisor_exchange`), where a cloud attempt's supervisor, which has no AWS identity (its Batch
  task has no role), trades its one-time attempt token for its session (:mod:`gpufleet.nodeapi.supervisor`;
  the token is the credential, checked by the node API Lambda; the stage's throttling applies). The CORS
  preflights (:meth:`Api.allow_origin`) are mock integrations. ``/v1/{proxy+}`` (ANY) goes to the API Lambda, which
  routes and validates (pydantic); ``POST /v1/provenance/lookup`` goes to the provenance lookup's own Lambda
  (``lambdas/api/lookup.py``: the same app serving that route alone, with a role of its own — the API function's
  cannot read the watermark keys); ``POST /v1/nodes`` goes to the node
  registration Lambda (which admits admin principals only); ``/v1/node/{proxy+}`` (ANY) goes to
  the node API Lambda, the only way on-prem agents act on jobs (:mod:`gpufleet.nodeapi`; the agent
  role may invoke nothing else: :attr:`Api.node_api_arn`); ``/v1/admin/<r>`` and ``/v1/admin/<r>/{proxy+}``
  for each resource of :data:`ADMIN_RESOURCES` (ANY) go to the administration API Lambda
  (:mod:`gpufleet.adminapi`, its own role), which admits admin principals only (the operator's recovery
  routes, ``/v1/admin/jobs`` and ``/v1/admin/quarantine``, stay with the API Lambda through ``/v1/{proxy+}``);
  the admin policy of infra/admin.py names :attr:`Api.admin_api_arns`, the tenants' policy
  :attr:`Api.tenant_api_arns` (:data:`TENANT_PATHS`).
- The ``v1`` stage has JSON access logs in CloudWatch Logs, execution logging
  at ERROR level, X-Ray tracing and stage-wide throttling
  (``api_rate_limit`` / ``api_burst_limit``).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from gpufleet.adminapi.app import ADMIN_RESOURCES
from infra.config import InfraConfig
from infra.nag import ack

STAGE_NAME = "v1"
#: what tenants' users may invoke: the jobs API (never /v1/admin, /v1/nodes or /v1/node)
TENANT_PATHS = ("/v1/jobs", "/v1/jobs/*", "/v1/job-arrays", "/v1/costs", "/v1/quota", "/v1/pools", "/v1/models",
                "/v1/openapi.json", "/v1/provenance/lookup", "/v1/webhooks/*")


class Api(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        config: InfraConfig,
        api_function: lambda_.IFunction,
        register_function: lambda_.IFunction,
        node_api_function: lambda_.IFunction,
        admin_api_function: lambda_.IFunction,
        lookup_function: lambda_.IFunction,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, cid)
        self.access_logs = logs.LogGroup(self, "AccessLogs", retention=log_retention)
        self.rest_api = apigw.RestApi(
            self,
            "RestApi",
            rest_api_name=config.name("api"),
            description="gpufleet jobs API (SigV4 / AWS_IAM on every method)",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            cloud_watch_role=True,
            default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
            deploy_options=apigw.StageOptions(
                stage_name=STAGE_NAME,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                tracing_enabled=True,
                throttling_rate_limit=config.api_rate_limit,
                throttling_burst_limit=config.api_burst_limit,
                metrics_enabled=True,
            ),
        )
        v1 = self.rest_api.root.add_resource("v1")
        jobs = v1.add_proxy(default_integration=apigw.LambdaIntegration(api_function), any_method=True)
        #: the provenance lookup's own function (the watermark detector, and the only API-side reader of its keys);
        #: reserved concurrency bounds how many detectors run at once (``lookup_reserved_concurrency``)
        v1.add_resource("provenance").add_resource("lookup").add_method(
            "POST", apigw.LambdaIntegration(lookup_function))
        if config.lookup_reserved_concurrency:
            lookup_function.node.default_child.reserved_concurrent_executions = config.lookup_reserved_concurrency
        nodes = v1.add_resource("nodes")
        nodes.add_method("POST", apigw.LambdaIntegration(register_function))
        node = v1.add_resource("node")
        node_integration = apigw.LambdaIntegration(node_api_function)
        node.add_proxy(default_integration=node_integration, any_method=True)
        #: the cloud supervisor's token exchange: the one route without AWS_IAM (the token is the credential)
        self.supervisor_exchange = node.add_resource("cloud").add_resource("credentials").add_method(
            "POST", node_integration, authorization_type=apigw.AuthorizationType.NONE)
        ack(self.supervisor_exchange, "AwsSolutions-APIG4",
            "POST /v1/node/cloud/credentials: a cloud attempt's supervisor has no AWS identity (its Batch task has"
            " no role, so tenant code gets none); it presents a one-time 256-bit token whose hash RunCloud stored on"
            " the attempt, checked and claimed by the node API (gpufleet.nodeapi.supervisor); stage throttling"
            " applies.")
        ack(self.supervisor_exchange, "AwsSolutions-COG4", "Authenticated by the attempt's one-time token.")
        admin = v1.add_resource("admin")
        admin_integration = apigw.LambdaIntegration(admin_api_function)
        #: the resources a browser page calls (the jobs API and the administration API), see :meth:`allow_origin`
        self.page_resources: list[apigw.IResource] = [jobs]
        for name in ADMIN_RESOURCES:
            res = admin.add_resource(name)
            res.add_method("ANY", admin_integration)
            self.page_resources += [res, res.add_proxy(default_integration=admin_integration, any_method=True)]
        #: the functions behind the page's calls (the console never looks a watermark up: no preflight, no origin there)
        self.functions = {"api": api_function, "admin_api": admin_api_function}
        #: execute-api ARN of every node API route (what the agent role may invoke)
        self.node_api_arn = self.rest_api.arn_for_execute_api("*", "/v1/node/*", STAGE_NAME)
        #: the attempt routes (what a cloud supervisor's role may invoke; its session narrows it to one attempt)
        self.node_attempt_routes_arn = self.rest_api.arn_for_execute_api("POST", "/v1/node/jobs/*", STAGE_NAME)
        #: ``arn:<p>:execute-api:<region>:<account>:<api id>`` (the node API builds session policies on it)
        self.execute_api_arn = Stack.of(self).format_arn(service="execute-api", resource=self.rest_api.rest_api_id,
                                                         arn_format=ArnFormat.NO_RESOURCE_NAME)
        #: what operators may invoke: the administration API and node registration
        self.admin_api_arns = [self.rest_api.arn_for_execute_api("*", "/v1/admin/*", STAGE_NAME),
                               self.rest_api.arn_for_execute_api("POST", "/v1/nodes", STAGE_NAME)]
        #: what tenants' users may invoke (:data:`TENANT_PATHS`)
        self.tenant_api_arns = [self.rest_api.arn_for_execute_api("*", path, STAGE_NAME) for path in TENANT_PATHS]

    def allow_origin(self, origin: str, *, headers: tuple[str, ...], methods: tuple[str, ...]) -> None:
        """Admit a browser page served from ``origin`` (the console): an unauthenticated CORS preflight
        (``OPTIONS``, a mock integration) on every resource the page calls, allowing ``methods`` and the
        signed request's ``headers``; the API's own answers name the origin too (``GPUFLEET_CORS_ORIGIN`` for
        the functions behind them, gpufleet/api/cors.py), and so do the gateway's (a refused signature's 403
        must reach the page as a 403, not as a CORS failure)."""
        #: the unauthenticated OPTIONS methods (a mock integration: no function behind them)
        self.preflights = [
            resource.add_cors_preflight(allow_origins=[origin], allow_methods=list(methods),
                                        allow_headers=list(headers), max_age=Duration.hours(1))
            for resource in self.page_resources]
        for fn in self.functions.values():
            fn.add_environment("GPUFLEET_CORS_ORIGIN", origin)
        for kind in (apigw.ResponseType.DEFAULT_4_XX, apigw.ResponseType.DEFAULT_5_XX):
            self.rest_api.add_gateway_response(
                f"Cors{kind.response_type}", type=kind,
                response_headers={"Access-Control-Allow-Origin": f"'{origin}'", "Vary": "'Origin'"})
