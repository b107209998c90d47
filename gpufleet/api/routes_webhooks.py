"""Routes of tenants' webhook endpoints on an :class:`~gpufleet.api.app.Api` (service: :mod:`gpufleet.api.webhook_endpoints`).

Thin like every route: resolve the caller, call one service function, return.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Path, Query

from gpufleet.api import webhook_endpoints as endpoints
from gpufleet.api.models import WebhookEndpointPage, WebhookEndpointPatch, WebhookEndpointRequest, WebhookEndpointView

ENDPOINT_ID = Annotated[str, Path(description="webhook endpoint id (we_<ulid>)", max_length=64)]


def register(api: Any, responses) -> None:
    """Add the routes to ``api``'s resolver (``responses``: the app's documented-responses helper)."""
    app, deps = api.app, api.deps

    @app.post(
        "/v1/webhooks/endpoints",
        summary="Register a webhook endpoint for the tenant's job events",
        description="Every enabled endpoint whose `events` (and label selector) match gets each event of the "
        "tenant's jobs, signed with the tenant's signing secrets like a job's own webhook, logged in the job's "
        "delivery log with `endpoint_id`. The URL passes the same policy as `spec.webhook.url`. At most 20 "
        "endpoints per tenant (409 `limit-reached`).",
        responses=responses(201, WebhookEndpointView, "Created", (400, 409, 413, 415)),
        tags=["webhooks"],
    )
    def create_webhook_endpoint(body: WebhookEndpointRequest):
        ep = endpoints.create(deps, api._who(), body)
        return api._json(201, ep, {"Location": f"/v1/webhooks/endpoints/{ep.id}"})

    @app.get(
        "/v1/webhooks/endpoints",
        summary="List the tenant's webhook endpoints, oldest first",
        responses=responses(200, WebhookEndpointPage, "One page of endpoints", (400,)),
        tags=["webhooks"],
    )
    def list_webhook_endpoints(
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        cursor: Annotated[str | None, Query(max_length=2048, description="next_cursor of the previous page")] = None,
    ):
        return api._json(200, endpoints.list_endpoints(deps, api._who(), limit=limit, cursor_token=cursor))

    @app.get(
        "/v1/webhooks/endpoints/<endpoint_id>",
        summary="Get a webhook endpoint",
        responses=responses(200, WebhookEndpointView, "The endpoint", (400, 404)),
        tags=["webhooks"],
    )
    def get_webhook_endpoint(endpoint_id: ENDPOINT_ID):
        return api._json(200, endpoints.get(deps, api._who(), endpoint_id))

    @app.patch(
        "/v1/webhooks/endpoints/<endpoint_id>",
        summary="Disable or enable a webhook endpoint",
        description="A disabled endpoint gets no new deliveries, and its queued retries are dropped.",
        responses=responses(200, WebhookEndpointView, "The endpoint after the change", (400, 404, 413, 415)),
        tags=["webhooks"],
    )
    def patch_webhook_endpoint(endpoint_id: ENDPOINT_ID, body: WebhookEndpointPatch):
        return api._json(200, endpoints.set_enabled(deps, api._who(), endpoint_id, body.enabled))

    @app.delete(
        "/v1/webhooks/endpoints/<endpoint_id>",
        summary="Delete a webhook endpoint",
        description="Its queued retries are dropped; the delivery logs of jobs keep what was sent.",
        responses=responses(204, None, "Deleted", (400, 404)),
        tags=["webhooks"],
    )
    def delete_webhook_endpoint(endpoint_id: ENDPOINT_ID):
        endpoints.delete(deps, api._who(), endpoint_id)
        return Response(status_code=204, body="")
