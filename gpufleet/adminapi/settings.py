"""Settings and wiring of the administration API (validated once at start-up).

:class:`AdminApiSettings` is a :class:`gpufleet.settings.Settings` (``GPUFLEET_*``: the table names, the
deployment's pools and its models root), loaded once by the entry point (the Lambda handler ``lambdas/admin/handler.py``, the dev
stack, a test); :func:`build_admin_api` wires :class:`~gpufleet.adminapi.app.AdminApi` over the DynamoDB
client it is given.
"""

from __future__ import annotations

from pydantic import Field

from gpufleet.adminapi.app import AdminApi
from gpufleet.adminapi.service import AdminDeps, AdminService
from gpufleet.api.cors import CorsSettings
from gpufleet.clock import Clock
from gpufleet.models import catalog
from gpufleet.settings import PoolSettings, StorageSettings
from gpufleet.store import principals
from gpufleet.store.admin import DynamoAdminStore
from gpufleet.store.model_catalog import S3Manifests


class AdminApiSettings(StorageSettings, PoolSettings, CorsSettings):
    config_label = "administration API settings"

    model_s3_root: str = Field("", pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([^*?]+/)+)?$",
                               description="s3://bucket/prefix/ of the published models: a model registration reads "
                               "<root><name>/manifest.json (GPUFLEET_MODEL_S3_ROOT); empty: none")


def build_admin_api(settings: AdminApiSettings, *, dynamodb, clock: Clock, s3=None) -> AdminApi:
    """The administration API over ``dynamodb`` (the control table) and ``s3`` (the published models' manifests,
    under ``model_s3_root``; without either, model registrations name their hash)."""
    table = settings.control_table
    manifests = (S3Manifests(s3, settings.model_s3_root) if settings.model_s3_root and s3 is not None
                 else catalog.NoManifests())
    service = AdminService(AdminDeps(store=DynamoAdminStore(dynamodb, table), clock=clock, pools=settings.pools,
                                     manifests=manifests))
    return AdminApi(service, lambda arn: principals.resolve(dynamodb, table, arn), cors_origin=settings.cors_origin)
