"""The one wiring of the API: settings, clients and a clock → :class:`gpufleet.api.service.Deps` / :class:`Api`.

Contract: every process that serves the API (the Lambda entry point ``lambdas/api/handler.py``, the
dev stack's gateway, the test and benchmark harnesses) builds it here, once, from settings it loaded
at its own entry point (:func:`gpufleet.api.settings.load`, or :meth:`ApiSettings.load` over a
deployed function's environment) and clients it made. The cursor secret is already in ``settings``
(an entry point that is given ``GPUFLEET_CURSOR_SECRET_ARN`` fetches it first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.api.app import LOOKUP_ROUTE, Api
from gpufleet.api.service import Deps
from gpufleet.api.settings import ApiSettings
from gpufleet.clock import Clock
from gpufleet.store.secrets import SecretsManagerReader


def watermark_secret_source(secretsmanager: Any, secret_id: str) -> Callable[[], tuple]:
    """Reads the deployment's watermark keys from its secret when first needed (the provenance lookup)."""

    def read() -> tuple:
        from gpufleet.provenance.keys import watermark_keys_from_secret

        return watermark_keys_from_secret(SecretsManagerReader(secretsmanager).read(secret_id), secret_id)

    return read


def build_deps(settings: ApiSettings, *, ddb: Any, clock: Clock, s3: Any = None, sfn: Any = None,
               batch: Any = None, kms: Any = None, secretsmanager: Any = None, sqs: Any = None) -> Deps:
    """The operations' dependencies over explicit clients (None: that client is never used, e.g. the
    OpenAPI document, which invokes nothing). ``secretsmanager`` reads ``settings.watermark_secret_arn`` on the
    first provenance lookup; ``sqs`` sends a cancelled on-prem job's node its nudge."""
    source = (watermark_secret_source(secretsmanager, settings.watermark_secret_arn)
              if secretsmanager is not None and settings.watermark_secret_arn else None)
    return Deps(settings=settings, ddb=ddb, s3=s3, sfn=sfn, batch=batch, sqs=sqs, clock=clock, kms=kms,
                watermark_keys_source=source)


def build_api(settings: ApiSettings, *, ddb: Any, clock: Clock, s3: Any = None, sfn: Any = None,
              batch: Any = None, kms: Any = None, secretsmanager: Any = None, sqs: Any = None) -> Api:
    """The API handler over :func:`build_deps`."""
    return Api(build_deps(settings, ddb=ddb, clock=clock, s3=s3, sfn=sfn, batch=batch, kms=kms,
                          secretsmanager=secretsmanager, sqs=sqs))


def build_lookup_api(settings: ApiSettings, *, ddb: Any, clock: Clock, s3: Any, secretsmanager: Any) -> Api:
    """The provenance lookup's own function (``lambdas/api/lookup.py``): :data:`LOOKUP_ROUTE` alone, over the
    clients it calls (the caller's principal and rate buckets, the provenance index and the jobs it names, the
    watermark secret, presigned links to the outputs bucket). It issues no list cursors: ``settings`` may carry a
    cursor key of its own (the entry point makes a random one), never the API's."""
    return Api(build_deps(settings, ddb=ddb, clock=clock, s3=s3, secretsmanager=secretsmanager),
               serves=frozenset({LOOKUP_ROUTE}))
