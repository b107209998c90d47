"""The per-image Batch job definitions of cloud container jobs: found, or registered once
(``batch:DescribeJobDefinitions`` / ``batch:RegisterJobDefinition``; the only boto3 code for them).

Contract: :meth:`BatchJobDefinitions.ensure` takes a ``RegisterJobDefinition`` request
(:func:`gpufleet.batchdef.job_definition`) and returns the ARN of an ACTIVE revision of that name whose
content is the request's, registering one only when none is:
- each registration is tagged ``gpufleet:definition-sha256`` = :func:`fingerprint` of the request (the
  canonical JSON of everything but the tags), so a revision registered for other content under the same name
  (a platform upgrade changes the supervisor image, a new deployment the execution role) is never reused: the
  next job registers a new revision, and the older revisions stay for the jobs that run them;
- among matching ACTIVE revisions the latest wins, so a race between two registrations of one image is
  harmless (two identical revisions; every later job takes the newest);
- AWS errors become :mod:`gpufleet.errors` (throttling and 5xx: TransientError; anything else, access denied
  or a malformed request: DependencyFailed).

:func:`batch_submitter` is the cloud dispatch's ``SubmitJob`` with the same error mapping.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Protocol

from gpufleet.store.dynamo import translate_errors

FINGERPRINT_TAG = "gpufleet:definition-sha256"


def fingerprint(request: dict[str, Any]) -> str:
    """The sha256 of a definition request's canonical JSON, tags aside."""
    body = {k: v for k, v in request.items() if k != "tags"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def tagged(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` with its :data:`FINGERPRINT_TAG`."""
    return {**request, "tags": {**request.get("tags", {}), FINGERPRINT_TAG: fingerprint(request)}}


def latest_matching(described: list[dict[str, Any]], fp: str) -> str | None:
    """The ARN of the newest ACTIVE revision tagged with fingerprint ``fp`` among ``described``, or None."""
    hits = [d for d in described if d.get("status") == "ACTIVE" and (d.get("tags") or {}).get(FINGERPRINT_TAG) == fp]
    return max(hits, key=lambda d: int(d["revision"]))["jobDefinitionArn"] if hits else None


class JobDefinitions(Protocol):
    def ensure(self, request: dict[str, Any]) -> str:
        """The ARN of an ACTIVE revision with ``request``'s content, registered if none is (see module)."""
        ...


class BatchJobDefinitions:
    def __init__(self, client: Any) -> None:
        self.client = client

    def _described(self, name: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"jobDefinitionName": name, "status": "ACTIVE"}
        with translate_errors():
            while True:
                resp = self.client.describe_job_definitions(**kwargs)
                out += resp.get("jobDefinitions", [])
                if not resp.get("nextToken"):
                    return out
                kwargs["nextToken"] = resp["nextToken"]

    def ensure(self, request: dict[str, Any]) -> str:
        fp = fingerprint(request)
        name = request["jobDefinitionName"]
        found = latest_matching(self._described(name), fp)
        if found:
            return found
        with translate_errors():
            registered = self.client.register_job_definition(**tagged(request))["jobDefinitionArn"]
        return latest_matching(self._described(name), fp) or registered


def batch_submitter(client: Any) -> Callable[..., dict[str, Any]]:
    """``SubmitJob`` on ``client`` with AWS errors mapped to :mod:`gpufleet.errors` (the cloud dispatch's ``submit``)."""

    def submit(**request: Any) -> dict[str, Any]:
        with translate_errors():
            return client.submit_job(**request)

    return submit
