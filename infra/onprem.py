"""On-prem construct: per-node queue registration and the agents' least-privilege role.

Contract:
- Nodes come and go, so their queues are not in the template: ``POST /v1/nodes``
  (IAM-authenticated) runs the registration Lambda, which creates
  ``<node_queue_prefix><node_id>`` and its ``-dlq`` (SSE, redrive after
  ``node_queue_max_receives``) and returns the queue URL. Its IAM policy only
  covers queues under the node-queue prefix.
- ``self.agent_role`` is assumed by on-prem agents through IAM Roles Anywhere;
  the certificate's subject CN is the node id (session tag
  ``x509Subject/CN``). The template creates the trust anchor (``node_ca_pem``: a PEM CA bundle,
  or ``node_ca_arn``: an ACM Private CA) and a profile naming only this role; the role's trust
  policy requires ``aws:SourceArn`` = that anchor, this account, and a CN that is a node id
  (never ending in ``-dlq``, no ``/``, ``:`` or ``.``). Without a configured CA the trust
  policy names an anchor that does not exist: no agent can assume the role (fail closed).
  With it an agent can only:
  * consume its own queue (the ARN is built from the session tag);
  * call the node API (``execute-api:Invoke`` on ``/v1/node/*`` of this REST API), the node's only
    way to act on jobs: heartbeat, report and fence-write attempts the server finds assigned to it at
    the current epoch, send its liveness report (bounded by the operator's registration), and obtain
    per-attempt object credentials.
  It holds no Step Functions, DynamoDB or S3 permission: no task token of any job reaches a node (the
  dispatch step keeps it on the attempt item), no job item can be read or written directly, no
  bucket can be listed. The role's session name must equal the certificate CN (the profile accepts a
  role session name; the trust policy requires ``sts:RoleSessionName`` = the CN), so the node API
  identifies the node by its principal ``assumed-role/<agent role>/<node id>``.
- ``self.node_job_role`` is assumed only by the node API, with an inline session policy naming one
  job's prefixes (:func:`gpufleet.nodeapi.scope.session_policy`); its own policy bounds every such
  session to ``jobs/*`` objects of the three buckets, the tenants' inputs in the outputs bucket, a
  listing of the checkpoints bucket under ``jobs/`` and ``s3:GetObject`` (read only) of the published models
  (``models/*`` of the models bucket; the node API's ``GPUFLEET_MODEL_S3_ROOT`` puts them in each session).
- ``self.supervisor_role`` (``CloudSupervisorRole``) is a cloud container attempt's supervisor: assumed only
  by the node API when it exchanges the attempt's one-time token (:mod:`gpufleet.nodeapi.supervisor`), with a
  session policy naming that job's prefixes and that attempt's node API routes. Its own policy bounds every
  such session to the node-job role's object scope and ``execute-api:Invoke`` on ``POST /v1/node/jobs/*``; it
  holds no DynamoDB, Step Functions or bucket-wide permission, and no Batch task carries it (the tenant
  definitions have no task role: gpufleet.batchdef).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_rolesanywhere as rolesanywhere
from constructs import Construct

from infra.config import DLQ_SUFFIX, NODE_PRINCIPAL_TAG, SIGNALS_SUFFIX, InfraConfig
from infra.data import MODELS_PREFIX, Data

#: trust-anchor id of the fail-closed trust policy when no node CA is configured (no such anchor exists)
NO_ANCHOR = "none-configured"

#: Job item attributes an agent may write (all fenced on the epoch by gpufleet.store.fencing).
WORKER_WRITABLE_ATTRIBUTES = (
    "pk", "sk", "current_epoch", "progress", "heartbeat_at", "checkpoint", "generated", "staging", "updated_at",
    # the fenced SCHEDULED -> RUNNING move the runtime makes when the workload starts
    # (gpufleet.store.jobs.transition_update: it leaves the sparse gsi3/gsi4 indexes, REMOVE of their keys)
    "status", "running_since", "gsi3pk", "gsi3sk", "gsi4pk", "gsi4sk",
)
#: attributes of a timeline event item (``gpufleet.store.jobs.build_event``), written with that move
EVENT_ATTRIBUTES = ("pk", "sk", "type", "job_id", "ts", "kind", "detail")


class OnPrem(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        config: InfraConfig,
        data: Data,
        bus: events.IEventBus,
        register_function: lambda_.Function,
        node_api_function: lambda_.Function,
        node_api_arn: str,
        node_attempt_routes_arn: str,
        execute_api_arn: str,
    ) -> None:
        super().__init__(scope, cid)
        stack = Stack.of(self)
        node_var = "${aws:PrincipalTag/" + NODE_PRINCIPAL_TAG + "}"
        queue_arn = stack.format_arn(
            service="sqs", resource=config.node_queue_prefix + "*", arn_format=ArnFormat.NO_RESOURCE_NAME
        )
        own_queue_arn = stack.format_arn(
            service="sqs", resource=config.node_queue_prefix + node_var, arn_format=ArnFormat.NO_RESOURCE_NAME
        )

        register_function.add_environment("GPUFLEET_NODE_QUEUE_MAX_RECEIVES", str(config.node_queue_max_receives))
        register_function.add_environment("GPUFLEET_NODE_QUEUE_PREFIX", config.node_queue_prefix)
        register_function.add_to_role_policy(
            iam.PolicyStatement(
                actions=[
                    "sqs:CreateQueue",
                    "sqs:GetQueueUrl",
                    "sqs:GetQueueAttributes",
                    "sqs:SetQueueAttributes",
                    "sqs:TagQueue",
                ],
                resources=[queue_arn],
            )
        )

        self.trust_anchor, self.profile = None, None
        source = None
        if config.node_ca_pem:
            source = rolesanywhere.CfnTrustAnchor.SourceProperty(
                source_type="CERTIFICATE_BUNDLE",
                source_data=rolesanywhere.CfnTrustAnchor.SourceDataProperty(x509_certificate_data=config.node_ca_pem),
            )
        elif config.node_ca_arn:
            source = rolesanywhere.CfnTrustAnchor.SourceProperty(
                source_type="AWS_ACM_PCA",
                source_data=rolesanywhere.CfnTrustAnchor.SourceDataProperty(acm_pca_arn=config.node_ca_arn),
            )
        if source is not None:
            self.trust_anchor = rolesanywhere.CfnTrustAnchor(
                self, "TrustAnchor", name=config.name("nodes"), enabled=True, source=source
            )
            anchor_arn = self.trust_anchor.attr_trust_anchor_arn
        else:  # no node CA configured: the role trusts no anchor (fails closed); see docs/operations.md
            anchor_arn = stack.format_arn(service="rolesanywhere", resource="trust-anchor", resource_name=NO_ANCHOR)
        principal = iam.ServicePrincipal("rolesanywhere.amazonaws.com")
        conditions = {
            "ArnEquals": {"aws:SourceArn": anchor_arn},
            "StringEquals": {"aws:SourceAccount": stack.account},
            # the CN is the node id; a registered id never ends in -dlq nor holds "_" (lambdas/nodes/register.py), so
            # no certificate can name a node whose own queue would be another node's dead-letter or signal queue
            "StringLike": {f"aws:PrincipalTag/{NODE_PRINCIPAL_TAG}": ["?*"]},
            "StringNotLike": {f"aws:PrincipalTag/{NODE_PRINCIPAL_TAG}": [f"*{DLQ_SUFFIX}", "*_*", "*/*", "*:*",
                                                                          "*.*"]},
        }
        # the session name is the node id the node API reads from the caller's ARN: it must be the CN
        assume_conditions = {**conditions,
                             "StringEquals": {**conditions["StringEquals"], "sts:RoleSessionName": node_var}}
        self.agent_role = iam.Role(
            self,
            "AgentRole",
            assumed_by=iam.PrincipalWithConditions(principal, assume_conditions),
            description="On-prem gpufleet agents (IAM Roles Anywhere; certificate CN = node id)",
        )
        self.agent_role.assume_role_policy.add_statements(
            iam.PolicyStatement(
                actions=["sts:TagSession", "sts:SetSourceIdentity"], principals=[principal], conditions=conditions
            )
        )
        if self.trust_anchor is not None:
            # the profile names only the agent role: a session from this anchor can become nothing else
            self.profile = rolesanywhere.CfnProfile(
                self,
                "Profile",
                name=config.name("nodes"),
                enabled=True,
                role_arns=[self.agent_role.role_arn],
                duration_seconds=3600,
                accept_role_session_name=True,  # the agent passes its CN; the trust policy checks it
            )
        statements = [
            iam.PolicyStatement(
                sid="OwnQueue",
                actions=[
                    "sqs:ReceiveMessage",
                    "sqs:DeleteMessage",
                    "sqs:ChangeMessageVisibility",
                    "sqs:GetQueueAttributes",
                    "sqs:GetQueueUrl",
                ],
                resources=[own_queue_arn],
            ),
            # cancel nudges (gpufleet.store.queues): read and delete on its own signal queue, nothing else
            iam.PolicyStatement(sid="OwnSignals", actions=["sqs:ReceiveMessage", "sqs:DeleteMessage"],
                                resources=[own_queue_arn + SIGNALS_SUFFIX]),
            iam.PolicyStatement(sid="NodeApi", actions=["execute-api:Invoke"], resources=[node_api_arn]),
        ]
        self.agent_policy = iam.Policy(self, "AgentPolicy", statements=statements, roles=[self.agent_role])


        def vended_role(cid: str, description: str) -> iam.Role:
            """A role only the node API assumes, each session narrowed by its session policy."""
            return iam.Role(self, cid, assumed_by=iam.ArnPrincipal(node_api_function.role.role_arn),
                            description=description, max_session_duration=Duration.hours(1))

        # per-attempt object credentials: assumed by the node API only, narrowed per session to one job
        self.node_job_role = vended_role(
            "NodeJobRole", "Per-attempt object credentials of on-prem runtimes (session policy: one job's prefixes)")
        buckets = (data.checkpoints, data.outputs, data.logs)

        def object_statements() -> list[iam.PolicyStatement]:
            return [
                iam.PolicyStatement(sid="WriteJobObjects", actions=["s3:PutObject", "s3:PutObjectTagging"],
                                    resources=[b.arn_for_objects("jobs/*") for b in buckets]),
                iam.PolicyStatement(sid="ReadJobObjectsAndInputs", actions=["s3:GetObject", "s3:GetObjectVersion"],
                                    resources=[data.checkpoints.arn_for_objects("jobs/*"),
                                               data.outputs.arn_for_objects("jobs/*"),
                                               data.outputs.arn_for_objects("tenants/*")]),
                iam.PolicyStatement(sid="ListJobCheckpoints", actions=["s3:ListBucket"],
                                    resources=[data.checkpoints.bucket_arn],
                                    conditions={"StringLike": {"s3:prefix": ["jobs/*"]}}),
                # published models: platform content, read by any attempt (the session policy names the same prefix)
                iam.PolicyStatement(sid="ReadPublishedModels", actions=["s3:GetObject"],
                                    resources=[data.models.arn_for_objects(MODELS_PREFIX + "*")]),
            ]

        self.node_job_policy = iam.Policy(self, "NodeJobPolicy", roles=[self.node_job_role],
                                          statements=object_statements())
        # a cloud container attempt's supervisor (no task role on Batch): assumed by the node API only, after the
        # attempt's one-time token was exchanged; each session narrowed to one attempt (gpufleet.nodeapi.supervisor)
        self.supervisor_role = vended_role(
            "CloudSupervisorRole",
            "A cloud container attempt's supervisor (session policy: one job's objects and attempt routes)")
        self.supervisor_policy = iam.Policy(self, "CloudSupervisorPolicy", roles=[self.supervisor_role], statements=[
            *object_statements(),
            iam.PolicyStatement(sid="NodeApiAttempts", actions=["execute-api:Invoke"],
                                resources=[node_attempt_routes_arn]),
        ])
        node_api_function.add_to_role_policy(
            iam.PolicyStatement(actions=["sts:AssumeRole"],
                                resources=[self.node_job_role.role_arn, self.supervisor_role.role_arn]))
        for name, value in (("GPUFLEET_NODE_JOB_ROLE_ARN", self.node_job_role.role_arn),
                            ("GPUFLEET_SUPERVISOR_ROLE_ARN", self.supervisor_role.role_arn),
                            ("GPUFLEET_NODE_API_ARN", execute_api_arn),
                            ("GPUFLEET_AGENT_ROLE_NAMES", self.agent_role.role_name),
                            ("GPUFLEET_PARTITION", stack.partition),
                            # every attempt session may read the published models (gpufleet.nodeapi.scope)
                            ("GPUFLEET_MODEL_S3_ROOT", data.models_root)):
            node_api_function.add_environment(name, value)
