"""In-memory :class:`~gpufleet.store.jobdefs.JobDefinitions`: revisions per name, each the tagged request
(:func:`~gpufleet.store.jobdefs.tagged`); ``registered`` records every registration."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from gpufleet.store.jobdefs import fingerprint, latest_matching, tagged


@dataclass
class MemoryJobDefinitions:
    account: str = "123456789012"
    region: str = "us-east-1"
    revisions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    registered: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def register(self, request: dict[str, Any]) -> str:
        """``RegisterJobDefinition``: a new ACTIVE revision of the name (its ARN)."""
        with self._lock:
            name = request["jobDefinitionName"]
            revs = self.revisions.setdefault(name, [])
            arn = f"arn:aws:batch:{self.region}:{self.account}:job-definition/{name}:{len(revs) + 1}"
            revs.append({**request, "revision": len(revs) + 1, "status": "ACTIVE", "jobDefinitionArn": arn})
            self.registered.append(request)
            return arn

    def ensure(self, request: dict[str, Any]) -> str:
        fp = fingerprint(request)
        found = latest_matching(self.revisions.get(request["jobDefinitionName"], []), fp)
        return found or self.register(tagged(request))
