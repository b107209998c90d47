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
  * read and write its own node record in the control table
    (``dynamodb:LeadingKeys`` = ``NODE#<its node>``);
  * read job items and update only the fenced worker attributes of them and
    of their attempt items (progress, heartbeat_at, checkpoint, generated,
    staging), every write carrying the epoch condition enforced by the store;
  * read checkpoints and inputs under ``jobs/*`` (versions too: inputs may name
    one), list the checkpoints bucket only under ``jobs/`` (a resume looks for
    fallback checkpoints), and write objects there only when they carry the
    ``gpufleet:node`` tag equal to its node id (the runtime tags every PUT on
    an on-prem node, :mod:`gpufleet.store.objectstore`);
  * describe the two tables (``gpufleet agent --check``);
  * answer Step Functions task tokens (these actions have no resource-level
    scoping in IAM) and put ``CapacityFreed`` events on the app's bus.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_rolesanywhere as rolesanywhere
from constructs import Construct

from gpufleet import tables as keys
from gpufleet.store.objectstore import NODE_TAG_KEY
from infra.config import DLQ_SUFFIX, NODE_PRINCIPAL_TAG, InfraConfig
from infra.data import Data

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
            # the CN is the node id; a registered id never ends in -dlq (lambdas/nodes/register.py), so no
            # certificate can name a node whose own queue would be another node's dead-letter queue
            "StringLike": {f"aws:PrincipalTag/{NODE_PRINCIPAL_TAG}": ["?*"]},
            "StringNotLike": {f"aws:PrincipalTag/{NODE_PRINCIPAL_TAG}": [f"*{DLQ_SUFFIX}", "*/*", "*:*", "*.*"]},
        }
        self.agent_role = iam.Role(
            self,
            "AgentRole",
            assumed_by=iam.PrincipalWithConditions(principal, conditions),
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
            )
        control = data.tables["control"]
        jobs = data.tables["jobs"]
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
            iam.PolicyStatement(
                sid="OwnNodeRecord",
                actions=["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"],
                resources=[control.table_arn],
                conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [keys.node_pk(node_var)]}},
            ),
            iam.PolicyStatement(
                sid="ReadJobs",
                actions=["dynamodb:GetItem"],
                resources=[jobs.table_arn],
                conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [keys.job_pk("*")]}},
            ),
            iam.PolicyStatement(
                sid="FencedWorkerWrites",
                actions=["dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"],
                resources=[jobs.table_arn],
                conditions={
                    "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [keys.job_pk("*")]},
                    "ForAllValues:StringEquals": {"dynamodb:Attributes": list(WORKER_WRITABLE_ATTRIBUTES)},
                },
            ),
            iam.PolicyStatement(
                sid="TimelineEvents",
                actions=["dynamodb:PutItem"],
                resources=[jobs.table_arn],
                conditions={
                    "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [keys.job_pk("*")]},
                    "ForAllValues:StringEquals": {"dynamodb:Attributes": list(EVENT_ATTRIBUTES)},
                },
            ),
            iam.PolicyStatement(
                sid="DescribeTables",
                actions=["dynamodb:DescribeTable"],
                resources=[control.table_arn, jobs.table_arn],
            ),
            iam.PolicyStatement(
                sid="ReadJobObjects",
                actions=["s3:GetObject", "s3:GetObjectVersion"],
                resources=[data.checkpoints.arn_for_objects("jobs/*"), data.outputs.arn_for_objects("jobs/*")],
            ),
            iam.PolicyStatement(
                sid="ListJobCheckpoints",
                actions=["s3:ListBucket"],
                resources=[data.checkpoints.bucket_arn],
                conditions={"StringLike": {"s3:prefix": ["jobs/*"]}},
            ),
            iam.PolicyStatement(
                sid="WriteOwnTaggedObjects",
                actions=["s3:PutObject", "s3:PutObjectTagging"],
                resources=[
                    data.checkpoints.arn_for_objects("jobs/*"),
                    data.outputs.arn_for_objects("jobs/*"),
                    data.logs.arn_for_objects("jobs/*"),
                ],
                conditions={"StringEquals": {f"s3:RequestObjectTag/{NODE_TAG_KEY}": node_var}},
            ),
            iam.PolicyStatement(
                sid="TaskTokens",
                actions=["states:SendTaskHeartbeat", "states:SendTaskSuccess", "states:SendTaskFailure"],
                resources=["*"],
            ),
            iam.PolicyStatement(sid="CapacityEvents", actions=["events:PutEvents"], resources=[bus.event_bus_arn]),
        ]
        self.agent_policy = iam.Policy(self, "AgentPolicy", statements=statements, roles=[self.agent_role])
