"""Observability construct: one CloudWatch dashboard and the alarms, routed to an SNS topic.

Contract:
- Dashboard rows: scheduling (pending jobs, queue wait p50/p90, placements,
  GPU-seconds), failures by class, workflow executions, API latency and errors,
  webhook delivery backlog. Custom metrics are in ``METRICS_NAMESPACE`` under
  the names in infra/config.py; emitters must use those names.
- ``self.topic`` is encrypted with a customer-managed KMS key (rotation on) whose key policy
  lets CloudWatch (``cloudwatch.amazonaws.com``, this account) ``kms:Decrypt`` and
  ``kms:GenerateDataKey*``, so alarm actions can publish to it.
- Alarms (all to ``self.topic``): API 5XX, failed executions, any message in
  the webhook or outbox DLQ, scheduler or outbox Lambda errors, p90 queue
  wait above ``pending_wait_alarm_seconds``.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import (
    FAILURE_CLASSES,
    METRIC_FAILURES,
    METRIC_GPU_SECONDS,
    METRIC_PENDING_JOBS,
    METRIC_PLACEMENTS,
    METRIC_WAIT_SECONDS,
    METRICS_NAMESPACE,
    InfraConfig,
)

PERIOD = Duration.minutes(5)


def _custom(name: str, statistic: str, **dims: str) -> cw.Metric:
    return cw.Metric(
        namespace=METRICS_NAMESPACE, metric_name=name, statistic=statistic, period=PERIOD, dimensions_map=dims or None
    )


class Observability(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        config: InfraConfig,
        api_name: str,
        state_machine: sfn.IStateMachine | None,
        webhook_queue: sqs.IQueue,
        dead_letter_queues: dict[str, sqs.IQueue],
        critical_functions: dict[str, lambda_.IFunction],
    ) -> None:
        super().__init__(scope, cid)
        # A customer-managed key: CloudWatch alarms cannot publish to a topic under the AWS-managed
        # SNS key (its policy cannot admit cloudwatch.amazonaws.com).
        self.topic_key = kms.Key(
            self,
            "AlarmsKey",
            description=f"{config.prefix} alarm topic (SSE); CloudWatch alarms publish through it",
            enable_key_rotation=True,
        )
        self.topic_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            )
        )
        self.topic = sns.Topic(
            self,
            "Alarms",
            display_name=f"{config.prefix} alarms",
            master_key=self.topic_key,
            enforce_ssl=True,
        )
        if config.alarm_email:
            self.topic.add_subscription(subs.EmailSubscription(config.alarm_email))
        action = cw_actions.SnsAction(self.topic)
        self.alarms: list[cw.Alarm] = []

        def alarm(cid: str, metric: cw.IMetric, threshold: float, description: str) -> None:
            a = cw.Alarm(
                self,
                cid,
                metric=metric,
                threshold=threshold,
                evaluation_periods=1,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                alarm_description=description,
            )
            a.add_alarm_action(action)
            self.alarms.append(a)

        api_dims = {"ApiName": api_name}
        api_latency_p50 = cw.Metric(namespace="AWS/ApiGateway", metric_name="Latency", dimensions_map=api_dims,
                                    statistic="p50", period=PERIOD)
        api_latency_p99 = api_latency_p50.with_(statistic="p99")
        api_4xx = cw.Metric(namespace="AWS/ApiGateway", metric_name="4XXError", dimensions_map=api_dims,
                            statistic="Sum", period=PERIOD)
        api_5xx = cw.Metric(namespace="AWS/ApiGateway", metric_name="5XXError", dimensions_map=api_dims,
                            statistic="Sum", period=PERIOD)
        wait_p90 = _custom(METRIC_WAIT_SECONDS, "p90")

        alarm("Api5xx", api_5xx, config.api_5xx_threshold, "API returned 5XX responses")
        alarm("QueueWait", wait_p90, config.pending_wait_alarm_seconds, "p90 queue wait above target")
        for name, queue in dead_letter_queues.items():
            alarm(f"{name}Dlq", queue.metric_approximate_number_of_messages_visible(period=PERIOD), 1,
                  f"Messages in the {name} dead-letter queue")
        for name, fn in critical_functions.items():
            alarm(f"{name}Errors", fn.metric_errors(period=PERIOD), 1, f"{name} Lambda errors")

        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=config.name("operations"))
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Queue depth (pending jobs)", left=[_custom(METRIC_PENDING_JOBS, "Maximum")]),
            cw.GraphWidget(title="Queue wait (s)", left=[_custom(METRIC_WAIT_SECONDS, "p50"), wait_p90]),
            cw.GraphWidget(title="Placements", left=[_custom(METRIC_PLACEMENTS, "Sum")]),
            cw.GraphWidget(title="GPU-seconds", left=[_custom(METRIC_GPU_SECONDS, "Sum")]),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="Attempt failures by class",
                left=[_custom(METRIC_FAILURES, "Sum", FailureClass=c) for c in FAILURE_CLASSES],
                stacked=True,
            ),
            cw.GraphWidget(title="API latency (ms)", left=[api_latency_p50, api_latency_p99]),
            cw.GraphWidget(title="API errors", left=[api_4xx, api_5xx]),
            cw.GraphWidget(
                title="Webhook backlog",
                left=[webhook_queue.metric_approximate_number_of_messages_visible(period=PERIOD)],
                right=[q.metric_approximate_number_of_messages_visible(period=PERIOD)
                       for q in dead_letter_queues.values()],
            ),
        )
        if state_machine is not None:
            failed = state_machine.metric_failed(period=PERIOD)
            alarm("ExecutionsFailed", failed, 1, "Workflow executions failed")
            self.dashboard.add_widgets(
                cw.GraphWidget(
                    title="Workflow executions",
                    left=[state_machine.metric_started(period=PERIOD), state_machine.metric_succeeded(period=PERIOD),
                          failed, state_machine.metric_timed_out(period=PERIOD)],
                )
            )
