"""The one factory of boto3 clients (DynamoDB, S3, SQS, Step Functions, Batch, ...).

Contract: :func:`client` builds a low-level client with standard-mode retries and explicit
timeouts. The region is the one given, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else
``us-east-1``; ``endpoint_url=None`` leaves botocore's own resolution (``AWS_ENDPOINT_URL``, so a
local moto server is honoured). ``credentials`` (``aws_access_key_id``, ``aws_secret_access_key``,
optional ``aws_session_token``) and ``session`` (a ``boto3.Session``, e.g. of a named profile) are
for the edges that sign with something other than the default chain (CLI, local stack). Stores take
the client they are given; only entry points (Lambda handlers, CLI, agent, dev stack) call this.

:func:`botocore_session` is the one way to make a botocore session of one's own (an attempt's vended
credentials, a named profile): every such session shares the process's one data loader, so service models
and endpoint rules are parsed once per process. A fresh session re-reads them: an S3 client then costs
~0.2 s on an idle 2-core machine (~11 ms with the shared loader), paid by every job a warm worker runs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import boto3
from botocore.config import Config
from botocore.session import Session as BotocoreSession

DEFAULT_REGION = "us-east-1"

_loader: Any = None
_loader_lock = threading.Lock()


def botocore_session(**kwargs: Any) -> BotocoreSession:
    """A new botocore session (``kwargs`` as ``botocore.session.Session``'s, e.g. ``profile``) sharing the
    process's one data loader (see the module docstring); its credentials are its own."""
    global _loader
    session = BotocoreSession(**kwargs)
    with _loader_lock:
        if _loader is None:
            _loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _loader)
    return session


def default_region(env: Mapping[str, str] | None = None) -> str:
    """``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else ``us-east-1``."""
    env = os.environ if env is None else env
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def client(
    service: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    credentials: Mapping[str, str | None] | None = None,
    session: Any = None,
    max_attempts: int = 5,
    connect_timeout: float = 5,
    read_timeout: float = 70,
    signature_version: str | None = None,
) -> Any:
    """A boto3 client of ``service`` (see the module docstring)."""
    cfg = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        **({"signature_version": signature_version} if signature_version else {}),
    )
    kwargs: dict[str, Any] = {"region_name": region or default_region(), "config": cfg}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
    kwargs.update({k: v for k, v in (credentials or {}).items() if v is not None})
    return (session or boto3).client(service, **kwargs)
