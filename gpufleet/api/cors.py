"""CORS of the API's answers for a browser page served from another origin (the web console in AWS, served by
CloudFront, calls the execute-api host).

Contract: :func:`cors` is None when no origin is configured (the local stack's console shares the API's origin),
else the Powertools CORS configuration naming exactly that origin (an answer carries
``Access-Control-Allow-Origin`` only for a request whose ``Origin`` is it) with the headers a SigV4-signed request
sends. :class:`CorsSettings` reads the origin from ``GPUFLEET_CORS_ORIGIN`` (set by infra/api.py's
``allow_origin``). The preflight (``OPTIONS``) is answered by API Gateway itself, unauthenticated.
"""

from __future__ import annotations

from aws_lambda_powertools.event_handler import CORSConfig
from pydantic import BaseModel

#: the request headers a browser's signed call carries besides Powertools' defaults
SIGNED_HEADERS = ["idempotency-key", "x-amz-content-sha256"]
#: the answer headers the page may read
EXPOSED_HEADERS = ["Location", "Retry-After"]


class CorsSettings(BaseModel):
    """``GPUFLEET_CORS_ORIGIN``: the one browser origin admitted (``https://<console host>``); empty: none."""

    cors_origin: str = ""


def cors(origin: str) -> CORSConfig | None:
    """The CORS configuration for ``origin``, or None for no cross-origin page."""
    if not origin:
        return None
    return CORSConfig(allow_origin=origin, allow_headers=SIGNED_HEADERS, expose_headers=EXPOSED_HEADERS, max_age=3600)
