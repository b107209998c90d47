"""Whose an input is (pure): the one rule the API applies at submission and the node API again when it
vends an attempt's object credentials.

Contract:
- :func:`input_owned`: ``s3://<bucket>/<key>[?versionId=v]`` is tenant ``t``'s when ``bucket`` is registered to
  ``t`` (any key), or when ``bucket`` is a platform data bucket (the outputs bucket and the configured input
  buckets) and ``key`` starts with ``tenants/<t>/``. A key with an empty, ``.`` or ``..`` segment is nobody's (a
  prefix cannot be escaped by whatever normalises the key later); anything not ``s3://`` is nobody's.
- :class:`InputOwnership` is that rule with a deployment's buckets bound: ``owned(uri, tenant)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


def input_owned(uri: str, tenant: str, data_buckets: set[str] | frozenset[str],
                tenant_buckets: set[str] | frozenset[str]) -> bool:
    """Whether ``uri`` is ``tenant``'s (module contract)."""
    base = uri.split("?versionId=")[0]
    if not base.startswith("s3://") or not tenant:
        return False
    bucket, _, key = base[len("s3://"):].partition("/")
    if not key or any(seg in ("", ".", "..") for seg in key.split("/")):
        return False
    if bucket in tenant_buckets:
        return True
    return bucket in data_buckets and key.startswith(f"tenants/{tenant}/")


@dataclass(frozen=True)
class InputOwnership:
    """The rule over one deployment's buckets (module contract)."""

    data_buckets: frozenset[str]
    tenant_buckets: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, data_buckets: Iterable[str], tenant_buckets: Mapping[str, Iterable[str]] | None = None) -> InputOwnership:
        return cls(frozenset(data_buckets), {t: frozenset(b) for t, b in (tenant_buckets or {}).items()})

    def owned(self, uri: str, tenant: str) -> bool:
        return input_owned(uri, tenant, self.data_buckets, self.tenant_buckets.get(tenant, frozenset()))
