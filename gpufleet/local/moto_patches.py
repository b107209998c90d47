"""Every patch gpufleet applies to moto 5.2.5, in one place.

Each patch fills a gap of moto 5.2.5 named in its own docstring below; ``tests/functional/local/test_local_moto_patches.py`` has one test
per patch that fails when moto's own behaviour changes (so the patch can go).

- :func:`patch_lambda` replaces ``LambdaFunction._invoke_lambda`` (Docker by
  default) with a callable ``(function, event) -> (payload, errored, logs)``;
  it then serves Invoke, Step Functions ``lambda:invoke`` and SQS/DynamoDB
  event-source mappings alike.
- :func:`patch_batch_integration` implements the Step Functions Batch task's
  ``_normalise_parameters`` / ``_normalise_response`` (no-op stubs in moto)
  from botocore's service model, so ``batch:submitJob(.sync)`` works; likewise for AWS SDK integration tasks
  (``aws-sdk:batch:submitJob``/``describeJobs``: RunCloudGang), which moto leaves in Step Functions casing.
- :func:`patch_batch_cfn_attributes` gives moto's Batch CloudFormation models
  the ``Fn::GetAtt`` attributes CDK uses (``ComputeEnvironmentArn``,
  ``JobQueueArn``, ``JobDefinitionArn``); moto's models have none.
- :func:`patch_event_bus_ref` makes ``Ref <AWS::Events::EventBus>`` resolve
  to the bus name (moto's model has no ``physical_resource_id``, so ``Ref``
  yields the model object and ``AWS::Events::Rule`` on that bus fails).
- :func:`patch_callback_retry_tokens`: moto keeps a task's callback endpoint
  (task token) across ``Retry`` attempts of the same state, and the first
  attempt interrupts it when it ends, so every retried ``.sync`` /
  ``.waitForTaskToken`` attempt fails at once. Each attempt gets a fresh token.
- :func:`patch_callback_answered_once`: a task token answers once; a second answer is ``TaskTimedOut``
  as in AWS (moto overwrites the first answer silently while the execution runs).
- :func:`patch_callback_early_answers`: a heartbeat or an answer that reaches a callback task before moto has set up
  its heartbeat endpoint (moto does that after the task's service call, so a fast worker can beat it) counts, as on
  AWS: the heartbeat succeeds, and an answer already given ends the heartbeat wait at once (else the execution sat
  out the task's ``HeartbeatSeconds`` and timed out).
- :func:`patch_cfn_secrets` lets moto's CloudFormation create
  ``AWS::SecretsManager::Secret`` (moto skips the type, ``Ref`` then yields
  nothing and any IAM statement on the secret is rejected as malformed). The
  secret gets a generated string, as ``GenerateSecretString`` asks.
- :func:`patch_cfn_json_templates`: moto parses every template with PyYAML's
  pure-Python loader first (about 5 s for the gpufleet template); JSON
  templates are parsed as JSON, YAML ones as before.
- :func:`patch_cfn_lambda_image`: moto's CloudFormation model of ``AWS::Lambda::Function``
  drops ``PackageType``, ``ImageConfig`` and ``Architectures``, so a container-image function
  (CheckPrompt) is created as a zip function with no handler. The patch keeps them on the
  created function, as CloudFormation does, so the Lambda runner reads the handler from
  ``ImageConfig.Command`` of the real template (stack updates are not patched: the harness
  only creates stacks).
- :func:`patch_dynamodb_serialised`: moto's DynamoDB backend is not thread-safe: a request that
  serialises an item (``UpdateItem``'s ``to_json``) while another thread's request adds an attribute to
  it fails with ``RuntimeError: dictionary changed size during iteration`` (a runtime's heartbeat thread
  and its stage both write the job item). The patch runs DynamoDB requests one at a time. A table's
  stream consumers, which moto invokes synchronously inside the write, are invoked after the request
  has released the lock, on the same thread and before the request returns (their event is built
  under the lock): a consumer's own DynamoDB calls, and any other thread's, then never wait on a
  lock held by the write that triggered it (with the Lambda runner's lock, that was a deadlock).
  Safe in server mode too: a consumer calling back over HTTP runs on another thread after the lock
  is released.
- :func:`patch_dynamodb_transaction_backup`: before each ``TransactWriteItems`` moto deep-copies every
  table the transaction touches (once per item) to roll back a cancelled one by putting the copies
  back. That costs time in the size of the whole table (in the dev stack's e2e run, the largest share
  of its CPU) and the rollback also undoes every other request's writes to those tables made
  meanwhile. The patch backs up the transaction's own items only and, on cancellation, restores
  exactly those (a missing one is removed again); moto's table copy becomes the table itself.
- :func:`patch_stepfunctions_program_cache`: moto parses an execution's state machine definition with
  its ANTLR grammar in pure Python when the execution starts (the largest single CPU cost of admitting a
  job on the dev stack). The patch parses each definition once and hands every execution of it the same
  program. The program is the parsed tree only: an execution's state lives in its own ``Environment``
  (the components' only lazily set attribute, ``heap_key``, is fixed once when the program is cached, so
  concurrent executions never race on it).
- :func:`patch_dynamodb_count_without_copy`: moto's ``Query`` deep-copies every matching item before
  counting them, also for ``Select=COUNT`` (the API's soft-quota count reads up to a thousand queued job
  items per submission). A COUNT query's matches are counted without the copy (nothing of them is
  returned, and the projection and filter read them only).
- :func:`patch_dynamodb_fast_item_json`: moto writes every DynamoDB response through its generic
  botocore-model serializer, which walks the ``AttributeValue`` union of every attribute of every item
  (the scheduler pass's read of all pending jobs made it the largest CPU cost of a dev stack holding a few
  hundred parked jobs). The results of ``Query``, ``Scan``, ``GetItem`` and ``BatchGetItem`` are already
  DynamoDB JSON (binary values as bytes), so the patch writes them with ``json.dumps`` (bytes in base64,
  as the serializer does); every other operation, and every error, goes through moto's serializer.
- :func:`patch_batch_ecs_properties`: moto's Batch drops ``ecsProperties`` (``RegisterJobDefinition``:
  a definition with only ``ecsProperties`` is refused, "containerProperties or eksProperties must be
  provided") and ``ecsPropertiesOverride`` (``SubmitJob``). The patch keeps both, as AWS does: the
  definition's ``ecsProperties`` (each task's containers must name an image) come back from
  ``DescribeJobDefinitions``, and a job's override is on the moto job (``ecs_properties_override``) for the
  local runner (:mod:`gpufleet.local.batch_runner`); ``DescribeJobs`` reports the job's ``ecsProperties``, the
  definition's with the override applied per container (:func:`ecs_properties_of`), as AWS does.
- :func:`patch_batch_runner` overrides ``BatchSimpleBackend._mark_job_as_finished``
  (which marks every job SUCCEEDED at submit) to hand the job to a runner, and
  makes ``DescribeJobs`` report the container's exit code as AWS does; it keeps SubmitJob's ``nodeOverrides``
  on the job (``job.node_overrides``: moto's backend drops them) so a multi-node parallel job runs with the
  node count and per-node overrides it was submitted with (:mod:`gpufleet.local.batch_runner`).
- :func:`patch_server_backend_lookup`: moto's server finds the backend of every request by listing its own
  package directory (``list_of_moto_modules``: a ``listdir`` and an ``isdir`` per service, about 1.5 ms) and
  matching the host against every service's URL patterns, under the one lock of its dispatcher. The backend a
  host names never changes while the server runs: the patch remembers it per host.
- :func:`patch_stepfunctions_short_error_logs`: when a state fails (a task error, a timeout, an execution
  stopped) moto logs the ``repr`` of every component the error passes through, each the whole subtree of
  the state machine (5-6 kB a line, several per failure), whether or not anything logs at that level; the
  dev stack's Ctrl-C aborts hundreds of executions at once. The patch logs the component's class and state
  name instead, and only when the logger is enabled for errors.
- :func:`patch_dynamodb_fast_types`: moto compares and orders DynamoDB values through ``cast_value``, which
  tests five other types before it returns a string as it is, and sizes a map by copying each of its values
  (and, recursively, theirs) into a new ``DynamoType`` first. An index ``Query`` matches the hash key of every
  item of the table, sorts the matches and sizes each (the API's two soft-quota counts per submission were
  the largest CPU cost of a dev stack admitting a burst). The patch returns strings, binaries and booleans as
  they are (also when comparing them) and sizes maps and lists without the copies; the values, comparisons
  and sizes are moto's.
- :func:`patch_dynamodb_query_item_sizes`: a ``Query`` or ``Scan`` sizes every item it matches (against the
  1 MB page limit) before any filter, on every call, although an item's size changes only when it is written.
  The patch keeps each stored item's size once computed by a read, and forgets it when ``UpdateItem`` (also
  inside a transaction) changes the item in place (``PutItem`` replaces the item object; every DynamoDB
  request runs alone under :func:`patch_dynamodb_serialised`'s lock, so no read sees an item mid-update).
- :func:`patch_dynamodb_query_candidates`: moto's ``Query`` starts from every item of the table, sorted by
  primary key (``Table.all_items``: a sort of the whole table with moto's value comparisons), and then
  keeps those whose partition key matches: each of the scheduler pass's seventeen PENDING-partition
  queries, its directory queries and the API's soft-quota counts walked and sorted the whole jobs or control
  table (with a few hundred parked jobs, the largest share of a pass's cost). The patch hands the query
  only the items that can match: a table query the items stored under its partition key; an index query
  (key condition expression) the items whose index partition key attributes equal the condition's (one
  pass over the table, no sort). moto then matches, sorts (by the index's and the table's keys: a total
  order, so the result and its pagination are moto's), filters and projects them as before.
- :func:`patch_dynamodb_fast_projection`: moto projects an item (``ProjectionExpression``, a ``KEYS_ONLY`` or
  ``INCLUDE`` index) by converting the whole item to Python values (a deep copy of every attribute) and the
  projection back to DynamoDB JSON: the scheduler pass's PENDING read converted every pending job's spec,
  command, environment and prompt to keep a dozen small attributes. The patch walks the projected paths (map
  keys) in the stored item and converts only the attributes they name, through the same two conversions, so
  the values are moto's; a path with a list index, or through something that is not a map, goes to moto.
  ``Query`` also deep-copies every matching item before projecting it; with a ``ProjectionExpression`` the
  projection makes new items anyway, so that copy is skipped too (as for ``Select=COUNT``).
- :func:`patch_stepfunctions_client_cache`: moto's Step Functions interpreter builds a new boto3 client for
  every task it runs (``boto_client_for``: loading the service model, the endpoint resolver and the event
  hooks, tens of ms of CPU, for every Lambda task of every execution). The patch keeps one client per region,
  service and endpoint (a boto3 client is safe to share between threads; moto's settings for it are kept).
- :func:`patch_foreground_gate`: moto's server serves each request on its own thread. With a
  :class:`gpufleet.local.foreground.ForegroundGate`, a request that carries the foreground header runs as a
  foreground section; any other waits for its background turn first (:mod:`gpufleet.local.foreground`).

- :class:`AsyncStreamDelivery`: moto invokes a table's stream event-source mappings
  synchronously inside the write, once per item (in ``TransactWriteItems`` before the
  transaction's other items exist). The patch replaces ``StreamShard.add`` so a write only
  appends its record; a background thread delivers each shard's records in order, in batches,
  once no record has arrived for ``settle_s``, as AWS's stream pollers do after the write.
  :meth:`AsyncStreamDelivery.stop` delivers what is pending and restores moto. Used by the dev
  stack.

:func:`patched` applies the chosen patches and restores moto on exit.
:data:`MOTO_CONFIG` is the ``mock_aws`` config the harness uses.
"""

from __future__ import annotations

import datetime
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import cache
from typing import Any

from gpufleet.local.background import PatchedDelivery

#: mock_aws config: execute state machines; Batch without Docker (jobs go to the local runner).
MOTO_CONFIG: dict[str, Any] = {
    "stepfunctions": {"execute_state_machine": True},
    "batch": {"use_docker": False},
}

#: ``(moto LambdaFunction, event) -> (payload JSON, errored, log text)``
LambdaInvoker = Callable[[Any, Any], tuple[str, bool, str]]
#: ``(moto batch Job) -> None``: runs the job, then calls ``finish_job``.
BatchJobRunner = Callable[[Any], None]


@contextmanager
def _replace(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def patch_lambda(invoker: LambdaInvoker) -> Iterator[None]:
    """Run every Lambda invocation through ``invoker`` instead of Docker."""
    from moto.awslambda.models import LambdaFunction

    def _invoke_lambda(self, event: Any = None) -> tuple[str, bool, str]:
        self.logs_backend.ensure_log_group(self.logs_group_name)
        return invoker(self, {} if event is None else event)

    with _replace(LambdaFunction, "_invoke_lambda", _invoke_lambda):
        yield


@cache
def _operation_model(service: str, snake_action: str):
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model(service)
    for name in model.operation_names:
        if xform_name(name) == snake_action:
            return model.operation_model(name)
    raise KeyError(f"{service} has no operation {snake_action}")


def _normalise_parameters(self, parameters: dict, boto_service_name=None, service_action_name=None) -> None:
    op = _operation_model(
        self._get_boto_service_name(boto_service_name), self._get_boto_service_action(service_action_name)
    )
    if op.input_shape is not None:
        self._to_boto_request(parameters, op.input_shape)


def _normalise_response(self, response: Any, boto_service_name=None, service_action_name=None) -> None:
    op = _operation_model(
        self._get_boto_service_name(boto_service_name), self._get_boto_service_action(service_action_name)
    )
    if op.output_shape is not None:
        self._from_boto_response(response, op.output_shape)


@contextmanager
def patch_batch_integration() -> Iterator[None]:
    """Translate Batch task parameters/responses between Step Functions and botocore casing; the same for AWS SDK
    integration tasks (``aws-sdk:<service>:<action>``: RunCloudGang's ``batch:submitJob``/``describeJobs``), which
    moto passes to boto3 as written (PascalCase) and returns as boto3 answers (camelCase)."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_aws_sdk import (
        StateTaskServiceAwsSdk,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_batch import (
        StateTaskServiceBatch,
    )

    with ExitStack() as stack:
        for cls in (StateTaskServiceBatch, StateTaskServiceAwsSdk):
            stack.enter_context(_replace_or_add(cls, "_normalise_parameters", _normalise_parameters))
            stack.enter_context(_replace_or_add(cls, "_normalise_response", _normalise_response))
        yield


@contextmanager
def _replace_or_add(owner: type, name: str, value: Any) -> Iterator[None]:
    """Set ``owner.name`` (inherited or not) and restore exactly what was there."""
    had_own = name in owner.__dict__
    original = owner.__dict__.get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


_BATCH_ARN_ATTRIBUTES = {
    "ComputeEnvironment": "ComputeEnvironmentArn",
    "JobQueue": "JobQueueArn",
    "JobDefinition": "JobDefinitionArn",
}


@contextmanager
def patch_batch_cfn_attributes() -> Iterator[None]:
    """``Fn::GetAtt <BatchResource>.<Kind>Arn`` resolves to the resource's ARN; a ``multinode`` job definition
    (``Type: multinode``, the cloud gangs' definition) is registered as one (moto's CloudFormation registers
    every definition as ``container``, which refuses one without container properties)."""
    from moto.batch import models
    from moto.batch.utils import lowercase_first_key
    from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

    original_create = models.JobDefinition.__dict__["create_from_cloudformation_json"].__func__

    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        properties = cloudformation_json["Properties"]
        if properties.get("Type") != "multinode":
            return original_create(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        return models.batch_backends[account_id][region_name].register_job_definition(
            def_name=resource_name, parameters=lowercase_first_key(properties.get("Parameters", {})),
            _type="multinode", tags=lowercase_first_key(properties.get("Tags", {})),
            retry_strategy=lowercase_first_key(properties.get("RetryStrategy", {})), container_properties=None,
            node_properties=lowercase_first_key(properties["NodeProperties"]), eks_properties=None,
            timeout=lowercase_first_key(properties.get("Timeout", {})), platform_capabilities=None,
            propagate_tags=None)

    def make(attr_name: str):
        def get_cfn_attribute(self, attribute_name: str) -> str:
            if attribute_name == attr_name:
                return self.arn
            raise UnformattedGetAttTemplateException()

        def has_cfn_attr(cls, attr: str) -> bool:
            return attr == attr_name

        return get_cfn_attribute, classmethod(has_cfn_attr)

    with ExitStack() as stack:
        for cls_name, attr_name in _BATCH_ARN_ATTRIBUTES.items():
            cls = getattr(models, cls_name)
            getter, has = make(attr_name)
            stack.enter_context(_replace_or_add(cls, "get_cfn_attribute", getter))
            stack.enter_context(_replace_or_add(cls, "has_cfn_attr", has))
        stack.enter_context(_replace_or_add(models.JobDefinition, "create_from_cloudformation_json",
                                            classmethod(create_from_cloudformation_json)))
        yield


@contextmanager
def patch_event_bus_ref() -> Iterator[None]:
    """``Ref`` of an event bus is its name, as in CloudFormation."""
    from moto.events.models import EventBus

    with _replace_or_add(EventBus, "physical_resource_id", property(lambda self: self.name)):
        yield


@contextmanager
def patch_callback_retry_tokens() -> Iterator[None]:
    """Give every evaluation of a callback task (including retries) its own task token."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
        StateTaskServiceCallback,
    )

    inherited = StateTaskServiceCallback._eval_execution  # StateTaskService's, before the patch
    used: set[str] = set()
    lock = threading.Lock()

    def _eval_execution(self, env, *args, **kwargs):
        task = env.states.context_object.context_object_data.get("Task") or {}
        token = task.get("Token")
        if token is not None:
            with lock:
                if token in used:
                    token = env.states.context_object.update_task_token()
                    env.callback_pool_manager.add(token)
                used.add(token)
        return inherited(self, env, *args, **kwargs)

    with _replace_or_add(StateTaskServiceCallback, "_eval_execution", _eval_execution):
        yield


@contextmanager
def patch_callback_early_answers() -> Iterator[None]:
    """See the module contract: early heartbeats succeed, an early answer wakes the heartbeat wait it preceded."""
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackEndpoint

    original_setup = CallbackEndpoint.setup_heartbeat_endpoint

    def setup_heartbeat_endpoint(self, heartbeat_seconds):
        endpoint = original_setup(self, heartbeat_seconds)
        if self.get_outcome() is not None:  # answered between the service call and this setup
            endpoint.notify()
        return endpoint

    def notify_heartbeat(self) -> bool:
        endpoint = self._heartbeat_endpoint
        if endpoint is not None:
            endpoint.notify()
        return True  # the task exists; a beat before its wait began is as good as one during it

    with _replace(CallbackEndpoint, "setup_heartbeat_endpoint", setup_heartbeat_endpoint), \
            _replace(CallbackEndpoint, "notify_heartbeat", notify_heartbeat):
        yield


@contextmanager
def patch_callback_answered_once() -> Iterator[None]:
    """A task token answers once: a second ``SendTaskSuccess`` / ``SendTaskFailure`` for a token already
    answered is refused with ``TaskTimedOut`` ("the task associated with the token has already been closed"),
    as in AWS. moto keeps the answered endpoint in the execution's pool and lets any later answer overwrite
    the first silently while the execution runs, so a scheduler completing a token the cancel already failed
    believed it had placed the job and never gave the capacity back."""
    from moto.stepfunctions.parser.api import TaskTimedOut
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackPoolManager

    original = CallbackPoolManager.notify
    lock = threading.Lock()

    def notify(self, callback_id, outcome) -> bool:
        with lock:
            endpoint = self._pool.get(callback_id, None)
            if endpoint is not None and endpoint.get_outcome() is not None:
                # raised here, not as moto's consumer error: moto builds TaskTimedOut() without its message
                raise TaskTimedOut(f"Task Timed Out: '{callback_id}'", "TaskTimedOut", 400)
            return original(self, callback_id, outcome)

    with _replace(CallbackPoolManager, "notify", notify):
        yield


class _CfnSecret:
    """Duck-typed CloudFormation model for ``AWS::SecretsManager::Secret`` (not a CloudFormationModel
    subclass, so it exists for moto only while :func:`patch_cfn_secrets` is active)."""

    def __init__(self, arn: str, name: str) -> None:
        self.arn, self.name = arn, name

    @property
    def physical_resource_id(self) -> str:
        return self.arn

    def is_created(self) -> bool:
        return True

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::SecretsManager::Secret"

    @staticmethod
    def cloudformation_name_type() -> str:
        return "Name"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "Id"

    def get_cfn_attribute(self, attribute_name: str) -> str:
        from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

        if attribute_name == "Id":
            return self.arn
        raise UnformattedGetAttTemplateException()

    @classmethod
    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        import secrets

        from moto.secretsmanager.models import secretsmanager_backends

        props = cloudformation_json.get("Properties", {})
        value = props.get("SecretString")
        if value is None:
            gen = props.get("GenerateSecretString", {})
            value = secrets.token_urlsafe(int(gen.get("PasswordLength", 32)))
        backend = secretsmanager_backends[account_id][region_name]
        created = json.loads(
            backend.create_secret(
                name=resource_name, secret_string=value, secret_binary=None,
                description=props.get("Description"), tags=props.get("Tags"), kms_key_id=props.get("KmsKeyId"),
                client_request_token=None, replica_regions=[], force_overwrite=False,
            )
        )
        return cls(created["ARN"], resource_name)

    @classmethod
    def update_from_cloudformation_json(cls, original_resource, new_resource_name, cloudformation_json,
                                        account_id, region_name):
        return original_resource

    @classmethod
    def delete_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name) -> None:
        from moto.secretsmanager.models import secretsmanager_backends

        secretsmanager_backends[account_id][region_name].delete_secret(
            secret_id=resource_name, recovery_window_in_days=None, force_delete_without_recovery=True
        )


@contextmanager
def patch_cfn_secrets() -> Iterator[None]:
    """Register :class:`_CfnSecret` with moto's CloudFormation parser for the duration."""
    from moto.cloudformation import parsing

    originals = {name: getattr(parsing, name) for name in ("get_model_map", "get_name_type_map")}

    def get_model_map():
        return {**originals["get_model_map"](), _CfnSecret.cloudformation_type(): _CfnSecret}

    def get_name_type_map():
        return {**originals["get_name_type_map"](), _CfnSecret.cloudformation_type(): "Name"}

    parsing.get_model_map, parsing.get_name_type_map = get_model_map, get_name_type_map
    try:
        yield
    finally:
        parsing.get_model_map = originals["get_model_map"]
        parsing.get_name_type_map = originals["get_name_type_map"]


@contextmanager
def patch_cfn_json_templates() -> Iterator[None]:
    """Parse JSON templates with ``json`` (moto tries YAML first, which is slow for large templates)."""
    from moto.cloudformation.models import Stack as CfnStack

    original = CfnStack.__dict__["parse_template"].__func__

    def parse_template(template: str) -> dict[str, Any]:
        if template.lstrip().startswith("{"):
            try:
                return json.loads(template)
            except json.JSONDecodeError:
                pass
        return original(template)

    with _replace(CfnStack, "parse_template", staticmethod(parse_template)):
        yield


#: ``AWS::Lambda::Function`` properties moto's CloudFormation model drops and the patch keeps.
LAMBDA_IMAGE_PROPERTIES = ("PackageType", "ImageConfig", "Architectures")


@contextmanager
def patch_cfn_lambda_image() -> Iterator[None]:
    """CloudFormation-created functions keep ``PackageType``, ``ImageConfig`` and ``Architectures``."""
    from moto.awslambda.models import ImageConfig, LambdaFunction

    original = LambdaFunction.__dict__["create_from_cloudformation_json"].__func__

    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        fn = original(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        props = cloudformation_json.get("Properties", {})
        if "PackageType" in props:
            fn.package_type = props["PackageType"]
        if "ImageConfig" in props:
            fn.image_config = ImageConfig(props["ImageConfig"])
        if "Architectures" in props:
            fn.architectures = list(props["Architectures"])
        return fn

    with _replace(LambdaFunction, "create_from_cloudformation_json", classmethod(create_from_cloudformation_json)):
        yield


#: definition -> parsed program (see :func:`patch_stepfunctions_program_cache`)
_PROGRAMS: dict[str, Any] = {}
_PROGRAMS_LOCK = threading.Lock()
_PROGRAMS_MAX = 32


def _fix_heap_keys(root: Any) -> int:
    """Read ``heap_key`` of every evaluation component reachable from ``root`` (so it is set once, now)."""
    from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent

    seen: set[int] = set()
    todo = [root]
    fixed = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, EvalComponent) or hasattr(obj, "__dict__") and type(obj).__module__.startswith(
                "moto.stepfunctions.parser.asl"):
            if isinstance(obj, EvalComponent):
                _ = obj.heap_key
                fixed += 1
            todo.extend(vars(obj).values())
    return fixed


@contextmanager
def patch_stepfunctions_program_cache() -> Iterator[None]:
    """Parse each state machine definition once for all its executions."""
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

    original = ExecutionWorker.__dict__["_get_evaluation_entrypoint"]

    def _get_evaluation_entrypoint(self: Any) -> Any:
        definition = self._evaluation_details.state_machine_details.definition
        with _PROGRAMS_LOCK:
            program = _PROGRAMS.get(definition)
            if program is None:
                program = original(self)
                _fix_heap_keys(program)
                if len(_PROGRAMS) >= _PROGRAMS_MAX:
                    _PROGRAMS.pop(next(iter(_PROGRAMS)))
                _PROGRAMS[definition] = program
        return program

    with _replace(ExecutionWorker, "_get_evaluation_entrypoint", _get_evaluation_entrypoint):
        try:
            yield
        finally:
            with _PROGRAMS_LOCK:
                _PROGRAMS.clear()


#: Per thread: set while a ``Select=COUNT`` query, or one with a ``ProjectionExpression``, runs (see
#: :func:`patch_dynamodb_count_without_copy`, :func:`patch_dynamodb_fast_projection`).
_COUNTING = threading.local()


@contextmanager
def patch_dynamodb_count_without_copy() -> Iterator[None]:
    """``Query`` with ``Select=COUNT`` counts moto's matching items without deep-copying them first."""
    import copy as copy_module
    import types

    import moto.dynamodb.models.table as table_module
    from moto.dynamodb.responses import DynamoHandler

    original_query = DynamoHandler.__dict__["query"]
    real_copy = table_module.copy

    def deepcopy(value: Any, memo: Any = None) -> Any:
        if getattr(_COUNTING, "on", False):
            return list(value) if isinstance(value, list) else value
        return real_copy.deepcopy(value, memo)

    def query(self: Any) -> Any:
        body = self.body if isinstance(getattr(self, "body", None), dict) else {}
        # a COUNT returns nothing of the matches; a projection makes new items of them (Item.project)
        _COUNTING.on = body.get("Select") == "COUNT" or bool(body.get("ProjectionExpression"))
        try:
            return original_query(self)
        finally:
            _COUNTING.on = False

    shim = types.SimpleNamespace(**{**vars(copy_module), "deepcopy": deepcopy})
    with _replace(DynamoHandler, "query", query), _replace(table_module, "copy", shim):
        yield


#: operations whose result is DynamoDB JSON only (see :func:`patch_dynamodb_fast_item_json`)
FAST_JSON_OPERATIONS = frozenset({"Query", "Scan", "GetItem", "BatchGetItem"})


def _json_default(value: Any) -> Any:
    import base64

    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"{type(value).__name__} is not DynamoDB JSON")


@contextmanager
def patch_dynamodb_fast_item_json() -> Iterator[None]:
    """Write item-only DynamoDB results with ``json.dumps`` instead of moto's generic serializer."""
    from moto.dynamodb.responses import DynamoResult

    original = DynamoResult.execute_result  # inherited from ActionResult

    def execute_result(self: Any, context: Any) -> Any:
        if context.operation_model.name not in FAST_JSON_OPERATIONS or not isinstance(self.result, dict):
            return original(self, context)
        try:
            body = json.dumps(self.result, default=_json_default)
        except TypeError:  # something the serializer knows how to write (a timestamp): let it
            return original(self, context)
        return 200, {"Content-Type": "application/x-amz-json-1.0"}, body

    with _replace_or_add(DynamoResult, "execute_result", execute_result):
        yield


def finish_job(job: Any, exit_code: int, reason: str | None = None) -> None:
    """Record a finished Batch job the way AWS reports it (status, exit code, reason)."""
    if job.job_stopped:  # already recorded (e.g. terminated and finished by moto)
        return
    job.exit_code = int(exit_code)
    if reason:
        job.job_stopped_reason = reason
    if job.latest_attempt:
        job.latest_attempt["container"]["exitCode"] = int(exit_code)
        if reason:
            job.latest_attempt["statusReason"] = reason
    job._mark_stopped(success=exit_code == 0)


#: the SubmitJob call being served on this thread (moto's backend never sees its nodeOverrides)
_SUBMITTING = threading.local()


@contextmanager
def patch_batch_runner(runner: BatchJobRunner) -> Iterator[None]:
    """Jobs submitted to the simple (no-Docker) Batch backend start RUNNING and are run by ``runner`` in a thread."""
    from moto.batch.models import Job
    from moto.batch.responses import BatchResponse
    from moto.batch_simple.models import BatchSimpleBackend

    original_submit = BatchResponse.__dict__["submitjob"]

    def submitjob(self) -> str:  # moto drops SubmitJob's nodeOverrides: keep them for the job this call makes
        _SUBMITTING.node_overrides = self._get_param("nodeOverrides")
        try:
            return original_submit(self)
        finally:
            _SUBMITTING.node_overrides = None

    def _mark_job_as_finished(self, include_start_attempt: bool, job: Any) -> None:
        import datetime

        job.node_overrides = getattr(_SUBMITTING, "node_overrides", None)
        self.backend._jobs[job.job_id] = job
        job.job_started_at = datetime.datetime.now()
        job.log_stream_name = job._stream_name
        if include_start_attempt:
            job._start_attempt()
        threading.Thread(target=runner, args=(job,), name=f"batch-job-{job.job_id}", daemon=True).start()

    original_details = Job.__dict__["_container_details"]

    def _container_details(self) -> dict[str, Any]:
        details = original_details(self)
        if self.exit_code is not None:
            details["exitCode"] = self.exit_code
        if self.job_stopped_reason:
            details["reason"] = self.job_stopped_reason
        return details

    with ExitStack() as stack:
        stack.enter_context(_replace(BatchSimpleBackend, "_mark_job_as_finished", _mark_job_as_finished))
        stack.enter_context(_replace(BatchResponse, "submitjob", submitjob))
        stack.enter_context(_replace(Job, "_container_details", _container_details))
        yield


_PENDING_ECS = threading.local()


def ecs_properties_of(definition: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    """A job's ``ecsProperties`` as ``DescribeJobs`` reports them: the definition's, each container's ``command``,
    ``environment`` (by name, the override's last) and ``resourceRequirements`` (by type) overridden by the
    ``ecsPropertiesOverride`` container of the same name."""
    out = json.loads(json.dumps(definition))
    for task, over in zip(out.get("taskProperties", []), (override or {}).get("taskProperties", []), strict=False):
        by_name = {c.get("name"): c for c in over.get("containers", [])}
        for c in task.get("containers", []):
            o = by_name.get(c.get("name"))
            if not o:
                continue
            if "command" in o:
                c["command"] = list(o["command"])
            env = {e["name"]: e["value"] for e in c.get("environment", [])}
            env.update({e["name"]: e["value"] for e in o.get("environment", [])})
            c["environment"] = [{"name": k, "value": v} for k, v in env.items()]
            res = {r["type"]: r["value"] for r in c.get("resourceRequirements", [])}
            res.update({r["type"]: r["value"] for r in o.get("resourceRequirements", [])})
            c["resourceRequirements"] = [{"type": k, "value": v} for k, v in res.items()]
    return out


@contextmanager
def patch_batch_ecs_properties() -> Iterator[None]:
    """Keep ``ecsProperties`` on job definitions and ``ecsPropertiesOverride`` on jobs (see the module docstring)."""
    from moto.batch.exceptions import ClientException
    from moto.batch.models import Job, JobDefinition
    from moto.batch.responses import BatchResponse

    original_register = BatchResponse.__dict__["registerjobdefinition"]
    original_submit = BatchResponse.__dict__["submitjob"]
    original_def_init = JobDefinition.__dict__["__init__"]
    original_validate = JobDefinition.__dict__["_validate"]
    original_def_describe = JobDefinition.__dict__["describe"]
    original_job_init = Job.__dict__["__init__"]
    original_job_describe = Job.__dict__["describe"]
    original_container_property = Job.__dict__["_get_container_property"]

    def _pending(self, param: str, original: Callable[[Any], str]) -> str:
        _PENDING_ECS.value = self._get_param(param)
        try:
            return original(self)
        finally:
            _PENDING_ECS.value = None

    def registerjobdefinition(self) -> str:
        return _pending(self, "ecsProperties", original_register)

    def submitjob(self) -> str:
        return _pending(self, "ecsPropertiesOverride", original_submit)

    def def_init(self, *args: Any, **kwargs: Any) -> None:
        self.ecs_properties = getattr(_PENDING_ECS, "value", None)
        original_def_init(self, *args, **kwargs)

    def _validate(self) -> None:
        if self.ecs_properties is None:
            return original_validate(self)
        tasks = self.ecs_properties.get("taskProperties") or []
        if not tasks or any(not t.get("containers") or any("image" not in c for c in t["containers"])
                            for t in tasks):
            raise ClientException("ecsProperties.taskProperties must have containers, each with an image")

    def def_describe(self) -> dict[str, Any]:
        out = original_def_describe(self)
        if self.ecs_properties is not None:
            out["ecsProperties"] = self.ecs_properties
        return out

    def job_init(self, *args: Any, **kwargs: Any) -> None:
        original_job_init(self, *args, **kwargs)
        self.ecs_properties_override = getattr(_PENDING_ECS, "value", None)

    def _get_container_property(self, p: str, default: Any) -> Any:  # moto asserts containerProperties exist
        if self.job_definition.container_properties is None:
            return (self.container_overrides or {}).get(p, default)
        return original_container_property(self, p, default)

    def job_describe(self) -> dict[str, Any]:
        out = original_job_describe(self)
        if self.job_definition.ecs_properties is not None:
            out["ecsProperties"] = ecs_properties_of(self.job_definition.ecs_properties, self.ecs_properties_override)
        return out

    with ExitStack() as stack:
        for owner, name, value in ((BatchResponse, "registerjobdefinition", registerjobdefinition),
                                   (BatchResponse, "submitjob", submitjob),
                                   (JobDefinition, "__init__", def_init), (JobDefinition, "_validate", _validate),
                                   (JobDefinition, "describe", def_describe),
                                   (Job, "__init__", job_init), (Job, "describe", job_describe),
                                   (Job, "_get_container_property", _get_container_property)):
            stack.enter_context(_replace(owner, name, value))
        yield


_DYNAMODB_LOCK = threading.RLock()


@contextmanager
def patch_dynamodb_transaction_backup() -> Iterator[None]:
    import copy as copy_module
    import types

    import moto.dynamodb.models as ddb_models
    from moto.dynamodb.exceptions import (
        MockValidationException,
        MultipleTransactionsException,
        TransactionCanceledException,
    )
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    original = DynamoDBBackend.__dict__["transact_write_items"]

    def deepcopy(value: Any, memo: Any = None) -> Any:  # moto's whole-table backup: the table itself
        return value if isinstance(value, Table) else copy_module.deepcopy(value, memo)

    def backup(backend: Any, transact_items: list[dict[str, Any]]) -> list[tuple[Any, Any, Any, Any]]:
        saved = []
        for entry in transact_items:
            try:
                op = next(iter(entry.values()))
                table = backend.get_table(op["TableName"])
                key = op["Key"] if "Key" in op else op["Item"]
                hash_key = DynamoType(key[table.hash_key_attr])
                range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
                current = table.get_item(hash_key, range_key)
            except Exception:  # noqa: BLE001 - a malformed item: moto's own call reports it
                continue
            saved.append((table, hash_key, range_key, copy_module.deepcopy(current)))
        return saved

    def restore(saved: list[tuple[Any, Any, Any, Any]]) -> None:
        for table, hash_key, range_key, before in reversed(saved):
            items = table.items[hash_key] if range_key else table.items
            slot = range_key if range_key else hash_key
            if before is None:
                items.pop(slot, None)
            else:
                items[slot] = before

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved = backup(self, transact_items)
        try:
            return original(self, transact_items)
        except (TransactionCanceledException, MultipleTransactionsException, MockValidationException):
            restore(saved)
            raise

    shim = types.SimpleNamespace(**{**vars(copy_module), "deepcopy": deepcopy})
    with _replace(DynamoDBBackend, "transact_write_items", transact_write_items), _replace(ddb_models, "copy", shim):
        yield


@contextmanager
def patch_server_backend_lookup() -> Iterator[None]:
    """Remember the backend of each host in moto's server dispatcher (see the module docstring)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    original = DomainDispatcherApplication.__dict__["get_backend_for_host"]
    found: dict[str | None, Any] = {}

    def get_backend_for_host(self: Any, host: str | None) -> Any:
        try:
            return found[host]
        except KeyError:
            backend = found[host] = original(self, host)
            return backend

    with _replace(DomainDispatcherApplication, "get_backend_for_host", get_backend_for_host):
        yield


def _component_name(component: Any) -> str:
    name = getattr(component, "name", None)
    return f"{type(component).__name__} {name!r}" if isinstance(name, str) else type(component).__name__


@contextmanager
def patch_stepfunctions_short_error_logs() -> Iterator[None]:
    """Log a failing state machine component by class and name, not by its whole subtree (module docstring)."""
    import logging as logging_module

    from moto.stepfunctions.parser.asl.component import eval_component
    from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent
    from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

    log = eval_component.LOG

    def _log_failure_event_exception(self: Any, failure_event_exception: Any) -> None:
        if not log.isEnabledFor(logging_module.ERROR):
            return
        parts = ["Exception=FailureEventException"]
        event = failure_event_exception.failure_event
        if event.error_name:
            parts.append(f"Error={event.error_name.error_name}")
        if event.event_details:
            parts.append(f"Details={to_json_str(event.event_details)}")
        log.error("%s at %s", ", ".join(parts), _component_name(self))

    def _log_exception(self: Any, exception: Exception) -> None:
        if not log.isEnabledFor(logging_module.ERROR):
            return
        details = list(exception.args) or "None-Available"
        log.error("Exception=%s, Details=%s at %s", type(exception).__name__, details, _component_name(self))

    with _replace(EvalComponent, "_log_failure_event_exception", _log_failure_event_exception), \
            _replace(EvalComponent, "_log_exception", _log_exception):
        yield


@contextmanager
def patch_dynamodb_fast_types() -> Iterator[None]:
    """moto's ``DynamoType.cast_value`` and ``size`` without their detours (see the module docstring)."""
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.utilities import bytesize

    slow_cast = DynamoType.__dict__["cast_value"].fget

    def cast_value(self: Any) -> Any:
        if self.type in _AS_IS:
            return self.value
        return slow_cast(self)

    def size_of(value: Any) -> int:
        v = value if isinstance(value, DynamoType) else DynamoType(value)
        kind = v.type
        if kind == "M":
            return sum(bytesize(k) + size_of(x) for k, x in v.value.items())
        if kind == "L":
            return sum(size_of(x) for x in v.value)
        if kind == "N":
            return len(str(v.value))
        if kind == "NS":
            return sum(len(str(x)) for x in v.value)
        if kind in _SETS:  # SS, BS
            return sum(bytesize(x) for x in v.value)
        if isinstance(v.value, bool):
            return 1
        return bytesize(v.value)

    def size(self: Any) -> int:
        return size_of(self)

    slow_eq, slow_ne, slow_lt = (DynamoType.__dict__[n] for n in ("__eq__", "__ne__", "__lt__"))

    def __eq__(self: Any, other: Any) -> bool:  # noqa: N807 - moto's method
        if self.type in _AS_IS and isinstance(other, DynamoType):
            return self.type == other.type and self.value == other.value
        return slow_eq(self, other)

    def __ne__(self: Any, other: Any) -> bool:  # noqa: N807 - moto's method
        if self.type in _AS_IS and isinstance(other, DynamoType):
            return self.type != other.type or self.value != other.value
        return slow_ne(self, other)

    def __lt__(self: Any, other: Any) -> bool:  # noqa: N807 - moto's method
        if self.type == "S" and isinstance(other, DynamoType) and other.type == "S":
            return self.value < other.value
        return slow_lt(self, other)

    with _replace(DynamoType, "cast_value", property(cast_value)), _replace(DynamoType, "size", size), \
            _replace(DynamoType, "__eq__", __eq__), _replace(DynamoType, "__ne__", __ne__), \
            _replace(DynamoType, "__lt__", __lt__):
        yield


#: DynamoDB types whose ``cast_value`` is the value itself; the set types (see :func:`patch_dynamodb_fast_types`)
_AS_IS = frozenset({"S", "B", "BOOL"})
_SETS = frozenset({"SS", "NS", "BS"})


#: Per thread: set while a ``Query`` or ``Scan`` runs (see :func:`patch_dynamodb_query_item_sizes`).
_READING = threading.local()
#: the attribute of a stored moto ``Item`` that holds its size (see :func:`patch_dynamodb_query_item_sizes`)
_SIZE_ATTR = "_gpufleet_size"


@contextmanager
def patch_dynamodb_query_item_sizes() -> Iterator[None]:
    """Reads size each stored item once until it is updated (see the module docstring)."""
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import Item
    from moto.dynamodb.responses import DynamoHandler

    original_size = Item.__dict__["size"]
    original_update = DynamoDBBackend.__dict__["update_item"]

    def size(self: Any) -> int:
        if not getattr(_READING, "on", False):
            return original_size(self)
        found = self.__dict__.get(_SIZE_ATTR)
        if found is None:
            found = self.__dict__[_SIZE_ATTR] = original_size(self)
        return found

    def update_item(self: Any, table_name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            item = original_update(self, table_name, *args, **kwargs)
        except BaseException:
            try:  # a failed update may have changed the item before it raised: forget the table's sizes
                for stored in self.get_table(table_name).all_items():
                    stored.__dict__.pop(_SIZE_ATTR, None)
            except Exception:  # noqa: BLE001 - no such table: nothing was cached for it
                pass
            raise
        item.__dict__.pop(_SIZE_ATTR, None)
        return item

    def reading(action: str) -> Callable[[Any], Any]:
        original = DynamoHandler.__dict__[action]

        def read(self: Any) -> Any:
            outer = getattr(_READING, "on", False)
            _READING.on = True
            try:
                return original(self)
            finally:
                _READING.on = outer

        return read

    with _replace(Item, "size", size), _replace(DynamoDBBackend, "update_item", update_item), \
            _replace(DynamoHandler, "query", reading("query")), _replace(DynamoHandler, "scan", reading("scan")):
        yield


#: Per thread: ``(table, items)`` while a ``Query`` of that table runs (see :func:`patch_dynamodb_query_candidates`).
_QUERY_CANDIDATES = threading.local()


def query_candidates(table: Any, hash_key: Any, index_name: str | None,
                     hash_key_conditions: list[tuple[str, Any]] | None) -> list[Any] | None:
    """The stored items of ``table`` that can match a query's partition key (unordered), or ``None`` when the
    query is one moto should answer from the whole table (no key condition on an index)."""
    if index_name is None:
        if hash_key is None:
            return None
        stored = table.items.get(hash_key)
        if stored is None:
            return []
        return list(stored.values()) if table.range_key_attr else [stored]
    if not hash_key_conditions:
        return None
    out = []
    for stored in table.items.values():
        for item in (stored.values() if table.range_key_attr else (stored,)):
            attrs = item.attrs
            for name, expected in hash_key_conditions:
                value = attrs.get(name)
                if not value or value != expected:
                    break
            else:
                out.append(item)
    return out


@contextmanager
def patch_dynamodb_query_candidates() -> Iterator[None]:
    """A ``Query`` starts from the items its partition key can match, not the whole sorted table."""
    from moto.dynamodb.models.table import Table

    original_query = Table.__dict__["query"]
    original_all_items = Table.__dict__["all_items"]

    def all_items(self: Any) -> list[Any]:
        found = getattr(_QUERY_CANDIDATES, "found", None)
        if found is not None and found[0] is self:
            return list(found[1])
        return original_all_items(self)

    signature = inspect.signature(original_query)

    def query(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = signature.bind(self, *args, **kwargs).arguments
        items = query_candidates(self, call.get("hash_key"), call.get("index_name"), call.get("hash_key_conditions"))
        outer = getattr(_QUERY_CANDIDATES, "found", None)
        _QUERY_CANDIDATES.found = (self, items) if items is not None else None
        try:
            return original_query(self, *args, **kwargs)
        finally:
            _QUERY_CANDIDATES.found = outer

    with _replace(Table, "query", query), _replace(Table, "all_items", all_items):
        yield


def fast_project(item: Any, projection_expressions: list[list[str]]) -> Any:
    """moto's ``Item.project`` without converting what the projection leaves out, or ``None`` when the
    projection is one for moto's own (a list index in a path, a path through something that is not a map)."""
    from moto.dynamodb.models.dynamo_type import Item, deserializer, serializer

    result: dict[str, Any] = {}
    for path in projection_expressions:
        if not path or any(not isinstance(part, str) or "[" in part for part in path):
            return None
        node = item.attrs.get(path[0])
        for part in path[1:]:
            if node is None:
                break
            if node.type != "M" or not isinstance(node.value, dict):
                return None
            node = node.value.get(part)
        if node is None:
            continue
        leaf = serializer.serialize(deserializer.deserialize(node.to_regular_json()))
        where = result
        for part in path[:-1]:
            slot = where.get(part)
            if slot is None:
                slot = where[part] = {"M": {}}
            if "M" not in slot:
                return None
            where = slot["M"]
        where[path[-1]] = leaf
    return Item(hash_key=item.hash_key, range_key=item.range_key, attrs=result)


@contextmanager
def patch_dynamodb_fast_projection() -> Iterator[None]:
    """Project an item without converting the attributes the projection leaves out (see the module docstring)."""
    from moto.dynamodb.models.dynamo_type import Item

    original = Item.__dict__["project"]

    def project(self: Any, projection_expressions: list[list[str]]) -> Any:
        found = fast_project(self, projection_expressions)
        return found if found is not None else original(self, projection_expressions)

    with _replace(Item, "project", project):
        yield


@contextmanager
def patch_stepfunctions_client_cache() -> Iterator[None]:
    """One boto3 client per region, service and endpoint for moto's Step Functions tasks (module docstring)."""
    import sys

    import moto.stepfunctions.parser.asl.component.state.exec.state_task.lambda_eval_utils  # noqa: F401 - patched
    from moto.core.models import botocore_stubber
    from moto.settings import moto_server_port
    from moto.stepfunctions.parser.asl.utils import boto_client

    original = boto_client.boto_client_for
    clients: dict[tuple[Any, ...], Any] = {}
    lock = threading.Lock()

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        key = (region, service, botocore_stubber.enabled, moto_server_port())
        with lock:
            found = clients.get(key)
            if found is None:
                found = clients[key] = original(region, service, state_credentials)
            return found

    modules = [m for name, m in list(sys.modules.items())
               if name.startswith("moto.stepfunctions.") and getattr(m, "boto_client_for", None) is original]
    with ExitStack() as stack:
        for module in modules:
            stack.enter_context(_replace(module, "boto_client_for", boto_client_for))
        yield


@contextmanager
def patch_foreground_gate(gate: Any) -> Iterator[None]:
    """Foreground moto requests first (see the module docstring and :mod:`gpufleet.local.foreground`)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    from gpufleet.local.foreground import ENVIRON_KEY, FOREGROUND

    original = DomainDispatcherApplication.__dict__["__call__"]

    def __call__(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get(ENVIRON_KEY) == FOREGROUND:
            with gate.foreground():
                return original(self, environ, start_response)
        gate.background_turn()
        return original(self, environ, start_response)

    with _replace(DomainDispatcherApplication, "__call__", __call__):
        yield


#: Per thread: the stream-consumer invocations a DynamoDB request made, to run once it released the lock.
_DEFERRED_SENDS = threading.local()


@contextmanager
def patch_dynamodb_serialised() -> Iterator[None]:
    from moto.awslambda.models import LambdaBackend
    from moto.dynamodb.responses import DynamoHandler

    original = DynamoHandler.__dict__["call_action"]
    original_send = LambdaBackend.__dict__["send_dynamodb_items"]

    def call_action(self: Any) -> Any:
        if getattr(_DEFERRED_SENDS, "pending", None) is not None:  # nested on this thread: the outer call flushes
            with _DYNAMODB_LOCK:
                return original(self)
        _DEFERRED_SENDS.pending = pending = []
        try:
            with _DYNAMODB_LOCK:
                result = original(self)
        finally:
            _DEFERRED_SENDS.pending = None
        for invoke in pending:  # after the lock is released, in the order the writes made them
            invoke()
        return result

    def send_dynamodb_items(self: Any, function_arn: str, items: list[Any], source: str) -> Any:
        pending = getattr(_DEFERRED_SENDS, "pending", None)
        if pending is None:
            return original_send(self, function_arn, items, source)
        func = self._lambdas.get_arn(function_arn)
        event = json.dumps({"Records": _stream_records(self.region_name, items, source)})
        pending.append(lambda: func.invoke(event, {}, {}))
        return "deferred"  # truthy: moto clears the shard's records as delivered

    with _replace(DynamoHandler, "call_action", call_action), \
            _replace(LambdaBackend, "send_dynamodb_items", send_dynamodb_items):
        yield


def _stream_records(region: str, items: list[Any], source: str) -> list[dict[str, Any]]:
    """The Lambda event records of stream records, as moto's ``send_dynamodb_items`` builds them."""
    from moto.core.utils import unix_time

    records = []
    for item in items:
        record = item.to_json()
        dynamodb = dict(record["dynamodb"])
        if isinstance(dynamodb.get("ApproximateCreationDateTime"), datetime.datetime):
            dynamodb["ApproximateCreationDateTime"] = unix_time(dynamodb["ApproximateCreationDateTime"])
        records.append({"eventID": record["eventID"], "eventName": record["eventName"],
                        "eventVersion": record["eventVersion"], "eventSource": record["eventSource"],
                        "awsRegion": region, "dynamodb": dynamodb, "eventSourceARN": source})
    return records


@contextmanager
def performance_patches() -> Iterator[None]:
    """The patches that change how fast moto answers, never what it answers (each compared with moto's own
    answers in its test): also applied to a plain moto server (:mod:`gpufleet.local.moto_server`)."""
    with ExitStack() as stack:
        stack.enter_context(patch_dynamodb_transaction_backup())
        stack.enter_context(patch_dynamodb_count_without_copy())
        stack.enter_context(patch_dynamodb_fast_item_json())
        stack.enter_context(patch_dynamodb_fast_types())
        stack.enter_context(patch_dynamodb_query_item_sizes())
        stack.enter_context(patch_dynamodb_query_candidates())
        stack.enter_context(patch_dynamodb_fast_projection())
        stack.enter_context(patch_stepfunctions_program_cache())
        stack.enter_context(patch_stepfunctions_client_cache())
        stack.enter_context(patch_server_backend_lookup())
        yield


@contextmanager
def patched(
    lambda_invoker: LambdaInvoker | None = None, batch_runner: BatchJobRunner | None = None
) -> Iterator[None]:
    """Apply the Batch integration, CloudFormation and DynamoDB patches always, the Lambda / Batch runner ones when
    given."""
    with ExitStack() as stack:
        stack.enter_context(patch_batch_integration())
        stack.enter_context(patch_batch_cfn_attributes())
        stack.enter_context(patch_batch_ecs_properties())
        stack.enter_context(patch_event_bus_ref())
        stack.enter_context(patch_callback_retry_tokens())
        stack.enter_context(patch_callback_answered_once())
        stack.enter_context(patch_callback_early_answers())
        stack.enter_context(patch_cfn_secrets())
        stack.enter_context(patch_cfn_json_templates())
        stack.enter_context(patch_cfn_lambda_image())
        stack.enter_context(patch_dynamodb_serialised())
        stack.enter_context(patch_stepfunctions_short_error_logs())
        stack.enter_context(performance_patches())
        if lambda_invoker is not None:
            stack.enter_context(patch_lambda(lambda_invoker))
        if batch_runner is not None:
            stack.enter_context(patch_batch_runner(batch_runner))
        yield


_stream_log = logging.getLogger("gpufleet.devstack.streams")


class AsyncStreamDelivery(PatchedDelivery):
    name = "stream delivery"
    thread_name = "dynamodb-stream-delivery"

    def __init__(self, settle_s: float = 0.05) -> None:
        super().__init__()
        self.settle_s = settle_s
        self._cond = threading.Condition()
        self._pending: dict[int, Any] = {}
        self._stop = False

    # ------------------------------------------------------------------ lifecycle
    def target(self) -> tuple[type, str]:
        from moto.dynamodb.models.table import StreamShard

        return StreamShard, "add"

    def patch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from moto.dynamodb.models.table import StreamRecord

        delivery = self

        def add(shard: Any, old: Any, new: Any) -> None:
            view = shard.table.stream_specification["StreamViewType"]
            event = "INSERT" if old is None else ("REMOVE" if new is None else "MODIFY")
            with delivery._cond:
                seq = len(shard.items) + shard.starting_sequence_number
                shard.items.append(StreamRecord(shard.table, view, event, old, new, seq))
                delivery._pending[id(shard)] = shard
                delivery._cond.notify()

        return add

    def reset(self) -> None:
        self._stop = False

    def wake_to_stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    # ------------------------------------------------------------------ delivery
    def loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if not self._pending and self._stop:
                    return
                # settle: wait until no record has arrived for settle_s
                while True:
                    seen = sum(len(s.items) for s in self._pending.values())
                    self._cond.wait(self.settle_s)
                    if sum(len(s.items) for s in self._pending.values()) == seen:
                        break
                shards, self._pending = list(self._pending.values()), {}
            for shard in shards:
                self._deliver(shard)

    def _deliver(self, shard: Any) -> None:
        from moto.awslambda.utils import get_backend

        with self._cond:
            batch = list(shard.items)
        if not batch:
            return
        delivered = False
        for arn, esm in list(shard.table.lambda_event_source_mappings.items()):
            region = arn.split(":")[3]
            try:
                result = get_backend(shard.account_id, region).send_dynamodb_items(arn, batch, esm.event_source_arn)
            except Exception as err:  # noqa: BLE001 - logged and counted; moto drops failed batches too
                self.errors += 1
                _stream_log.exception("stream delivery to %s failed: %s", arn, err)
                continue
            delivered = delivered or bool(result)
        self.batches += 1
        if delivered:
            with self._cond:
                del shard.items[: len(batch)]
