"""Tenants' webhook endpoints through the API: create, list, get, enable/disable, delete.

Contract (docs/api.md "Webhook endpoints"):
- Every operation acts on the caller's tenant only: another tenant's endpoint id is a 404 on every
  route (the store is keyed by the caller's tenant).
- A new endpoint's URL passes the same policy as a job's ``spec.webhook.url``
  (:func:`gpufleet.webhooks.urlpolicy.check_submission`: https and public targets unless the deployment
  allows private ones), refused as a 400 ``validation`` problem on field ``url``; an event name outside
  the per-job vocabulary is a 400 from the request model. The tenant's
  :data:`~gpufleet.webhooks.endpoints.MAX_ENDPOINTS`-th + 1 endpoint is a 409 ``limit-reached`` problem.
- Listing pages in id (creation) order with a signed cursor scoped to the tenant
  (:mod:`gpufleet.store.cursor`).
- Deliveries to endpoints are fanned out when job events are queued (:mod:`gpufleet.webhooks.delivery`).
"""

from __future__ import annotations

import logging

from gpufleet.api.models import WebhookEndpointPage, WebhookEndpointRequest, WebhookEndpointView
from gpufleet.api.service import Deps
from gpufleet.clock import iso
from gpufleet.errors import NotFound, TransientError, ValidationFailed
from gpufleet.store import cursor
from gpufleet.store.principals import Principal
from gpufleet.store.webhook_endpoints import WebhookEndpointStore
from gpufleet.webhooks import urlpolicy
from gpufleet.webhooks.endpoints import MAX_ENDPOINTS, WebhookEndpoint, is_endpoint_id, new_endpoint_id

log = logging.getLogger(__name__)


def _store(deps: Deps) -> WebhookEndpointStore:
    if deps.webhook_endpoints is None:
        raise TransientError("webhook endpoints are not configured on this deployment")
    return deps.webhook_endpoints


def view(ep: WebhookEndpoint) -> WebhookEndpointView:
    return WebhookEndpointView(id=ep.id, url=ep.url, events=list(ep.events), labels=dict(ep.labels),
                               description=ep.description, enabled=ep.enabled, created_at=ep.created_at,
                               updated_at=ep.updated_at)


def _check_url(url: str, allow_private: bool) -> None:
    try:
        urlpolicy.check_submission(url, allow_private=allow_private)
    except ValidationFailed as err:
        why = str(err.extra.get("errors", [{}])[0].get("message") or err.detail)
        raise ValidationFailed(f"url: {why}", errors=[{"field": "url", "message": why}]) from err


def create(deps: Deps, who: Principal, req: WebhookEndpointRequest) -> WebhookEndpointView:
    """``POST /v1/webhooks/endpoints``."""
    _check_url(req.url, deps.settings.webhook_allow_private)
    now = deps.clock.now()
    ep = WebhookEndpoint(id=new_endpoint_id(now), tenant=who.tenant, url=req.url,
                         events=tuple(dict.fromkeys(e.value for e in req.events)), labels=dict(req.labels),
                         description=req.description, created_at=iso(now), created_by=who.owner_path,
                         updated_at=iso(now))
    _store(deps).create(ep, MAX_ENDPOINTS)
    log.info("webhook endpoint created", extra={"tenant": who.tenant, "endpoint_id": ep.id})
    return view(ep)


def _id(endpoint_id: str) -> str:
    if not is_endpoint_id(endpoint_id):
        raise NotFound(f"no webhook endpoint {endpoint_id}")
    return endpoint_id


def get(deps: Deps, who: Principal, endpoint_id: str) -> WebhookEndpointView:
    """``GET /v1/webhooks/endpoints/{id}``."""
    return view(_store(deps).get(who.tenant, _id(endpoint_id)))


def list_endpoints(deps: Deps, who: Principal, *, limit: int, cursor_token: str | None) -> WebhookEndpointPage:
    """``GET /v1/webhooks/endpoints``: one page, oldest first."""
    scope = {"list": "webhook-endpoints", "tenant": who.tenant}
    after = None
    if cursor_token:
        after = str(cursor.decode(cursor_token, scope, deps.settings.cursor_key).get("after") or "") or None
    found, last = _store(deps).list(who.tenant, limit, after)
    nxt = cursor.encode({"after": last}, scope, deps.settings.cursor_key) if last else None
    return WebhookEndpointPage(endpoints=[view(e) for e in found], next_cursor=nxt)


def set_enabled(deps: Deps, who: Principal, endpoint_id: str, enabled: bool) -> WebhookEndpointView:
    """``PATCH /v1/webhooks/endpoints/{id}``: a disabled endpoint receives nothing (queued tries are dropped)."""
    ep = _store(deps).set_enabled(who.tenant, _id(endpoint_id), enabled, iso(deps.clock.now()))
    log.info("webhook endpoint %s", "enabled" if enabled else "disabled",
             extra={"tenant": who.tenant, "endpoint_id": endpoint_id})
    return view(ep)


def delete(deps: Deps, who: Principal, endpoint_id: str) -> None:
    """``DELETE /v1/webhooks/endpoints/{id}``."""
    _store(deps).delete(who.tenant, _id(endpoint_id))
    log.info("webhook endpoint deleted", extra={"tenant": who.tenant, "endpoint_id": endpoint_id})
