"""Settings and wiring of the administration API (validated once at start-up).

:class:`AdminApiSettings` is a :class:`gpufleet.settings.Settings` (``GPUFLEET_*``: the table names and the
deployment's pools), loaded once by the entry point (the Lambda handler ``lambdas/admin/handler.py``, the dev
stack, a test); :func:`build_admin_api` wires :class:`~gpufleet.adminapi.app.AdminApi` over the DynamoDB
client it is given.
"""

from __future__ import annotations

from gpufleet.adminapi.app import AdminApi
from gpufleet.adminapi.service import AdminDeps, AdminService
from gpufleet.api.cors import CorsSettings
from gpufleet.clock import Clock
from gpufleet.settings import PoolSettings, StorageSettings
from gpufleet.store import principals
from gpufleet.store.admin import DynamoAdminStore


class AdminApiSettings(StorageSettings, PoolSettings, CorsSettings):
    config_label = "administration API settings"


def build_admin_api(settings: AdminApiSettings, *, dynamodb, clock: Clock) -> AdminApi:
    """The administration API over ``dynamodb`` (the control table)."""
    table = settings.control_table
    service = AdminService(AdminDeps(store=DynamoAdminStore(dynamodb, table), clock=clock, pools=settings.pools))
    return AdminApi(service, lambda arn: principals.resolve(dynamodb, table, arn), cors_origin=settings.cors_origin)
