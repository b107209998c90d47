"""Observability construct: one CloudWatch dashboard, the alarms and the SLO burn-rate alarms, to an SNS topic.

Contract:
- Every custom metric a widget or alarm reads is built from a :class:`gpufleet.metrics.catalog.MetricDef`
  with exactly one of its dimension sets (:func:`_custom` refuses others), so it reads what the code
  emits; ``tests/infra/test_infra_metrics_emitted.py`` runs the code on moto and checks each one.
- Dashboard rows: scheduling (pending jobs, queue wait p50/p90 and p95 per pool, placements,
  GPU-seconds, pass duration, jobs left PENDING by reason, free and fragmented GPUs per pool), attempt
  phases (p50 per phase) and model loads (cache hit/miss), failures
  (attempt failures by class, jobs ended by outcome), workflow executions, API latency and errors,
  queue backlogs (webhook queue, DLQs, per-node DLQs).
- ``self.topic`` is encrypted with a customer-managed KMS key (rotation on) whose key policy
  lets CloudWatch (``cloudwatch.amazonaws.com``, this account) ``kms:Decrypt`` and
  ``kms:GenerateDataKey*``, so alarm actions can publish to it.
- Paging alarms (each with the topic as its action; ``self.alarms``): API 5XX, failed executions,
  any message in a stack DLQ or in any per-node DLQ (a Metrics Insights query over
  ``AWS/SQS`` queues named ``<node_queue_prefix>%-dlq``: node queues are created at registration,
  outside the stack), scheduler/outbox/API Lambda errors, p90 queue wait above
  ``pending_wait_alarm_seconds``, any QUARANTINED job, any finalize-failed job (a workflow failure,
  ``WorkflowFailed``, ends its execution FAILED: the failed-executions alarm pages for it), and node API calls of
  unregistered nodes (``NodeCallsRefused`` ``Reason=unregistered`` ≥ :data:`UNREGISTERED_CALLS_THRESHOLD` in 5 min:
  a deregistered node's key still in use).
- SLOs (``self.slo_alarms``: composite alarms with the topic as action; their window alarms have
  no action): queue wait per pool (``slo_queue_wait_objective`` of placements wait at most
  ``slo_queue_wait_seconds``: ``PR(0:T)`` of ``QueueWaitSeconds``), job success rate excluding
  user errors (``JobsEnded`` by outcome), API availability (5XX / Count). Each is the multi-window
  burn-rate rule of the SRE workbook: ALARM when (1 h and 5 min burn ≥ 14.4) or (6 h and 30 min
  burn ≥ 6), burn = bad share / (1 - objective).
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

from gpufleet.lifecycle.billing import Outcome
from gpufleet.metrics import catalog as M
from gpufleet.phases import MODEL_CACHE, PHASE_NAMES
from gpufleet.pools import load_pools
from gpufleet.scheduler.passes import UNPLACED_REASONS
from gpufleet.status import FailureClass
from infra.config import InfraConfig

PERIOD = Duration.minutes(5)
#: refused calls of unregistered nodes in one period that page: an agent's node heartbeats alone are ~30 in 5 min,
#: while an agent started a moment before its registration makes a few
UNREGISTERED_CALLS_THRESHOLD = 10

#: (long window, short window, burn-rate threshold): the SRE workbook's page and ticket pairs.
BURN_WINDOWS = ((Duration.hours(1), Duration.minutes(5), 14.4), (Duration.hours(6), Duration.minutes(30), 6.0))

#: Terminal outcomes that count against the success SLO (the platform's fault); user errors,
#: cancellations, rejected prompts and blocked outputs are excluded from it altogether.
SLO_BAD_OUTCOMES = (Outcome.SYSTEM_FAILURE, Outcome.QUARANTINED, Outcome.PREEMPTED)


def _custom(metric: M.MetricDef, statistic: str, period: Duration = PERIOD, **dims: str) -> cw.Metric:
    """``metric`` under ``dims``, which must be exactly one of its dimension sets."""
    if tuple(sorted(dims)) not in {tuple(sorted(ds)) for ds in metric.dimension_sets}:
        raise ValueError(f"{metric.name} is not emitted with dimensions {sorted(dims)}")
    return cw.Metric(namespace=M.NAMESPACE, metric_name=metric.name, statistic=statistic, period=period,
                     dimensions_map=dims or None)


def node_dlq_query(node_queue_prefix: str) -> str:
    """The Metrics Insights query of the deepest per-node DLQ (queues ``<prefix><node>-dlq``)."""
    return ('SELECT MAX(ApproximateNumberOfMessagesVisible) FROM SCHEMA("AWS/SQS", QueueName) '
            f"WHERE QueueName LIKE '{node_queue_prefix}%-dlq'")


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
        self._action = cw_actions.SnsAction(self.topic)
        self.alarms: list[cw.Alarm] = []
        self.slo_alarms: list[cw.CompositeAlarm] = []
        pools = [p.name for p in load_pools({})]  # the functions get no GPUFLEET_POOLS: the default pools
        onprem_pools = [p.name for p in load_pools({}) if p.kind.value == "onprem"]

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
            a.add_alarm_action(self._action)
            self.alarms.append(a)

        api_dims = {"ApiName": api_name}
        api_latency_p50 = cw.Metric(namespace="AWS/ApiGateway", metric_name="Latency", dimensions_map=api_dims,
                                    statistic="p50", period=PERIOD)
        api_latency_p99 = api_latency_p50.with_(statistic="p99")
        api_4xx = cw.Metric(namespace="AWS/ApiGateway", metric_name="4XXError", dimensions_map=api_dims,
                            statistic="Sum", period=PERIOD)
        api_5xx = cw.Metric(namespace="AWS/ApiGateway", metric_name="5XXError", dimensions_map=api_dims,
                            statistic="Sum", period=PERIOD)
        api_count = cw.Metric(namespace="AWS/ApiGateway", metric_name="Count", dimensions_map=api_dims,
                              statistic="Sum", period=PERIOD)
        wait_p90 = _custom(M.QUEUE_WAIT, "p90")
        node_dlqs = cw.MathExpression(expression=node_dlq_query(config.node_queue_prefix), period=PERIOD,
                                      label="deepest per-node DLQ", using_metrics={})

        alarm("Api5xx", api_5xx, config.api_5xx_threshold, "API returned 5XX responses")
        alarm("QueueWait", wait_p90, config.pending_wait_alarm_seconds, "p90 queue wait above target")
        for name, queue in dead_letter_queues.items():
            alarm(f"{name}Dlq", queue.metric_approximate_number_of_messages_visible(period=PERIOD), 1,
                  f"Messages in the {name} dead-letter queue")
        alarm("NodeDlqs", node_dlqs, 1, "Messages in a per-node dead-letter queue (an envelope no agent took)")
        for name, fn in critical_functions.items():
            alarm(f"{name}Errors", fn.metric_errors(period=PERIOD), 1, f"{name} Lambda errors")
        alarm("Quarantined", _custom(M.JOBS_ENDED, "Sum", Outcome=Outcome.QUARANTINED.value), 1,
              "A job was QUARANTINED (it failed on too many workers)")
        alarm("FinalizeFailed", _custom(M.FINALIZE_FAILED, "Sum"), 1,
              "A job's finalize or publish failed for good (FAILED, stage finalize)")
        alarm("UnregisteredNodeCalls", _custom(M.NODE_CALLS_REFUSED, "Sum", Reason="unregistered"),
              UNREGISTERED_CALLS_THRESHOLD,
              "A caller with the agent role but no registration keeps calling the node API (a deregistered node's "
              "agent still running, or its key in other hands): the node_call_refused log lines name it")

        # --- SLOs ------------------------------------------------------------------------------------
        wait_target = config.slo_queue_wait_seconds
        for pool in pools:
            def within(window: Duration, pool: str = pool) -> dict[str, cw.IMetric]:
                return {"ok": _custom(M.QUEUE_WAIT, cw.Stats.percentile_rank(0, wait_target), window, Pool=pool)}

            self._slo(f"QueueWaitSlo{_camel(pool)}", f"queue wait in {pool}: {config.slo_queue_wait_objective:.1%} "
                      f"of placements within {wait_target}s", config.slo_queue_wait_objective,
                      "(100 - ok) / 100", within)

        def outcomes(window: Duration) -> dict[str, cw.IMetric]:
            used = {"ok": _custom(M.JOBS_ENDED, "Sum", window, Outcome=Outcome.SUCCEEDED.value)}
            for i, o in enumerate(SLO_BAD_OUTCOMES):
                used[f"bad{i}"] = _custom(M.JOBS_ENDED, "Sum", window, Outcome=o.value)
            return used

        bad = " + ".join(f"FILL(bad{i}, 0)" for i in range(len(SLO_BAD_OUTCOMES)))
        self._slo("SuccessSlo", f"job success rate {config.slo_success_objective:.2%} (user errors excluded)",
                  config.slo_success_objective, f"({bad}) / (FILL(ok, 0) + {bad})", outcomes)

        def requests(window: Duration) -> dict[str, cw.IMetric]:
            return {"errors": api_5xx.with_(period=window), "requests": api_count.with_(period=window)}

        self._slo("ApiAvailabilitySlo", f"API availability {config.slo_api_availability_objective:.2%}",
                  config.slo_api_availability_objective, "FILL(errors, 0) / requests", requests)

        # --- dashboard -------------------------------------------------------------------------------
        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=config.name("operations"))
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Queue depth (pending jobs)", left=[_custom(M.PENDING_JOBS, "Maximum")]),
            cw.GraphWidget(title="Queue wait (s)", left=[_custom(M.QUEUE_WAIT, "p50"), wait_p90]),
            cw.GraphWidget(title="Placements", left=[_custom(M.PLACEMENTS, "Sum")]),
            cw.GraphWidget(title="GPU-seconds", left=[_custom(M.GPU_SECONDS, "Sum")]),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Queue wait p95 by pool (s)",
                           left=[_custom(M.QUEUE_WAIT, "p95", Pool=p) for p in pools]),
            cw.GraphWidget(title="Placements by pool", left=[_custom(M.PLACEMENTS, "Sum", Pool=p) for p in pools]),
            cw.GraphWidget(title="Free GPUs after each pass (min)",
                           left=[_custom(M.FREE_GPUS, "Minimum", Pool=p) for p in pools]),
            cw.GraphWidget(title="Fragmented free GPUs (max)",
                           left=[_custom(M.FRAGMENTED_GPUS, "Maximum", Pool=p) for p in pools]),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Scheduler pass", left=[_custom(M.PASS_SECONDS, "Maximum")],
                           right=[_custom(M.JOBS_CONSIDERED, "Maximum")]),
            cw.GraphWidget(title="Jobs left PENDING by reason", stacked=True,
                           left=[_custom(M.UNSCHEDULABLE, "Maximum", Reason=r) for r in UNPLACED_REASONS]),
            cw.GraphWidget(title="GPU-seconds by pool", left=[_custom(M.GPU_SECONDS, "Sum", Pool=p) for p in pools]),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Attempt phases (p50 s)", stacked=True,
                           left=[_custom(M.PHASE_SECONDS, "p50", Phase=ph) for ph in PHASE_NAMES if ph != "run"]),
            cw.GraphWidget(title="Model loads (cache)", left=[_custom(M.MODEL_LOADS, "Sum", ModelCache=c)
                                                               for c in MODEL_CACHE]),
            cw.GraphWidget(title="Model loads fetched (cache misses) by pool",
                           left=[_custom(M.MODEL_LOADS, "Sum", Pool=p, ModelCache="miss") for p in pools]),
            cw.GraphWidget(title="On-prem GPU utilisation (agents' NVML) and cache",
                           left=[_custom(M.NODE_GPU_BUSY, "Average", Pool=p) for p in onprem_pools],
                           right=[_custom(m, "Sum", Pool=p) for p in onprem_pools
                                  for m in (M.NODE_CACHE_HITS, M.NODE_CACHE_MISSES)]),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="Attempt failures by class",
                left=[_custom(M.ATTEMPT_FAILURES, "Sum", FailureClass=c.value) for c in FailureClass],
                stacked=True,
            ),
            cw.GraphWidget(title="Jobs ended by outcome", stacked=True,
                           left=[_custom(M.JOBS_ENDED, "Sum", Outcome=o.value) for o in Outcome]),
            cw.GraphWidget(title="Finalize failures", left=[_custom(M.FINALIZE_FAILED, "Sum")]),
            cw.GraphWidget(title="Node API calls of unregistered nodes",
                           left=[_custom(M.NODE_CALLS_REFUSED, "Sum", Reason="unregistered")]),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="API latency (ms)", left=[api_latency_p50, api_latency_p99]),
            cw.GraphWidget(title="API errors", left=[api_4xx, api_5xx]),
            cw.GraphWidget(
                title="Webhook backlog",
                left=[webhook_queue.metric_approximate_number_of_messages_visible(period=PERIOD)],
                right=[q.metric_approximate_number_of_messages_visible(period=PERIOD)
                       for q in dead_letter_queues.values()],
            ),
            cw.GraphWidget(title="Per-node DLQs (deepest)", left=[node_dlqs]),
        )
        if state_machine is not None:
            failed = state_machine.metric_failed(period=PERIOD)
            alarm("ExecutionsFailed", failed, 1, "Workflow executions failed (a job ended FAILED or QUARANTINED)")
            self.dashboard.add_widgets(
                cw.GraphWidget(
                    title="Workflow executions",
                    left=[state_machine.metric_started(period=PERIOD), state_machine.metric_succeeded(period=PERIOD),
                          failed, state_machine.metric_timed_out(period=PERIOD)],
                )
            )

    def _slo(self, cid: str, what: str, objective: float, bad_share: str, metrics) -> None:
        """A composite burn-rate alarm over :data:`BURN_WINDOWS`; ``bad_share`` is a math expression over
        ``metrics(window)`` giving the share of bad events (0..1)."""
        budget = 1.0 - objective
        rules = []
        for long_w, short_w, burn in BURN_WINDOWS:
            pair = []
            for window in (long_w, short_w):
                label = f"{int(window.to_minutes())}m"
                a = cw.Alarm(
                    self,
                    f"{cid}Burn{label}",
                    metric=cw.MathExpression(expression=f"({bad_share}) / {budget:.6g}", using_metrics=metrics(window),
                                             period=window, label=f"{what}: burn rate over {label}"),
                    threshold=burn,
                    evaluation_periods=1,
                    comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                    treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                    alarm_description=f"{what}: error budget burn rate over {label} at least {burn}",
                )
                pair.append(cw.AlarmRule.from_alarm(a, cw.AlarmState.ALARM))
            rules.append(cw.AlarmRule.all_of(*pair))
        composite = cw.CompositeAlarm(
            self, cid, alarm_rule=cw.AlarmRule.any_of(*rules),
            alarm_description=f"SLO {what}: error budget burning fast (1 h and 5 min ≥ 14.4x, or 6 h and 30 min ≥ 6x)",
        )
        composite.add_alarm_action(self._action)
        self.slo_alarms.append(composite)


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.replace("_", "-").split("-"))
