"""Tenants register webhook endpoints through the API handler (moto DynamoDB): problems for bad input, the
per-tenant cap, and tenant isolation on every route."""

from __future__ import annotations

import pytest
from api_helpers import BOB, CAROL, Caller

from gpufleet.webhooks.endpoints import MAX_ENDPOINTS

URL = "https://hooks.example.com/gpufleet"


@pytest.fixture
def call(deps):
    from gpufleet.api.app import Api

    return Caller(Api(deps))


def _problem(res, status: int, slug: str) -> dict:
    assert res.status == status, res.text
    assert res.headers["content-type"] == "application/problem+json"
    assert res.json["type"].endswith("/" + slug), res.json
    return res.json


def test_create_get_list_patch_delete(call):
    made = call("POST", "/v1/webhooks/endpoints", {"url": URL, "events": ["started", "completed"],
                                                   "description": "ops", "labels": {"team": "vision"}})
    assert made.status == 201, made.text
    ep = made.json
    assert ep["id"].startswith("we_") and ep["enabled"] and ep["events"] == ["started", "completed"]
    assert made.headers["location"] == f"/v1/webhooks/endpoints/{ep['id']}"
    assert call("GET", f"/v1/webhooks/endpoints/{ep['id']}").json == ep
    assert call("GET", f"/v1/webhooks/endpoints/{ep['id']}", arn=BOB).json == ep  # same tenant
    assert call("GET", "/v1/webhooks/endpoints").json == {"endpoints": [ep], "next_cursor": None}
    off = call("PATCH", f"/v1/webhooks/endpoints/{ep['id']}", {"enabled": False})
    assert off.status == 200 and off.json["enabled"] is False
    assert call("DELETE", f"/v1/webhooks/endpoints/{ep['id']}").status == 204
    _problem(call("GET", f"/v1/webhooks/endpoints/{ep['id']}"), 404, "not-found")
    _problem(call("DELETE", f"/v1/webhooks/endpoints/{ep['id']}"), 404, "not-found")


def test_another_tenants_endpoint_is_404_on_every_route(call):
    ep = call("POST", "/v1/webhooks/endpoints", {"url": URL}).json
    path = f"/v1/webhooks/endpoints/{ep['id']}"
    _problem(call("GET", path, arn=CAROL), 404, "not-found")
    _problem(call("PATCH", path, {"enabled": False}, arn=CAROL), 404, "not-found")
    _problem(call("DELETE", path, arn=CAROL), 404, "not-found")
    assert call("GET", "/v1/webhooks/endpoints", arn=CAROL).json["endpoints"] == []
    assert call("GET", path).json["enabled"] is True  # untouched
    _problem(call("GET", "/v1/webhooks/endpoints/we_nope"), 404, "not-found")


BAD = [
    ({"url": "not a url"}, "url"),
    ({"url": "http://hooks.example.com/x"}, "url"),  # production: https only
    ({"url": "https://10.1.2.3/x"}, "url"),  # private
    ({"url": "https://169.254.169.254/latest"}, "url"),  # instance metadata
    ({"url": "https://localhost/x"}, "url"),
    ({"url": URL, "events": ["finished"]}, "events.0"),
    ({"url": URL, "events": []}, "events"),
    ({"url": URL, "surprise": 1}, "surprise"),
]


def test_bad_input_is_a_400_validation_problem(call):
    for body, field in BAD:  # one moto setup for every case (suite time)
        problem = _problem(call("POST", "/v1/webhooks/endpoints", body), 400, "validation")
        assert problem["errors"][0]["field"] == field, (body, problem)
    assert call("GET", "/v1/webhooks/endpoints").json["endpoints"] == []


def test_the_cap_is_a_409_and_deleting_frees_a_place(call):
    ids = [call("POST", "/v1/webhooks/endpoints", {"url": f"{URL}/{i}"}).json["id"] for i in range(MAX_ENDPOINTS)]
    problem = _problem(call("POST", "/v1/webhooks/endpoints", {"url": URL}), 409, "limit-reached")
    assert problem["limit"] == MAX_ENDPOINTS
    assert call("POST", "/v1/webhooks/endpoints", {"url": URL}, arn=CAROL).status == 201  # per tenant
    assert call("DELETE", f"/v1/webhooks/endpoints/{ids[0]}").status == 204
    assert call("POST", "/v1/webhooks/endpoints", {"url": URL}).status == 201


def test_listing_pages_with_a_tenant_scoped_cursor(call):
    ids = [call("POST", "/v1/webhooks/endpoints", {"url": f"{URL}/{i}"}).json["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        page = call("GET", "/v1/webhooks/endpoints?limit=2" + (f"&cursor={cursor}" if cursor else "")).json
        seen += [e["id"] for e in page["endpoints"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == sorted(ids)
    first = call("GET", "/v1/webhooks/endpoints?limit=2").json["next_cursor"]
    _problem(call("GET", f"/v1/webhooks/endpoints?limit=2&cursor={first}", arn=CAROL), 400, "bad-request")
