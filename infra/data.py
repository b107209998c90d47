"""Data construct: the DynamoDB tables (from gpufleet.store.schema) and the S3 buckets.

Contract:
- One table per :data:`gpufleet.store.schema.TABLES` entry, named
  ``<prefix>-<logical>`` (the defaults of ``gpufleet.tables.TableNames``), on-demand, with
  point-in-time recovery, AWS-managed encryption, deletion protection when
  retained, the declared stream and TTL attribute. Keys and indexes come only
  from the schema module.
- Buckets ``outputs``, ``checkpoints`` and ``logs`` (plus ``access_logs`` that
  receives their server access logs): SSE-S3, public access blocked, TLS-only
  bucket policies, versioning on outputs/checkpoints, names from
  ``bucket_prefix`` when set (else generated), and lifecycle rules:
  checkpoints tagged ``CHECKPOINT_ENDED_TAG`` (the lifecycle tags them when the
  job is terminal) expire after ``checkpoint_expiry_days_after_end`` days and
  every checkpoint after ``checkpoint_max_age_days``; logs expire after
  ``log_retention_days``; outputs move to Intelligent-Tiering.
- Bucket ``models`` (``self.models``; :data:`MODELS_PREFIX` in it is the deployment's
  ``GPUFLEET_MODEL_S3_ROOT``, :attr:`Data.models_root`): published models
  (:func:`gpufleet.models.loader.publish_model`, ``gpufleet admin models publish``), written by operators with
  their own credentials only; the run attempts' roles and sessions may only read ``models/*``. Same protections
  (SSE-S3, public access blocked, TLS-only, access logs), versioned (a republished or deleted model's earlier
  files stay recoverable for 30 days).
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_s3 as s3
from constructs import Construct

from gpufleet.store.schema import TABLES, TableDef
from infra.config import CHECKPOINT_ENDED_TAG, InfraConfig

#: the key prefix of published models in the models bucket (``s3://<models bucket>/models/``)
MODELS_PREFIX = "models/"


def _attr(name: str) -> ddb.Attribute:
    return ddb.Attribute(name=name, type=ddb.AttributeType.STRING)


class Data(Construct):
    """Tables (``self.tables[logical]``) and buckets (``self.outputs``, ``self.checkpoints``, ``self.logs``,
    ``self.models``)."""

    def __init__(self, scope: Construct, cid: str, *, config: InfraConfig) -> None:
        super().__init__(scope, cid)
        removal = RemovalPolicy.RETAIN if config.removal == "retain" else RemovalPolicy.DESTROY
        self.tables: dict[str, ddb.Table] = {t.logical: self._table(t, config, removal) for t in TABLES.values()}

        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(id="expire", expiration=Duration.days(config.access_log_retention_days))],
            removal_policy=removal,
        )
        self._bucket_prefix = config.bucket_prefix
        self.outputs = self._bucket(
            "Outputs",
            "outputs/",
            removal,
            versioned=True,
            rules=[
                s3.LifecycleRule(
                    id="tiering",
                    transitions=[
                        s3.Transition(
                            storage_class=s3.StorageClass.INTELLIGENT_TIERING,
                            transition_after=Duration.days(config.outputs_ia_after_days),
                        )
                    ],
                    noncurrent_version_expiration=Duration.days(30),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
                # a BLOCKED job's raw generated output (gpufleet.runtime.finalize.QUARANTINE_PREFIX): kept for
                # review, readable by no tenant-facing role, then deleted with its versions
                s3.LifecycleRule(
                    id="quarantine",
                    prefix="quarantine/",
                    expiration=Duration.days(config.quarantine_retention_days),
                    noncurrent_version_expiration=Duration.days(1),
                ),
            ],
        )
        tag_key, tag_value = CHECKPOINT_ENDED_TAG
        self.checkpoints = self._bucket(
            "Checkpoints",
            "checkpoints/",
            removal,
            versioned=True,
            rules=[
                s3.LifecycleRule(
                    id="expire-after-job-end",
                    tag_filters={tag_key: tag_value},
                    expiration=Duration.days(config.checkpoint_expiry_days_after_end),
                    noncurrent_version_expiration=Duration.days(1),
                ),
                s3.LifecycleRule(
                    id="expire-abandoned",
                    expiration=Duration.days(config.checkpoint_max_age_days),
                    noncurrent_version_expiration=Duration.days(1),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
            ],
        )
        self.logs = self._bucket(
            "Logs",
            "logs/",
            removal,
            versioned=False,
            rules=[
                s3.LifecycleRule(
                    id="expire",
                    expiration=Duration.days(config.log_retention_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
        )

        self.models = self._bucket(
            "Models",
            "models/",
            removal,
            versioned=True,
            rules=[
                s3.LifecycleRule(
                    id="noncurrent",
                    noncurrent_version_expiration=Duration.days(30),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
        )

    @property
    def models_root(self) -> str:
        """``s3://<models bucket>/models/``: the deployment's ``GPUFLEET_MODEL_S3_ROOT``."""
        return f"s3://{self.models.bucket_name}/{MODELS_PREFIX}"

    def _table(self, t: TableDef, config: InfraConfig, removal: RemovalPolicy) -> ddb.Table:
        table = ddb.Table(
            self,
            f"{t.logical.capitalize()}Table",
            table_name=config.name(t.logical),
            partition_key=_attr(t.hash_key),
            sort_key=_attr(t.range_key) if t.range_key else None,
            billing_mode=ddb.BillingMode.PAY_PER_REQUEST,
            encryption=ddb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=ddb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            stream=ddb.StreamViewType[t.stream] if t.stream else None,
            time_to_live_attribute=t.ttl_attribute,
            deletion_protection=config.removal == "retain",
            removal_policy=removal,
        )
        for index in t.indexes:
            table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_attr(index.hash_key),
                sort_key=_attr(index.range_key) if index.range_key else None,
                projection_type=ddb.ProjectionType.ALL,
            )
        return table

    def _bucket(
        self, cid: str, log_prefix: str, removal: RemovalPolicy, *, versioned: bool, rules: list[s3.LifecycleRule]
    ) -> s3.Bucket:
        return s3.Bucket(
            self,
            cid,
            bucket_name=f"{self._bucket_prefix}-{cid.lower()}" if self._bucket_prefix else None,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=versioned,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix=log_prefix,
            lifecycle_rules=rules,
            removal_policy=removal,
            auto_delete_objects=False,
        )

    def table_env(self) -> dict[str, str]:
        """Environment variables naming the tables (``gpufleet.settings.StorageSettings``)."""
        return {f"GPUFLEET_{k.upper()}_TABLE": t.table_name for k, t in self.tables.items()}

    def bucket_env(self) -> dict[str, str]:
        return {
            "GPUFLEET_OUTPUTS_BUCKET": self.outputs.bucket_name,
            "GPUFLEET_CHECKPOINTS_BUCKET": self.checkpoints.bucket_name,
            "GPUFLEET_LOGS_BUCKET": self.logs.bucket_name,
        }
