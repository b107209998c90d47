"""CORS of the API's answers (gpufleet/api/cors.py) for the console served from another origin: the configured
origin only, none when unset; shown on the administration API over its in-memory store (no AWS)."""

from __future__ import annotations

from gpufleet.adminapi.app import AdminApi
from gpufleet.adminapi.service import AdminDeps, AdminService
from gpufleet.api.cors import cors
from gpufleet.clock import FakeClock
from gpufleet.store.fakes.admin import MemoryAdminStore
from gpufleet.store.principals import Principal

CONSOLE = "https://d111111abcdef8.cloudfront.net"


def _get(api: AdminApi, origin: str) -> dict:
    event = {"httpMethod": "GET", "path": "/v1/admin/tenants", "resource": "/v1/admin/tenants/{proxy+}",
             "headers": {"Origin": origin}, "multiValueHeaders": {"Origin": [origin]},
             "queryStringParameters": None, "multiValueQueryStringParameters": None, "body": None,
             "isBase64Encoded": False, "requestContext": {"identity": {"userArn": "arn:aws:iam::1:role/ops"}}}
    return api.handle(event)


def _api(origin: str = "") -> AdminApi:
    admin = Principal(arn="arn:aws:iam::1:role/ops", tenant="ops", team="platform", user="op", admin=True)
    return AdminApi(AdminService(AdminDeps(store=MemoryAdminStore(), clock=FakeClock())), lambda arn: admin,
                    cors_origin=origin)


def test_answers_name_the_configured_origin_only():
    resp = _get(_api(CONSOLE), CONSOLE)
    assert resp["statusCode"] == 200, resp
    headers = {k.lower(): v for k, v in (resp.get("multiValueHeaders") or {}).items()}
    assert headers["access-control-allow-origin"] == [CONSOLE]
    other = _get(_api(CONSOLE), "https://evil.example")
    assert "access-control-allow-origin" not in {k.lower() for k in (other.get("multiValueHeaders") or {})}


def test_no_origin_configured_no_cors():
    assert cors("") is None
    resp = _get(_api(), CONSOLE)
    assert "access-control-allow-origin" not in {k.lower() for k in (resp.get("multiValueHeaders") or {})}
